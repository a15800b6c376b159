package contracts_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
)

// buildOptions are what the ledger binary has: the simulator's tools and
// agent.
var buildOptions = contracts.ConfigOptions{
	BuiltinTools:  []string{"cards.write", "cards.count"},
	BuiltinAgents: []string{"practice-cards"},
}

// requireIssues checks that err lists exactly want, location → message
// part, and nothing else.
func requireIssues(t *testing.T, err error, want map[string]string) {
	t.Helper()
	require.ErrorIs(t, err, contracts.ErrInvalid)
	var ve *contracts.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "config", ve.Subject)
	got := map[string][]string{}
	for _, is := range ve.Issues {
		got[is.Location] = append(got[is.Location], is.Message)
	}
	for loc, part := range want {
		msgs, ok := got[loc]
		require.True(t, ok, "no issue at %q in %+v", loc, ve.Issues)
		require.True(t, strings.Contains(strings.Join(msgs, "\n"), part), "issue at %q: want %q, got %q", loc, part, msgs)
	}
	require.Len(t, got, len(want), "exactly the issues wanted: %+v", ve.Issues)
}

func TestParseConfig(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		c, err := contracts.ParseConfig(readTestdata(t, "config.valid.json"), buildOptions)
		require.NoError(t, err)
		require.Len(t, c.Tools, 4)
		send := c.Tools[0]
		require.Equal(t, "payments.send", send.Name)
		require.Equal(t, contracts.ExecutorClient, send.Executor)
		require.Equal(t, contracts.CurrentVersion, send.SchemaVersion, "absent in the file")
		require.Equal(t, contracts.EffectWrite, send.Effect)
		require.Equal(t, []string{"/to"}, send.SecretPaths)
		require.EqualValues(t, 30000, send.TimeoutMS)
		require.EqualValues(t, 600000, send.MaxDurationMS)
		require.Equal(t, "30s", send.HeartbeatTimeout().String())
		_, err = send.ArgumentValidator()
		require.NoError(t, err)
		require.Equal(t, contracts.ConfigTool{ToolDescriptor: contracts.ToolDescriptor{Name: "cards.write"}, Executor: contracts.ExecutorBuiltin},
			c.Tools[2], "a built-in tool is its name")
		tickets := c.Tools[3]
		require.Equal(t, contracts.ExecutorHTTP, tickets.Executor)
		require.Equal(t, contracts.CurrentVersion, tickets.SchemaVersion)
		require.Equal(t, contracts.HTTPEndpoints{URL: "https://tickets.example.com/ledger/open",
			QueryURL: "https://tickets.example.com/ledger/status", CancelURL: "https://tickets.example.com/ledger/cancel",
			BearerTokenEnv: "TICKETS_TOKEN", MaxResponseBytes: 65536}, tickets.HTTPEndpoints)
		require.EqualValues(t, 65536, tickets.ResponseCap())
		require.Zero(t, send.HTTPEndpoints, "a client tool has no endpoints")
		require.EqualValues(t, contracts.DefaultHTTPMaxResponseBytes, send.ResponseCap())

		require.Len(t, c.Agents, 2)
		a := c.Agents[0]
		require.Equal(t, contracts.DriverClient, a.Driver)
		require.Equal(t, []string{"payments.send", "payments.lookup"}, a.Tools)
		require.Equal(t, []string{"acme"}, a.Tenants)
		require.Equal(t, &contracts.AgentPolicies{RepeatLimit: 2, NoProgressWindow: 10, ConsecutiveErrors: 3}, a.Policies)
		require.Equal(t, contracts.ConfigAgent{Name: "practice-cards", Driver: contracts.DriverBuiltin, Tenants: []string{"acme", "globex"}}, c.Agents[1])
		require.NotNil(t, c.Rules)
		require.Len(t, c.Rules.Rules, 2)
	})

	t.Run("Minimal", func(t *testing.T) {
		c, err := contracts.ParseConfig([]byte(`{"schema_version": "1.3"}`), contracts.ConfigOptions{})
		require.NoError(t, err)
		require.Equal(t, &contracts.Config{SchemaVersion: "1.3"}, c)
	})

	// Every problem of a file is listed at once, each at its location:
	// the schema's, the rules', duplicate keys and names that disagree.
	t.Run("ErrEveryIssue", func(t *testing.T) {
		doc := `{"schema_version": "1.0", "colour": "blue",
		  "tools": [
		    {"name": "cards.write", "executor": "builtin", "version": "1"},
		    {"name": "cards.fly", "executor": "builtin"},
		    {"name": "pay.send", "executor": "mcp", "version": "1", "effect": "write", "arguments_schema": {"type": "object"},
		     "guarantees": {"query": true, "dedup": false, "cancel": false}, "timeout_ms": 1},
		    {"name": "pay.send", "executor": "client", "version": "1", "effect": "write", "arguments_schema": {"type": "object", "pattern": "("},
		     "guarantees": {"query": true, "dedup": false, "cancel": false}, "timeout_ms": 1, "retries": 3, "timeout_ms": 2},
		    {"name": "pay.look", "executor": "client", "effect": "read", "arguments_schema": {"type": "object"},
		     "guarantees": {"query": true}, "timeout_ms": 0, "schema_version": "2.0"},
		    {"name": "pay.refund", "executor": "builtin", "heartbeat_timeout_ms": 5}
		  ],
		  "agents": [
		    {"name": "bot", "driver": "client", "tools": ["pay.look", "cards.write", "nope"], "tenants": []},
		    {"name": "bot", "driver": "llm", "tools": ["pay.look"]},
		    {"name": "practice-cards", "driver": "client", "tools": ["pay.look"]},
		    {"name": "helper", "driver": "builtin", "tools": ["pay.look"], "policies": {"repeat_limit": 0, "loops": 1}},
		    {"name": "Bad Name", "driver": "client"}
		  ],
		  "rules": {"schema_version": "1.0", "rules": [{"tool": "*", "decision": "maybe", "why": 1}]}
		}`
		_, err := contracts.ParseConfig([]byte(doc), buildOptions)
		requireIssues(t, err, map[string]string{
			"/colour":                           "unknown field",
			"/tools/0/version":                  "not allowed here",
			"/tools/1/name":                     `no built-in tool "cards.fly" (built-in tools: cards.count, cards.write)`,
			"/tools/2/executor":                 "the MCP gateway's tools come from mcp.upstreams",
			"/tools/3/name":                     `tool "pay.send" is declared twice (first at /tools/2)`,
			"/tools/3/arguments_schema/pattern": "not valid 'regex'",
			"/tools/3/retries":                  "unknown field",
			"/tools/3/timeout_ms":               "duplicate key",
			"/tools/4/version":                  "required field is missing",
			"/tools/4/guarantees/dedup":         "required field is missing",
			"/tools/4/guarantees/cancel":        "required field is missing",
			"/tools/4/timeout_ms":               ">= 1",
			"/tools/4/schema_version":           `"2.0" is not supported`,
			"/tools/5/name":                     `no built-in tool "pay.refund"`,
			"/tools/5/heartbeat_timeout_ms":     "not allowed here",
			"/agents/0/tools/1":                 `tool "cards.write" is executed by the ledger (executor builtin)`,
			"/agents/0/tools/2":                 `tool "nope" is not declared in /tools`,
			"/agents/0/tenants":                 "minimum 1 items",
			"/agents/1/name":                    `agent "bot" is declared twice (first at /agents/0)`,
			"/agents/1/driver":                  "llm is not supported yet",
			"/agents/2/name":                    `"practice-cards" is a built-in agent`,
			"/agents/3/name":                    `no built-in agent "helper" (built-in agents: practice-cards)`,
			"/agents/3/tools":                   "not allowed here",
			"/agents/3/policies/repeat_limit":   ">= 1",
			"/agents/3/policies/loops":          "unknown field",
			"/agents/4/name":                    "pattern",
			"/agents/4/tools":                   "required field is missing",
			"/rules/rules/0/decision":           "must be one of",
			"/rules/rules/0/why":                "unknown field",
		})
	})

	t.Run("ErrRules", func(t *testing.T) {
		for name, tc := range map[string]struct{ rules, loc, part string }{
			"version":    {`{"schema_version": "2.0", "rules": []}`, "/rules/schema_version", `rules schema_version "2.0" is not supported`},
			"missing":    {`{"schema_version": "1.0"}`, "/rules/rules", "required field is missing"},
			"not object": {`[]`, "/rules", "expected object"},
			"ttl on deny": {`{"schema_version": "1.0", "rules": [{"tool": "*", "decision": "deny", "approval_ttl_ms": 5}]}`,
				"/rules/rules/0/approval_ttl_ms", "not allowed here"},
		} {
			t.Run(name, func(t *testing.T) {
				_, err := contracts.ParseConfig([]byte(`{"schema_version": "1.0", "rules": `+tc.rules+`}`), buildOptions)
				requireIssues(t, err, map[string]string{tc.loc: tc.part})
			})
		}
	})

	// An http tool: the URLs well formed, and its guarantees agreeing
	// with them; each refusal at its JSON Pointer.
	t.Run("ErrHTTP", func(t *testing.T) {
		const base = `{"name": "tickets.open", "version": "1", "effect": "write", "arguments_schema": {"type": "object"}, "timeout_ms": 1000, `
		for name, tc := range map[string]struct{ tool, loc, part string }{
			"no url": {`"executor": "http", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/url", "required field is missing"},
			"ftp url": {`"executor": "http", "url": "ftp://x/y", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/url", "does not match the pattern"},
			"no host": {`"executor": "http", "url": "http:///open", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/url", "names no host"},
			"bad url": {`"executor": "http", "url": "http://x:99999999999/%zz", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/url", "not a URL"},
			"credentials": {`"executor": "http", "url": "https://bot:hunter2@x.example/open", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/url", "carries credentials"},
			"fragment": {`"executor": "http", "url": "https://x.example/open#now", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/url", "fragment"},
			"query without url": {`"executor": "http", "url": "https://x.example/open", "guarantees": {"query": true, "dedup": false, "cancel": false}`,
				"/tools/0/guarantees/query", "no query_url says where"},
			"cancel without url": {`"executor": "http", "url": "https://x.example/open", "guarantees": {"query": false, "dedup": false, "cancel": true}`,
				"/tools/0/guarantees/cancel", "no cancel_url says where"},
			"query url without query": {`"executor": "http", "url": "https://x.example/open", "query_url": "https://x.example/q", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/query_url", "guarantees.query is false"},
			"cancel url without cancel": {`"executor": "http", "url": "https://x.example/open", "cancel_url": "https://x.example/c", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/cancel_url", "guarantees.cancel is false"},
			"bad query url": {`"executor": "http", "url": "https://x.example/open", "query_url": "https://u:p@x.example/q", "guarantees": {"query": true, "dedup": false, "cancel": false}`,
				"/tools/0/query_url", "carries credentials"},
			"small cap": {`"executor": "http", "url": "https://x.example/open", "max_response_bytes": 10, "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/max_response_bytes", ">= 1024"},
			"bad env name": {`"executor": "http", "url": "https://x.example/open", "bearer_token_env": "MY-TOKEN", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/bearer_token_env", "does not match the pattern"},
			"url on a client tool": {`"executor": "client", "url": "https://x.example/open", "guarantees": {"query": false, "dedup": true, "cancel": false}`,
				"/tools/0/url", "not allowed here"},
		} {
			t.Run(name, func(t *testing.T) {
				_, err := contracts.ParseConfig([]byte(`{"schema_version": "1.0", "tools": [`+base+tc.tool+`}]}`), buildOptions)
				requireIssues(t, err, map[string]string{tc.loc: tc.part})
			})
		}
	})

	// The ledger executes an http tool: a client agent may not call it.
	t.Run("ErrClientAgentCallsHTTPTool", func(t *testing.T) {
		doc := `{"schema_version": "1.0", "tools": [{"name": "tickets.open", "version": "1", "effect": "write", "arguments_schema": {"type": "object"},
		  "timeout_ms": 1000, "executor": "http", "url": "http://127.0.0.1:9/open", "guarantees": {"query": false, "dedup": true, "cancel": false}}],
		  "agents": [{"name": "bot", "driver": "client", "tools": ["tickets.open"]}]}`
		_, err := contracts.ParseConfig([]byte(doc), buildOptions)
		requireIssues(t, err, map[string]string{"/agents/0/tools/0": `tool "tickets.open" is executed by the ledger (executor http)`})
	})

	t.Run("ErrNotJSON", func(t *testing.T) {
		_, err := contracts.ParseConfig([]byte(`{"schema_version": "1.0",`), buildOptions)
		requireIssues(t, err, map[string]string{"": "not valid JSON"})
	})

	t.Run("ErrUnsupportedVersion", func(t *testing.T) {
		_, err := contracts.ParseConfig([]byte(`{"schema_version": "2.0", "tools": 5}`), buildOptions)
		require.ErrorIs(t, err, contracts.ErrUnsupportedVersion)
		require.NotErrorIs(t, err, contracts.ErrInvalid, "nothing else is checked: another contract")
	})

	t.Run("ErrNoBuiltins", func(t *testing.T) {
		_, err := contracts.ParseConfig([]byte(`{"schema_version": "1.0", "tools": [{"name": "cards.write", "executor": "builtin"}]}`),
			contracts.ConfigOptions{})
		requireIssues(t, err, map[string]string{"/tools/0/name": "(built-in tools: none)"})
	})
}

// configYAML is config.valid.json's first tool, agent and rules in YAML.
const configYAML = `schema_version: "1.0"
tools:
  - name: payments.send          # the tool_descriptor.v1 fields, flat
    version: "1"
    effect: write
    arguments_schema:
      type: object
      required: [to, cents]
      properties:
        to: {type: string}
        cents: {type: integer, minimum: 1}
    guarantees: {query: true, dedup: false, cancel: false}
    timeout_ms: 30000
    executor: client
    heartbeat_timeout_ms: 10000
agents:
  - name: my-python-agent
    driver: client
    tools: [payments.send]
    tenants: [acme]
    policies: {repeat_limit: 2, no_progress_window: 10, consecutive_errors: 3}
rules:
  schema_version: "1.0"
  rules:
    - {tool: payments.send, decision: require_approval}
`

func TestParseConfigYAML(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		c, err := contracts.ParseConfigYAML([]byte(configYAML), buildOptions)
		require.NoError(t, err)
		require.Len(t, c.Tools, 1)
		require.Equal(t, "payments.send", c.Tools[0].Name)
		require.EqualValues(t, 10000, c.Tools[0].HeartbeatTimeoutMS)
		require.EqualValues(t, 30000, c.Tools[0].TimeoutMS, "an integer stays an integer")
		require.JSONEq(t, `{"type":"object","required":["to","cents"],"properties":{"to":{"type":"string"},"cents":{"type":"integer","minimum":1}}}`,
			string(c.Tools[0].ArgumentsSchema))
		require.Equal(t, []string{"acme"}, c.Agents[0].Tenants)
		require.Equal(t, contracts.RuleDecisionRequireApproval, c.Rules.Rules[0].Decision)

		// JSON is YAML: the JSON file parses the same either way.
		j, err := contracts.ParseConfig(readTestdata(t, "config.valid.json"), buildOptions)
		require.NoError(t, err)
		y, err := contracts.ParseConfigYAML(readTestdata(t, "config.valid.json"), buildOptions)
		require.NoError(t, err)
		require.Equal(t, len(j.Tools), len(y.Tools))
		for i := range j.Tools {
			if j.Tools[i].ArgumentsSchema != nil {
				require.JSONEq(t, string(j.Tools[i].ArgumentsSchema), string(y.Tools[i].ArgumentsSchema))
			}
			j.Tools[i].ArgumentsSchema, y.Tools[i].ArgumentsSchema = nil, nil
		}
		require.Equal(t, j, y)
	})

	// Duplicate keys are listed at their locations with their lines,
	// beside every other problem of the file.
	t.Run("ErrEveryIssue", func(t *testing.T) {
		doc := strings.Replace(configYAML, "    executor: client\n", "    executor: client\n    executor: mcp\n    retries: 3\n", 1)
		doc = strings.Replace(doc, "    tools: [payments.send]\n", "    tools: [payments.send, payments.refund]\n    driver: client\n", 1)
		doc += "schema_version: \"1.0\"\n"
		_, err := contracts.ParseConfigYAML([]byte(doc), buildOptions)
		requireIssues(t, err, map[string]string{
			"/tools/0/executor": "duplicate key: the field appears more than once in its mapping (lines 14 and 15)",
			"/tools/0/retries":  "unknown field",
			// The last executor, mcp, is the one that counts.
			"/tools/0/heartbeat_timeout_ms": "not allowed here",
			"/agents/0/driver":              "duplicate key",
			"/agents/0/tools/1":             `tool "payments.refund" is not declared`,
			"/schema_version":               "duplicate key",
		})
	})

	t.Run("ErrNotYAML", func(t *testing.T) {
		_, err := contracts.ParseConfigYAML([]byte("schema_version: \"1.0\"\ntools: [\n"), buildOptions)
		requireIssues(t, err, map[string]string{"": "not valid YAML: line"})
	})

	t.Run("ErrNotAnObject", func(t *testing.T) {
		_, err := contracts.ParseConfigYAML([]byte("- a\n- b\n"), buildOptions)
		requireIssues(t, err, map[string]string{"": "expected object"})
		_, err = contracts.ParseConfigYAML([]byte(""), buildOptions)
		requireIssues(t, err, map[string]string{"": "expected object"})
	})

	t.Run("ErrUnquotedVersion", func(t *testing.T) {
		// YAML reads 1.0 as a number: the file must quote it.
		_, err := contracts.ParseConfigYAML([]byte("schema_version: 1.0\n"), buildOptions)
		requireIssues(t, err, map[string]string{"/schema_version": "expected string"})
	})
}

// TestConfigToolIsDescriptor holds a config tool to the tool descriptor:
// every descriptor field is a field of a config tool, declared alike (only
// schema_version's description differs: it is optional here), and the Go
// type has exactly the schema's fields.
func TestConfigToolIsDescriptor(t *testing.T) {
	desc := decode(t, contracts.SchemaJSON(contracts.SchemaToolDescriptor)).(map[string]any)["properties"].(map[string]any)
	tool := decode(t, contracts.SchemaJSON(contracts.SchemaConfig)).(map[string]any)["properties"].(map[string]any)["tools"].(map[string]any)["items"].(map[string]any)
	props := tool["properties"].(map[string]any)
	for name, want := range desc {
		got, ok := props[name]
		require.True(t, ok, "config tools lack descriptor field %s", name)
		if name == "schema_version" {
			w, g := want.(map[string]any), got.(map[string]any)
			require.Equal(t, w["pattern"], g["pattern"])
			require.Equal(t, w["type"], g["type"])
			continue
		}
		require.Equal(t, want, got, name)
	}
	var fields []string
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields = append(fields, name)
		}
	}
	walk(reflect.TypeOf(contracts.ConfigTool{}))
	var names []string
	for name := range props {
		names = append(names, name)
	}
	require.ElementsMatch(t, names, fields)
}
