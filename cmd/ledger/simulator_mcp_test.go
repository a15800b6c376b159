package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/simulator/mcpupstream"
)

// mcpClient is the SDK's client the tests connect with.
func mcpClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "cmd-ledger-test", Version: "1"}, nil)
}

// writeCards calls cards_write with a one-card deck under dedup key key.
func writeCards(t *testing.T, ctx context.Context, cs *mcp.ClientSession, key string) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{
		Name: mcpupstream.ToolCardsWrite,
		Meta: mcp.Meta{mcpupstream.MetaDedupKey: key, mcpupstream.MetaRun: "run-1", mcpupstream.MetaFencingToken: 1},
		Arguments: map[string]any{"title": "Rust ownership",
			"cards": []map[string]string{{"front": "Who owns a value?", "back": "One variable at a time."}}},
	})
	require.NoError(t, err)
	return res
}

// effectsIn reads the effects of the store file at path.
func effectsIn(t *testing.T, path string) []simulator.Effect {
	t.Helper()
	store, err := simulator.OpenEffectStore(context.Background(), path, nil)
	require.NoError(t, err)
	defer store.Close()
	effects, err := store.Effects(context.Background())
	require.NoError(t, err)
	return effects
}

// TestSimulatorMCPUpstreamStdio runs `ledger simulator mcp-upstream` as a
// real subprocess over stdio, with a fault plan from --config: the first
// call fails as planned, the second writes, the third (same dedup key) is
// deduplicated; the store file then holds one effect, which `ledger
// simulator effects` lists.
func TestSimulatorMCPUpstreamStdio(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	dir := t.TempDir()
	storePath := filepath.Join(dir, "upstream.effects.db")
	cfgPath := filepath.Join(dir, "sim.json")
	require.NoError(t, os.WriteFile(cfgPath, []byte(`{"tools": {"cards.write": {
		"guarantees": {"query": true, "dedup": true, "cancel": true},
		"faults": [{"kind": "error", "calls": [1]}]}}}`), 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.Command(bin, "simulator", "mcp-upstream", "--store", storePath, "--config", cfgPath)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cs, err := mcpClient().Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)

	first := writeCards(t, ctx, cs, "run-1/act-1")
	require.True(t, first.IsError, "call 1 fails as the fault plan says")
	require.Equal(t, "not_happened", first.Meta[mcpupstream.MetaEffect])
	require.Equal(t, simulator.CodeSimulatedError, first.StructuredContent.(map[string]any)["code"])
	for range 2 {
		res := writeCards(t, ctx, cs, "run-1/act-1")
		require.False(t, res.IsError, "%v", res.Content)
		require.Equal(t, "happened", res.Meta[mcpupstream.MetaEffect])
	}
	status, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpupstream.ToolCardsStatus,
		Arguments: map[string]any{"dedup_key": "run-1/act-1"}})
	require.NoError(t, err)
	require.Equal(t, "happened", status.StructuredContent.(map[string]any)["effect"])

	require.NoError(t, cs.Close(), "the server exits 0 once stdin closes; stderr: %s", stderr.String())
	require.Contains(t, stderr.String(), "fault plan", "a fault plan is announced")

	effects := effectsIn(t, storePath)
	require.Len(t, effects, 1, "three calls, one planned failure, one deduplicated: one effect")
	require.Equal(t, "run-1/act-1", effects[0].DedupKey)
	require.Equal(t, simulator.CardsWriteTool, effects[0].Tool)

	out, _, err := runCLI(t, nil, "simulator", "effects", "--store", storePath)
	require.NoError(t, err)
	require.Contains(t, out, "run-1/act-1")
	require.Contains(t, out, "1 effects")
}

// TestSimulatorMCPUpstreamExitNow: exit_now ends the real process with
// status 3 before it answers.
func TestSimulatorMCPUpstreamExitNow(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.Command(bin, "simulator", "mcp-upstream", "--store", filepath.Join(t.TempDir(), "e.db"), "--misbehaving-tools")
	cs, err := mcpClient().Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpupstream.ToolExitNow, Arguments: map[string]any{}})
	require.Error(t, err, "no answer: the process is gone")
	var exit *exec.ExitError
	require.ErrorAs(t, cs.Close(), &exit)
	require.Equal(t, mcpupstream.ExitStatus, exit.ExitCode())
}

// TestSimulatorMCPUpstreamHTTP runs the server with --http 127.0.0.1:0,
// reads its URL from the first line of stdout, writes through the SDK's
// streamable client, and stops it with SIGTERM.
func TestSimulatorMCPUpstreamHTTP(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	storePath := filepath.Join(t.TempDir(), "upstream.effects.db")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url, stop := serving(t, exec.Command(bin, "simulator", "mcp-upstream", "--store", storePath, "--http", "127.0.0.1:0"))
	require.Regexp(t, `^http://127\.0\.0\.1:[0-9]+/mcp$`, url)

	cs, err := mcpClient().Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	require.NoError(t, err)
	res := writeCards(t, ctx, cs, "run-1/act-1")
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, "happened", res.Meta[mcpupstream.MetaEffect])
	res = writeCards(t, ctx, cs, "run-1/act-1")
	require.False(t, res.IsError, "%v", res.Content)
	require.NoError(t, cs.Close())

	require.NoError(t, stop(), "a signal stops it cleanly")

	effects := effectsIn(t, storePath)
	require.Len(t, effects, 1, "two calls of one dedup key: one effect")
	require.Equal(t, "run-1/act-1", effects[0].DedupKey)
}

// TestSimulatorMCPUpstreamUsage: mistakes are usage errors (exit status 2)
// before anything is served.
func TestSimulatorMCPUpstreamUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"tools": {"cards_write": {}}}`), 0o644))
	store := filepath.Join(dir, "e.db")
	for name, args := range map[string][]string{
		"no store":           {},
		"a public address":   {"--store", store, "--http", "0.0.0.0:0"},
		"an unknown tool":    {"--store", store, "--config", bad},
		"a missing config":   {"--store", store, "--config", filepath.Join(dir, "nope.json")},
		"a positional arg":   {"--store", store, "extra"},
		"an address no port": {"--store", store, "--http", "127.0.0.1"},
	} {
		t.Run(name, func(t *testing.T) {
			out, _, err := runCLI(t, nil, append([]string{"simulator", "mcp-upstream"}, args...)...)
			requireExit(t, err, exitUsage)
			require.Empty(t, out)
		})
	}
	_, err := os.Stat(store)
	require.True(t, errors.Is(err, os.ErrNotExist), "no store was created by a refused command")
}

// serving starts cmd, a server that prints where it listens as the first
// line of its stdout, and returns that line. stop interrupts the server
// and waits for it to end, its error carrying the server's stderr; a test
// that does not call stop has the process killed when it ends.
func serving(t *testing.T, cmd *exec.Cmd) (first string, stop func() error) {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr.String())
	return strings.TrimSpace(line), func() error {
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			return err
		}
		err := cmd.Wait()
		exited = true
		if err != nil {
			return fmt.Errorf("%w; stderr: %s", err, stderr.String())
		}
		return nil
	}
}
