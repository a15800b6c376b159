package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/mcpgw"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// mcpSetup is a directory with a config whose mcp section puts the
// simulator's MCP upstream behind the gateway, its effect store, a ledger
// database, and the upstream's tools confirmed.
type mcpSetup struct {
	bin, dir, config, db, effects string
}

func newMCPSetup(t *testing.T, wait string) *mcpSetup {
	t.Helper()
	bin := ledgerBinary(t)
	dir := t.TempDir()
	s := &mcpSetup{bin: bin, dir: dir, config: filepath.Join(dir, "ledger.yaml"), db: filepath.Join(dir, "ledger.db"),
		effects: filepath.Join(dir, "upstream.effects.db")}
	cfg := fmt.Sprintf(`schema_version: "1.0"
mcp:
  approval_wait: %s
  upstreams:
    - name: cards
      command: [%q, simulator, mcp-upstream, --store, %q]
      tools:
        cards_write:
          effect: write
          guarantees: {query: true}
          query: {tool: cards_status}
        cards_count: {effect: read}
`, wait, bin, s.effects)
	require.NoError(t, os.WriteFile(s.config, []byte(cfg), 0o644))
	out, errOut, err := runCLI(t, nil, "mcp", "tools", "confirm", "--config", s.config, "cards__cards_write", "cards__cards_count")
	require.NoError(t, err, errOut)
	require.Contains(t, out, "2 tools confirmed")
	return s
}

// gateway starts `ledger mcp` as the SDK client's stdio server.
func (s *mcpSetup) gateway(t *testing.T, ctx context.Context, apiURL string) (*mcp.ClientSession, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(s.bin, "mcp", "--config", s.config, "--db", s.db, "--api-url", apiURL, "--principal", "agent-1")
	cmd.Env = cleanEnv()
	logs := &syncBuffer{}
	cmd.Stderr = logs
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-client", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err, "ledger mcp: %s", logs.String())
	t.Cleanup(func() { _ = cs.Close() })
	return cs, logs
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestMCPGatewayStdio: an MCP client whose server is `ledger mcp` lists the
// upstream's confirmed tools, runs a read at once, and runs a write once,
// only after a person approves its digest through `ledger serve` on the
// same database; the upstream's own store counts one effect.
func TestMCPGatewayStdio(t *testing.T) {
	t.Parallel()
	s := newMCPSetup(t, "1s")
	api := startServeProcess(t, s.bin, "--db", s.db, "--config", s.config, "--effects", filepath.Join(s.dir, "serve.effects.db"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cs, logs := s.gateway(t, ctx, api.url)

	list, err := cs.ListTools(ctx, nil)
	require.NoError(t, err)
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
	}
	require.Equal(t, []string{"cards__cards_count", "cards__cards_write"}, names)

	read, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "cards__cards_count", Arguments: map[string]any{"title": "Go"}})
	require.NoError(t, err)
	require.False(t, read.IsError, "%s\n%s", resultText(read), logs.String())
	require.Equal(t, "succeeded", read.Meta[mcpgw.MetaState])

	args := map[string]any{"title": "Go", "cards": []map[string]string{{"front": "chan", "back": "a pipe"}}}
	waiting, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "cards__cards_write", Arguments: args})
	require.NoError(t, err)
	require.True(t, waiting.IsError)
	action, digest := waiting.Meta[mcpgw.MetaAction].(string), waiting.Meta[mcpgw.MetaDigest].(string)
	require.Contains(t, resultText(waiting), "ledger approve "+action+" --digest "+digest)
	require.Contains(t, resultText(waiting), api.url+"/v1/actions/"+action)
	require.Empty(t, effectsIn(t, s.effects), "nothing reaches the upstream before a person approves")

	body, _ := json.Marshal(map[string]string{"action_digest": digest, "reason": "looks right"})
	resp, err := http.Post(api.url+"/v1/actions/"+action+"/approve", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	done, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "cards__cards_write", Arguments: args})
	require.NoError(t, err)
	require.False(t, done.IsError, "%s\n%s", resultText(done), logs.String())
	require.Equal(t, action, done.Meta[mcpgw.MetaAction], "the second call joined the approved action")
	require.Len(t, effectsIn(t, s.effects), 1)
}
