package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/config"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/server/servertest"
	"github.com/stretchr/testify/require"
)

// testConfig has a client agent of tenant acme, one of tenant globex, and
// practice-cards for acme only.
const testConfig = `schema_version: "1.0"
tools:
  - name: payments.send
    version: "1"
    effect: write
    arguments_schema: {type: object, required: [to], properties: {to: {type: string}}}
    guarantees: {query: true, dedup: false, cancel: false}
    timeout_ms: 30000
    executor: client
    heartbeat_timeout_ms: 10000
  - name: invoices.send
    version: "1"
    effect: write
    arguments_schema: {type: object}
    guarantees: {query: false, dedup: true, cancel: false}
    timeout_ms: 5000
    executor: client
agents:
  - name: payer
    driver: client
    tools: [payments.send]
    tenants: [acme]
    policies: {consecutive_errors: 5}
  - {name: biller, driver: client, tools: [invoices.send], tenants: [globex]}
  - {name: practice-cards, driver: builtin, tenants: [acme]}
rules:
  schema_version: "1.0"
  rules:
    - {tool: cards.write, decision: require_approval, approval_ttl_ms: 123000}
`

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func TestServeConfig(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		dir := t.TempDir()
		tokensPath := filepath.Join(dir, "tokens.json")
		tokens := map[string]string{}
		for name, args := range map[string][]string{
			"alice": {"--tenant", "acme", "--role", "submitter"},
			"bob":   {"--tenant", "acme", "--role", "approver"},
			"eve":   {"--tenant", "globex", "--role", "submitter"},
			"bot":   {"--tenant", "acme", "--role", "agent", "--agent", "payer"},
		} {
			out, _, err := runCLI(t, nil, append([]string{"token", "new", "--principal", name, "--add-to", tokensPath}, args...)...)
			require.NoError(t, err)
			tokens[name], _, _ = strings.Cut(out, "\n")
		}
		cfg := writeFile(t, dir, "ledger.yaml", testConfig)
		served, logs, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0",
			"--tokens", tokensPath, "--config", cfg)
		require.Contains(t, logs.String(), `"msg":"config file loaded"`)
		url := servertest.NewProxy(t, served).URL
		cli := func(who string, args ...string) (string, error) {
			t.Helper()
			out, _, err := runCLI(t, nil, append(args, "--server", url, "--token", tokens[who])...)
			return out, err
		}

		out, err := cli("alice", "tools", "list")
		require.NoError(t, err)
		require.Regexp(t, `^NAME\s+VERSION\s+EFFECT\s+GUARANTEES\s+TIMEOUT\s+EXECUTOR\s+HEARTBEAT\s+MAX DURATION\n`, out)
		require.Regexp(t, `\npayments\.send\s+1\s+write\s+query\s+30s\s+client\s+10s\s+30s\n`, out)
		require.Regexp(t, `\ncards\.write\s+1\s+write\s+query,dedup,cancel\s+5s\s+builtin\s+-\s+-\n`, out)
		require.NotContains(t, out, "invoices.send", "globex's tool")
		out, err = cli("eve", "tools", "list", "--json")
		require.NoError(t, err)
		var tl server.ToolList
		require.NoError(t, json.Unmarshal([]byte(out), &tl))
		var names []string
		for _, tool := range tl.Tools {
			names = append(names, tool.Name)
		}
		require.Equal(t, []string{"invoices.send"}, names, "practice-cards is acme's only")

		out, err = cli("alice", "agents", "list")
		require.NoError(t, err)
		require.Regexp(t, `^NAME\s+DRIVER\s+TOOLS\s+REPEAT LIMIT\s+NO PROGRESS\s+CONSECUTIVE ERRORS\n`, out)
		require.Regexp(t, `\npayer\s+client\s+payments\.send\s+2\s+10\s+5\n`, out)
		require.Regexp(t, `\npractice-cards\s+builtin\s+cards\.write,cards\.count\s+2\s+10\s+3\n`, out)
		require.NotContains(t, out, "biller")
		out, err = cli("eve", "agents", "list", "--json")
		require.NoError(t, err)
		var al server.AgentList
		require.NoError(t, json.Unmarshal([]byte(out), &al))
		require.Len(t, al.Agents, 1, "another tenant sees neither payer nor practice-cards")
		require.Equal(t, "biller", al.Agents[0].Name)

		// The agent token submits runs of its agent, and of no other.
		out, _, err = runCLI(t, strings.NewReader(`{"task":"pay acct_1"}`), "submit", "--agent", "payer", "--input", "-", "--json",
			"--server", url, "--token", tokens["bot"])
		require.NoError(t, err)
		var sr server.SubmitResponse
		require.NoError(t, json.Unmarshal([]byte(out), &sr))
		require.Equal(t, "payer", sr.Agent)
		_, err = cli("bot", "runs", "show", string(sr.ID))
		require.NoError(t, err, "it reads its agent's run")
		md := writeFile(t, dir, "doc.md", "# Go\n\n## Maps\n\nHash tables.\n")
		_, err = cli("bot", "submit", "--title", "Go", "--markdown-file", md)
		requireExit(t, err, exitAuth)
		require.Contains(t, err.Error(), "403 agent_not_bound")
		_, err = cli("eve", "submit", "--agent", "payer", "--input", md)
		requireExit(t, err, exitUsage)

		// The config file's rules are in force, and the agent token never
		// decides.
		run, err := cli("alice", "submit", "--title", "Go", "--markdown-file", md, "--field", "id")
		require.NoError(t, err)
		run = strings.TrimSpace(run)
		var shown server.Run
		eventually(t, "the run to await approval", func() bool {
			out, err := cli("alice", "runs", "show", run, "--json")
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal([]byte(out), &shown))
			return shown.State == "awaiting_approval"
		})
		a := shown.Actions[len(shown.Actions)-1]
		require.Len(t, a.Approvals, 1)
		ap := a.Approvals[0]
		require.Equal(t, 123*time.Second, ap.ExpiresAt.Sub(ap.RequestedAt), "the file's rule, not the default TTL")
		_, err = cli("bot", "approve", string(a.ID), "--digest", string(a.ActionDigest))
		requireExit(t, err, exitAuth)
		require.Contains(t, err.Error(), "403 forbidden")
		_, err = cli("bob", "approve", string(a.ID), "--digest", string(a.ActionDigest))
		require.NoError(t, err)
		require.NoError(t, stop())
	})

	t.Run("ErrEveryProblem", func(t *testing.T) {
		dir := t.TempDir()
		bad := strings.Replace(testConfig, "    executor: client\n    heartbeat_timeout_ms: 10000\n", "    executor: mcp\n", 1)
		bad = strings.Replace(bad, "tools: [invoices.send]", "tools: [invoices.send, cards.write]", 1)
		bad = strings.Replace(bad, "decision: require_approval,", "decision: maybe,", 1)
		bad += "colour: blue\n"
		path := writeFile(t, dir, "ledger.yaml", bad)
		db := filepath.Join(dir, "ledger.db")
		for name, args := range map[string][]string{"flag": {"--config", path}, "environment": nil} {
			t.Run(name, func(t *testing.T) {
				if args == nil {
					t.Setenv(envConfig, path)
				}
				_, _, err := runCLI(t, nil, append([]string{"serve", "--db", db, "--addr", "127.0.0.1:0"}, args...)...)
				requireExit(t, err, exitUsage)
				require.Equal(t, "config file "+path+": 5 problems:\n"+
					`  /agents/1/tools/1: tool "cards.write" is not declared in /tools`+"\n"+
					"  /colour: unknown field\n"+
					"  /rules/rules/0/approval_ttl_ms: not allowed here\n"+ // a TTL goes with require_approval only
					`  /rules/rules/0/decision: value must be one of "auto_approve", "require_approval", "deny"`+"\n"+
					"  /tools/0/executor: executor mcp is not declared in /tools: the MCP gateway's tools come from mcp.upstreams", err.Error())
			})
		}
		_, err := os.Stat(db)
		require.ErrorIs(t, err, os.ErrNotExist, "refused before anything is opened")
	})

	// A lease that could never fit refuses every begin: serve refuses the
	// file before it opens anything, at the field's location.
	t.Run("ErrLeaseCanNeverFit", func(t *testing.T) {
		dir := t.TempDir()
		bad := strings.Replace(testConfig, "    heartbeat_timeout_ms: 10000\n", "    heartbeat_timeout_ms: 10000\n    max_duration_ms: 9999\n", 1)
		path := writeFile(t, dir, "ledger.yaml", bad)
		db := filepath.Join(dir, "ledger.db")
		_, err := serveRefused(t, "--db", db, "--config", path)
		requireExit(t, err, exitUsage)
		require.Equal(t, "config file "+path+": 1 problem:\n  /tools/0/max_duration_ms: 9999 is shorter than heartbeat_timeout_ms (10000): "+
			"an attempt's lease could never fit, and every begin would be refused; make it at least 10000, or set a shorter heartbeat_timeout_ms", err.Error())
		_, err = os.Stat(db)
		require.ErrorIs(t, err, os.ErrNotExist, "refused before anything is opened")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeFile(t, dir, "ledger.yaml", testConfig)
		rules := writeFile(t, dir, "rules.json", `{"schema_version":"1.0","rules":[]}`)
		db := filepath.Join(dir, "ledger.db")
		_, _, err := runCLI(t, nil, "serve", "--db", db, "--addr", "127.0.0.1:0", "--config", cfg, "--rules", rules)
		requireExit(t, err, exitUsage)
		require.Contains(t, err.Error(), "give the rules in one place")

		_, _, err = runCLI(t, nil, "serve", "--db", db, "--addr", "127.0.0.1:0", "--config", filepath.Join(dir, "missing.yaml"))
		requireExit(t, err, exitUsage)
		require.Contains(t, err.Error(), "missing.yaml")
	})

	t.Run("RulesFlagWithConfigWithoutRules", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeFile(t, dir, "ledger.json", `{"schema_version": "1.0"}`)
		rules := writeFile(t, dir, "rules.json", `{"schema_version":"1.0","rules":[]}`)
		_, _, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0", "--config", cfg, "--rules", rules)
		require.NoError(t, stop())
	})
}

// TestConfigFileExample: the example of docs/operations.md ("The config
// file") is a config file this build accepts.
func TestConfigFileExample(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "\n## The config file\n")
	require.True(t, ok)
	_, block, ok := strings.Cut(section, "```yaml\n")
	require.True(t, ok)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok)
	cfg, err := config.Parse([]byte(block), config.FormatYAML, builtins())
	require.NoError(t, err)
	require.Len(t, cfg.Tools, 3)
	require.Len(t, cfg.Agents, 2)
	require.NotNil(t, cfg.Rules)
}

// TestLocalCommandsTakeTheConfig: worker and recover know the config
// file's agents; without it, a client-driven run's agent is unknown to
// them and its run would be stopped.
func TestLocalCommandsTakeTheConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	cfgPath := writeFile(t, dir, "ledger.yaml", testConfig)
	cfg, err := config.Load(cfgPath, builtins())
	require.NoError(t, err)
	svc, err := openService(t.Context(), serviceConfig{DBPath: db, Config: cfg, Rules: cfg.Rules, Logger: discardLogger()})
	require.NoError(t, err)
	res, err := svc.store.SubmitRun(t.Context(), ledger.SubmitRunParams{Tenant: "acme", Principal: "bot", IdempotencyKey: "k",
		Agent: "payer", Input: json.RawMessage(`{}`), Start: svc.engine.ClientDriven("payer")})
	require.NoError(t, err)
	require.NoError(t, svc.Close())

	_, _, err = runCLI(t, nil, "recover", "--db", db, "--config", cfgPath)
	require.NoError(t, err)
	_, _, err = runCLI(t, nil, "worker", "--db", db, "--until-idle", "--config", cfgPath)
	require.NoError(t, err)
	store, err := sqlite.OpenStore(t.Context(), sqlite.Config{Path: db})
	require.NoError(t, err)
	run, err := store.FindRunByID(t.Context(), res.Run.ID)
	require.NoError(t, err)
	require.NoError(t, store.Close())
	require.Equal(t, ledger.RunRunning, run.State, "the client's run is left to its client")

	_, _, err = runCLI(t, nil, "worker", "--db", db, "--until-idle", "--config", writeFile(t, dir, "bad.yaml", "tools: 3\n"))
	requireExit(t, err, exitUsage)
}
