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

// TestMCPGatewayHTTP: /mcp on ledger serve answers only a token that
// drives the gateway's agent (401 otherwise, naming the resource
// metadata), and a call through it is the token's principal's.
func TestMCPGatewayHTTP(t *testing.T) {
	t.Parallel()
	s := newMCPSetup(t, "1s")
	tokens := filepath.Join(s.dir, "tokens.json")
	newToken := func(args ...string) string {
		out, errOut, err := runCLI(t, nil, append([]string{"token", "new", "--tenant", "acme", "--add-to", tokens}, args...)...)
		require.NoError(t, err, errOut)
		tok, _, _ := strings.Cut(out, "\n")
		return tok
	}
	agent := newToken("--principal", "bot", "--role", "agent", "--agent", "mcp")
	other := newToken("--principal", "someone", "--role", "agent", "--agent", "notes-agent")
	approver := newToken("--principal", "alice", "--role", "approver")
	require.NotEmpty(t, approver)
	api := startServeProcess(t, s.bin, "--db", s.db, "--config", s.config, "--tokens", tokens,
		"--effects", filepath.Join(s.dir, "serve.effects.db"))

	for name, tok := range map[string]string{"no token": "", "bad token": "nope", "another agent's": other} {
		req, err := http.NewRequest(http.MethodPost, api.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, name)
	}
	resp, err := http.Get(api.url + "/.well-known/oauth-protected-resource/mcp")
	require.NoError(t, err)
	var md map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&md))
	_ = resp.Body.Close()
	require.Equal(t, api.url+"/mcp", md["resource"])

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := &http.Client{Transport: bearerTransport{token: agent}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "http-client", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: api.url + "/mcp", HTTPClient: client}, nil)
	require.NoError(t, err, api.logs.String())
	defer cs.Close()
	read, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "cards__cards_count", Arguments: map[string]any{"title": "Go"}})
	require.NoError(t, err)
	require.False(t, read.IsError, "%s\n%s", resultText(read), api.logs.String())
	var run struct {
		Tenant      string `json:"tenant"`
		SubmittedBy string `json:"submitted_by"`
		Agent       string `json:"agent"`
	}
	req, err := http.NewRequest(http.MethodGet, api.url+"/v1/runs/"+read.Meta[mcpgw.MetaRun].(string), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+agent)
	got, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(got.Body).Decode(&run))
	_ = got.Body.Close()
	require.Equal(t, "acme", run.Tenant)
	require.Equal(t, "bot", run.SubmittedBy)
	require.Equal(t, "mcp", run.Agent)
}

// bearerTransport sends a bearer token with every request.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPGatewayMisbehavingUpstream: over stdio, a 50 MB answer is a tool
// error (the SDK drops a line over 16 MiB, which ends the upstream's
// session) and the next call starts the upstream again; an upstream that
// exits in the middle of a write leaves the write's effect unknown, in
// review, and the gateway keeps serving.
func TestMCPGatewayMisbehavingUpstream(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "ledger.yaml")
	cfg := fmt.Sprintf(`schema_version: "1.0"
mcp:
  approval_wait: 200ms
  upstreams:
    - name: bad
      command: [%q, simulator, mcp-upstream, --store, %q, --misbehaving-tools]
      tools:
        huge_read: {effect: read, timeout_ms: 120000}
        cards_count: {effect: read}
        exit_now: {effect: write}
`, bin, filepath.Join(dir, "effects.db"))
	require.NoError(t, os.WriteFile(cfgPath, []byte(cfg), 0o644))
	_, errOut, err := runCLI(t, nil, "mcp", "tools", "confirm", "--config", cfgPath, "bad__huge_read", "bad__cards_count", "bad__exit_now")
	require.NoError(t, err, errOut)
	s := &mcpSetup{bin: bin, dir: dir, config: cfgPath, db: filepath.Join(dir, "ledger.db")}
	api := startServeProcess(t, bin, "--db", s.db, "--config", cfgPath, "--effects", filepath.Join(dir, "serve.effects.db"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cs, logs := s.gateway(t, ctx, api.url)

	huge, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bad__huge_read", Arguments: map[string]any{"bytes": 50 << 20}})
	require.NoError(t, err)
	require.True(t, huge.IsError)
	require.Contains(t, resultText(huge), "result_too_large", logs.String())
	require.Equal(t, "failed", huge.Meta[mcpgw.MetaState])

	// The upstream's session ended; the next call finds it started again,
	// once its backoff has passed.
	require.Eventually(t, func() bool {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bad__cards_count", Arguments: map[string]any{"title": fmt.Sprint(time.Now().UnixNano())}})
		if err == nil && res.IsError {
			t.Logf("count: %s", resultText(res))
		}
		return err == nil && !res.IsError
	}, time.Minute, 200*time.Millisecond, logs.String())

	waiting, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bad__exit_now", Arguments: map[string]any{}})
	require.NoError(t, err)
	action, digest := waiting.Meta[mcpgw.MetaAction].(string), waiting.Meta[mcpgw.MetaDigest].(string)
	body, _ := json.Marshal(map[string]string{"action_digest": digest})
	resp, err := http.Post(api.url+"/v1/actions/"+action+"/approve", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	died, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bad__exit_now", Arguments: map[string]any{}})
	require.NoError(t, err, "the gateway answers when its upstream dies")
	require.True(t, died.IsError)
	require.Equal(t, action, died.Meta[mcpgw.MetaAction])
	require.Equal(t, "needs_review", died.Meta[mcpgw.MetaState], "%s\n%s", resultText(died), logs.String())
}
