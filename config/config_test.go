package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/config"
	"github.com/actionledger/ledger/contracts"
)

// builtins is a build with one tool and one agent of its own.
var builtins = config.Builtins{
	Tools: []contracts.ToolDescriptor{{SchemaVersion: "1.0", Name: "cards.write", Version: "1", Effect: contracts.EffectWrite,
		ArgumentsSchema: []byte(`{"type":"object"}`), TimeoutMS: 5000}},
	Agents: []string{"practice-cards"},
}

const goodYAML = `schema_version: "1.0"
tools:
  - name: payments.send
    version: "1"
    effect: write
    arguments_schema: {type: object}
    guarantees: {query: true, dedup: false, cancel: false}
    timeout_ms: 45000
    executor: client
  - name: payments.lookup
    version: "1"
    effect: read
    arguments_schema: {type: object}
    guarantees: {query: false, dedup: false, cancel: false}
    timeout_ms: 1000
    executor: client
    heartbeat_timeout_ms: 5000
    max_duration_ms: 60000
  - {name: cards.write, executor: builtin}
agents:
  - name: payer
    driver: client
    tools: [payments.send, payments.lookup]
    tenants: [acme]
    policies: {consecutive_errors: 5}
  - {name: practice-cards, driver: builtin, policies: {repeat_limit: 4}}
`

func write(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func TestLoad(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		path := write(t, "ledger.yaml", goodYAML)
		c, err := config.Load(path, builtins)
		require.NoError(t, err)
		require.Equal(t, path, c.Path)
		require.Nil(t, c.Rules)
		require.Len(t, c.Tools, 3)

		send, ok := c.Tool("payments.send")
		require.True(t, ok)
		require.Equal(t, contracts.ExecutorClient, send.Executor)
		require.Equal(t, config.DefaultHeartbeatTimeout, send.HeartbeatTimeout, "the default lease")
		require.Equal(t, 45*time.Second, send.MaxDuration, "the default: the tool's timeout")
		require.Equal(t, contracts.CurrentVersion, send.Descriptor.SchemaVersion)

		lookup, _ := c.Tool("payments.lookup")
		require.Equal(t, 5*time.Second, lookup.HeartbeatTimeout)
		require.Equal(t, time.Minute, lookup.MaxDuration)

		cards, _ := c.Tool("cards.write")
		require.Equal(t, contracts.ExecutorBuiltin, cards.Executor)
		require.Equal(t, builtins.Tools[0], cards.Descriptor, "a built-in tool's descriptor is the build's")
		require.Zero(t, cards.HeartbeatTimeout)

		payer, ok := c.Agent("payer")
		require.True(t, ok)
		require.Equal(t, config.Agent{Name: "payer", Driver: contracts.DriverClient, Tools: []string{"payments.send", "payments.lookup"},
			Tenants: []string{"acme"}, Policy: budget.Policy{ConsecutiveErrors: 5}}, payer)
		pc, _ := c.Agent("practice-cards")
		require.Equal(t, config.Agent{Name: "practice-cards", Driver: contracts.DriverBuiltin, Policy: budget.Policy{RepeatLimit: 4}}, pc)
		_, ok = c.Agent("nobody")
		require.False(t, ok)
		_, ok = c.Tool("nothing")
		require.False(t, ok)
	})

	// An http tool: its endpoints kept, the answer cap defaulted, no
	// lease (the ledger makes its calls).
	t.Run("HTTPTool", func(t *testing.T) {
		doc := goodYAML[:strings.Index(goodYAML, "agents:")] + `  - name: tickets.open
    version: "1"
    effect: write
    arguments_schema: {type: object}
    guarantees: {query: true, dedup: true, cancel: false}
    timeout_ms: 5000
    executor: http
    url: https://tickets.example.com/open
    query_url: https://tickets.example.com/status
    bearer_token_env: TICKETS_TOKEN
`
		c, err := config.Parse([]byte(doc), config.FormatYAML, builtins)
		require.NoError(t, err)
		tickets, ok := c.Tool("tickets.open")
		require.True(t, ok)
		require.Equal(t, contracts.ExecutorHTTP, tickets.Executor)
		require.Equal(t, contracts.HTTPEndpoints{URL: "https://tickets.example.com/open", QueryURL: "https://tickets.example.com/status",
			BearerTokenEnv: "TICKETS_TOKEN", MaxResponseBytes: contracts.DefaultHTTPMaxResponseBytes}, tickets.HTTP)
		require.Zero(t, tickets.HeartbeatTimeout)
		require.Zero(t, tickets.MaxDuration)
		require.Zero(t, tickets.DecisionTimeout)
		send, _ := c.Tool("payments.send")
		require.Zero(t, send.HTTP, "a client tool has no endpoints")
	})

	t.Run("MaxDurationAtLeastHeartbeat", func(t *testing.T) {
		doc := strings.Replace(goodYAML, "timeout_ms: 45000", "timeout_ms: 2000", 1)
		c, err := config.Parse([]byte(doc), config.FormatYAML, builtins)
		require.NoError(t, err)
		send, _ := c.Tool("payments.send")
		require.Equal(t, config.DefaultHeartbeatTimeout, send.MaxDuration)
	})

	t.Run("MaxDurationBelowTimeout", func(t *testing.T) {
		// A call shorter than max_duration_ms completes within its lease:
		// a maximum below the tool's timeout can run, and is accepted.
		doc := strings.Replace(goodYAML, "timeout_ms: 45000\n    executor: client\n", "timeout_ms: 45000\n    executor: client\n    max_duration_ms: 30000\n", 1)
		c, err := config.Parse([]byte(doc), config.FormatYAML, builtins)
		require.NoError(t, err)
		send, _ := c.Tool("payments.send")
		require.Equal(t, 30*time.Second, send.MaxDuration)
	})

	// A lease that can never fit (its first stretch, heartbeat_timeout_ms,
	// longer than its maximum) would refuse every begin: refused at load,
	// listed with the file's other problems.
	t.Run("ErrMaxDurationBelowHeartbeat", func(t *testing.T) {
		doc := strings.Replace(goodYAML, "max_duration_ms: 60000", "max_duration_ms: 4000", 1)
		doc = strings.Replace(doc, "timeout_ms: 45000\n    executor: client\n", "timeout_ms: 45000\n    executor: client\n    max_duration_ms: 20000\n", 1)
		doc += "colour: blue\n"
		path := write(t, "ledger.yaml", doc)
		_, err := config.Load(path, builtins)
		require.ErrorIs(t, err, contracts.ErrInvalid)
		require.Equal(t, "config file "+path+": 3 problems:\n"+
			"  /colour: unknown field\n"+
			"  /tools/0/max_duration_ms: 20000 is shorter than heartbeat_timeout_ms (30000, the default): "+
			"an attempt's lease could never fit, and every begin would be refused; make it at least 30000, or set a shorter heartbeat_timeout_ms\n"+
			"  /tools/1/max_duration_ms: 4000 is shorter than heartbeat_timeout_ms (5000): "+
			"an attempt's lease could never fit, and every begin would be refused; make it at least 5000, or set a shorter heartbeat_timeout_ms", err.Error())
	})

	// A config file is one YAML document: a second one after "---" would
	// be ignored silently, so it is refused, at its line.
	t.Run("ErrSecondDocument", func(t *testing.T) {
		for name, tail := range map[string]string{
			"document":       "---\nschema_version: \"1.0\"\ntools: []\n",
			"empty document": "---\n",
		} {
			t.Run(name, func(t *testing.T) {
				path := write(t, "ledger.yaml", goodYAML+tail)
				_, err := config.Load(path, builtins)
				require.ErrorIs(t, err, contracts.ErrInvalid)
				line := strings.Count(goodYAML, "\n") + 1
				require.Equal(t, fmt.Sprintf("config file %s: 1 problem:\n  (document): line %d: a second YAML document starts here; "+
					"a config file is one document: remove the \"---\" and what follows, or merge it into the first", path, line), err.Error())
			})
		}
		// A "---" before the one document starts it: that is one document.
		c, err := config.Parse([]byte("---\n"+goodYAML), config.FormatYAML, builtins)
		require.NoError(t, err)
		require.Len(t, c.Tools, 3)
	})

	// The file's size is checked before it is parsed: a file over the cap
	// is refused at once, naming the cap; one of exactly the cap loads.
	t.Run("ErrTooLarge", func(t *testing.T) {
		pad := func(n int) string { return goodYAML + "# " + strings.Repeat("x", n-len(goodYAML)-3) + "\n" }
		at := write(t, "at-cap.yaml", pad(config.MaxFileBytes))
		_, err := config.Load(at, builtins)
		require.NoError(t, err)

		over := write(t, "over-cap.yaml", pad(config.MaxFileBytes+1))
		_, err = config.Load(over, builtins)
		require.ErrorIs(t, err, config.ErrTooLarge)
		var ce *config.Error
		require.ErrorAs(t, err, &ce)
		require.Equal(t, over, ce.Path)
		require.Equal(t, "config file "+over+": 1048577 bytes, over the cap of 1 MiB (1048576 bytes) on a config file", err.Error())

		_, err = config.Parse([]byte(pad(config.MaxFileBytes+1)), config.FormatYAML, builtins)
		require.ErrorIs(t, err, config.ErrTooLarge)
	})

	t.Run("JSON", func(t *testing.T) {
		path := write(t, "ledger.json", `{"schema_version": "1.0", "rules": {"schema_version": "1.0", "rules": [{"tool": "*", "decision": "deny"}]}}`)
		c, err := config.Load(path, builtins)
		require.NoError(t, err)
		require.Equal(t, contracts.RuleDecisionDeny, c.Rules.Rules[0].Decision)
		require.Empty(t, c.Tools)
	})

	// The error lists every problem on a line of its own, at its location.
	t.Run("ErrEveryProblem", func(t *testing.T) {
		doc := strings.Replace(goodYAML, "executor: builtin", "executor: builtin, version: \"2\"", 1)
		doc = strings.Replace(doc, "tools: [payments.send, payments.lookup]", "tools: [payments.send, payments.refund]", 1)
		doc += "colour: blue\n"
		path := write(t, "ledger.yml", doc)
		_, err := config.Load(path, builtins)
		require.ErrorIs(t, err, contracts.ErrInvalid)
		var ce *config.Error
		require.ErrorAs(t, err, &ce)
		require.Equal(t, path, ce.Path)
		require.Equal(t, "config file "+path+": 3 problems:\n"+
			"  /agents/0/tools/1: tool \"payments.refund\" is not declared in /tools\n"+
			"  /colour: unknown field\n"+
			"  /tools/2/version: not allowed here", err.Error())
	})

	t.Run("ErrOneProblem", func(t *testing.T) {
		_, err := config.Load(write(t, "c.json", `{"schema_version": "1.0",}`), builtins)
		require.ErrorIs(t, err, contracts.ErrInvalid)
		require.Regexp(t, `^config file \S+c\.json: 1 problem:\n  \(document\): not valid JSON`, err.Error())
	})

	t.Run("ErrBuiltinsOfTheBuild", func(t *testing.T) {
		_, err := config.Parse([]byte(goodYAML), config.FormatYAML, config.Builtins{})
		require.ErrorIs(t, err, contracts.ErrInvalid)
		require.Contains(t, err.Error(), `/tools/2/name: this build has no built-in tool "cards.write"`)
		require.Contains(t, err.Error(), `/agents/1/name: this build has no built-in agent "practice-cards"`)
	})

	t.Run("ErrVersion", func(t *testing.T) {
		_, err := config.Load(write(t, "c.yaml", `schema_version: "2.0"`), builtins)
		require.ErrorIs(t, err, contracts.ErrUnsupportedVersion)
		require.Contains(t, err.Error(), `schema_version "2.0" is not supported`)
	})

	t.Run("ErrMissingFile", func(t *testing.T) {
		_, err := config.Load(filepath.Join(t.TempDir(), "missing.yaml"), builtins)
		require.ErrorIs(t, err, os.ErrNotExist)
		require.Contains(t, err.Error(), "missing.yaml")
	})
}

func TestFormatOf(t *testing.T) {
	for path, want := range map[string]config.Format{
		"a.json": config.FormatJSON, "A.JSON": config.FormatJSON, "a.yaml": config.FormatYAML,
		"a.yml": config.FormatYAML, "ledger.conf": config.FormatYAML, "ledger": config.FormatYAML,
	} {
		require.Equal(t, want, config.FormatOf(path), path)
	}
}
