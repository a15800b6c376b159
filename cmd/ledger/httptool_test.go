package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/httptool"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/simulator/httpupstream"
)

// httpToolConfig declares decks.write, an http tool at base (the
// simulator's cards.write served as an http tool) whose bearer token is
// in the variable tokenEnv.
func httpToolConfig(base, tokenEnv string) string {
	return `schema_version: "1.0"
tools:
  - name: decks.write
    version: "1"
    effect: write
    arguments_schema: {type: object}
    guarantees: {query: true, dedup: true, cancel: false}
    timeout_ms: 5000
    executor: http
    url: ` + base + httpupstream.PathCardsWrite + `
    query_url: ` + base + httpupstream.PathCardsQuery + `
    bearer_token_env: ` + tokenEnv + `
`
}

// TestServeHTTPTools: serve registers the config file's http tools with
// the engine, and GET /v1/tools shows them; a tool whose bearer token's
// variable is unset is refused before anything is opened, naming the
// variable.
func TestServeHTTPTools(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		dir := t.TempDir()
		store, err := simulator.OpenEffectStore(t.Context(), filepath.Join(dir, "tool.effects.db"), nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = store.Close() })
		h, err := httpupstream.New(store, simulator.Config{}, httpupstream.Options{Token: "sim-token"})
		require.NoError(t, err)
		tool := httptest.NewServer(h)
		t.Cleanup(tool.Close)
		t.Setenv("LEDGER_TEST_DECKS_TOKEN", "sim-token")

		cfg := writeFile(t, dir, "ledger.yaml", httpToolConfig(tool.URL, "LEDGER_TEST_DECKS_TOKEN"))
		served, _, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0", "--config", cfg)
		out, _, err := runCLI(t, nil, "tools", "list", "--json", "--server", served)
		require.NoError(t, err)
		var tl server.ToolList
		require.NoError(t, json.Unmarshal([]byte(out), &tl))
		var decks *server.Tool
		for i := range tl.Tools {
			if tl.Tools[i].Name == "decks.write" {
				decks = &tl.Tools[i]
			}
		}
		require.NotNil(t, decks, "the http tool is listed: %s", out)
		require.Equal(t, contracts.ExecutorHTTP, decks.Executor)
		require.Equal(t, contracts.Guarantees{Query: true, Dedup: true}, decks.Guarantees)
		require.NotContains(t, out, tool.URL, "where the tool lives is the operator's")
		require.NotContains(t, out, "sim-token")

		out, _, err = runCLI(t, nil, "tools", "list", "--server", served)
		require.NoError(t, err)
		require.Regexp(t, `\ndecks\.write\s+1\s+write\s+query,dedup\s+5s\s+http\s+-\s+-\n`, out)
		require.NoError(t, stop())
	})

	t.Run("ErrTokenUnset", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeFile(t, dir, "ledger.yaml", httpToolConfig("http://127.0.0.1:9", "LEDGER_TEST_UNSET_TOKEN"))
		db := filepath.Join(dir, "ledger.db")
		_, err := serveRefused(t, "--db", db, "--config", cfg)
		requireExit(t, err, exitUsage)
		require.Contains(t, err.Error(), "http tool decks.write: bearer_token_env: the environment variable LEDGER_TEST_UNSET_TOKEN is not set")
		_, err = os.Stat(db)
		require.ErrorIs(t, err, os.ErrNotExist, "refused before anything is opened")
	})
}

// TestSimulatorHTTPTool runs `ledger simulator http-tool` as a process,
// calls it with the ledger's http tool executor, and stops it with a
// signal: its effect store holds one effect for two calls of one dedup
// key.
func TestSimulatorHTTPTool(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	storePath := filepath.Join(t.TempDir(), "http-tool.effects.db")
	cmd := exec.Command(bin, "simulator", "http-tool", "--store", storePath, "--print-addr", "--token-env", "SIM_TOKEN")
	cmd.Env = append(cleanEnv(), "SIM_TOKEN=sim-token")
	base, stop := serving(t, cmd)
	require.Regexp(t, `^http://127\.0\.0\.1:[0-9]+$`, base)

	write, err := httptool.New(simulator.CardsWriteDescriptor(), contracts.HTTPEndpoints{URL: base + httpupstream.PathCardsWrite,
		QueryURL: base + httpupstream.PathCardsQuery, CancelURL: base + httpupstream.PathCardsCancel, BearerTokenEnv: "SIM_TOKEN"},
		httptool.Options{Getenv: func(string) string { return "sim-token" }})
	require.NoError(t, err)
	call := engine.Call{RunID: "run_1", ActionID: "act_1", Attempt: 1, AttemptID: "att_1", DedupKey: "run_1/act_1", FencingToken: 3,
		Arguments: json.RawMessage(`{"title":"Go","cards":[{"front":"A map is?","back":"A hash table."}]}`)}
	ctx := context.Background()
	for range 2 {
		_, err := write.Execute(ctx, call)
		require.NoError(t, err)
	}
	q, err := write.Query(ctx, "run_1/act_1")
	require.NoError(t, err)
	require.EqualValues(t, "happened", q.Effect)

	require.NoError(t, stop(), "a signal stops it cleanly")
	effects := effectsIn(t, storePath)
	require.Len(t, effects, 1, "two calls of one dedup key: one effect")
	require.Equal(t, "run_1/act_1", effects[0].DedupKey)
}

// TestSimulatorHTTPToolUsage: mistakes are usage errors (exit status 2)
// before anything is served.
func TestSimulatorHTTPToolUsage(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "e.db")
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"tools": {"cards_write": {}}}`), 0o644))
	t.Setenv("LEDGER_TEST_EMPTY_TOKEN", "")
	for name, args := range map[string][]string{
		"no store":         {},
		"a public address": {"--store", store, "--addr", "0.0.0.0:0"},
		"a token unset":    {"--store", store, "--token-env", "LEDGER_TEST_EMPTY_TOKEN"},
		"an unknown tool":  {"--store", store, "--config", bad},
		"a positional arg": {"--store", store, "extra"},
	} {
		t.Run(name, func(t *testing.T) {
			out, _, err := runCLI(t, nil, append([]string{"simulator", "http-tool"}, args...)...)
			requireExit(t, err, exitUsage)
			require.Empty(t, out)
		})
	}
	_, err := os.Stat(store)
	require.True(t, errors.Is(err, os.ErrNotExist), "no store was created by a refused command")
}
