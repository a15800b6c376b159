package contracts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// Executor says who executes a configured tool's calls.
type Executor string

// Executors.
const (
	// ExecutorClient: the agent's own process makes the call and reports it
	// through the agent protocol; the ledger never calls the tool.
	ExecutorClient Executor = "client"
	// ExecutorBuiltin: one of the tools this build of the ledger has (the
	// simulator's cards.write and cards.count); the ledger calls it.
	ExecutorBuiltin Executor = "builtin"
	// ExecutorMCP names tools reached over MCP, which the config's mcp
	// section declares, never /tools: a tool of /tools with it is refused.
	ExecutorMCP Executor = "mcp"
	// ExecutorHTTP: the ledger calls the tool itself over HTTP (POST to its
	// url, docs/http-tools.md), and recovery its query_url and cancel_url;
	// agents the engine drives may call it, client agents may not.
	ExecutorHTTP Executor = "http"
)

// Driver says who runs a configured agent's loop.
type Driver string

// Drivers.
const (
	// DriverClient: a process outside the ledger runs the loop and reports
	// each tool call through the agent protocol.
	DriverClient Driver = "client"
	// DriverBuiltin: one of this build's agents (practice-cards), run by
	// the ledger's engine.
	DriverBuiltin Driver = "builtin"
	// DriverLLM is reserved for agents whose model the ledger calls; this
	// version refuses it.
	DriverLLM Driver = "llm"
)

// Config is the operator's config file (schema config): the tools agents
// may call, the agents runs may name, and optionally the approval rules.
// ParseConfig and ParseConfigYAML build it; its names agree with each other
// and with the build (ConfigOptions) once parsed.
type Config struct {
	// SchemaVersion is required in a config file.
	SchemaVersion string `json:"schema_version"`
	// Tools in file order; each name appears once.
	Tools []ConfigTool `json:"tools,omitempty"`
	// Agents in file order; each name appears once.
	Agents []ConfigAgent `json:"agents,omitempty"`
	// Rules are the approval rules, or nil when the file has none.
	Rules *Rules `json:"rules,omitempty"`
	// MCP is the MCP gateway's section, or nil when the file has none.
	MCP *ConfigMCP `json:"mcp,omitempty"`
}

// ConfigMCP is the MCP gateway's section of a config file: the MCP servers
// it stands in front of and how a call waits for a person.
type ConfigMCP struct {
	// Agent is the agent the gateway's runs are recorded under; "" means
	// DefaultMCPAgent.
	Agent string `json:"agent,omitempty"`
	// ApprovalWait is a Go duration ("20s"); "" means
	// DefaultMCPApprovalWait. ApprovalWaitDuration parses it.
	ApprovalWait string `json:"approval_wait,omitempty"`
	// LockFile holds the confirmed tool definitions, relative to the
	// config file's directory; "" means DefaultMCPLockFile.
	LockFile string `json:"lock_file,omitempty"`
	// MaxResultBytes caps an upstream answer kept and passed on; 0 means
	// DefaultMCPMaxResultBytes.
	MaxResultBytes int64 `json:"max_result_bytes,omitempty"`
	// Tenants, if not empty, are the only tenants that may use the gateway.
	Tenants []string `json:"tenants,omitempty"`
	// Policies are the loop-policy thresholds of the gateway's runs.
	Policies *AgentPolicies `json:"policies,omitempty"`
	// Upstreams in file order; each name appears once.
	Upstreams []ConfigUpstream `json:"upstreams"`
}

// Defaults of the MCP gateway's section.
const (
	DefaultMCPAgent          = "mcp"
	DefaultMCPApprovalWait   = 20 * time.Second
	DefaultMCPLockFile       = "mcp-tools.lock.json"
	DefaultMCPMaxResultBytes = 1 << 20
	DefaultMCPTimeoutMS      = 30000
)

// AgentName is the agent of the gateway's runs.
func (m *ConfigMCP) AgentName() string {
	if m.Agent == "" {
		return DefaultMCPAgent
	}
	return m.Agent
}

// ApprovalWaitDuration is how long a call waits for a person.
func (m *ConfigMCP) ApprovalWaitDuration() time.Duration {
	d, err := time.ParseDuration(m.ApprovalWait)
	if err != nil || d <= 0 {
		return DefaultMCPApprovalWait
	}
	return d
}

// ResultCap is the largest upstream answer kept, in bytes.
func (m *ConfigMCP) ResultCap() int64 {
	if m.MaxResultBytes <= 0 {
		return DefaultMCPMaxResultBytes
	}
	return m.MaxResultBytes
}

// Upstream is the upstream named name.
func (m *ConfigMCP) Upstream(name string) (ConfigUpstream, bool) {
	for _, u := range m.Upstreams {
		if u.Name == name {
			return u, true
		}
	}
	return ConfigUpstream{}, false
}

// ConfigUpstream is one MCP server behind the gateway: a command spoken to
// over stdio, or a streamable HTTP URL.
type ConfigUpstream struct {
	Name           string            `json:"name"`
	Command        []string          `json:"command,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	URL            string            `json:"url,omitempty"`
	BearerTokenEnv string            `json:"bearer_token_env,omitempty"`
	// TimeoutMS bounds a call of a tool whose profile sets none; 0 means
	// DefaultMCPTimeoutMS.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Tools are the profiles of its tools, by the upstream's tool name.
	Tools map[string]ToolProfile `json:"tools,omitempty"`
}

// Profile is the profile of the upstream's tool name: the configured one,
// or a write with no guarantees; configured reports which.
func (u ConfigUpstream) Profile(tool string) (p ToolProfile, configured bool) {
	p, configured = u.Tools[tool]
	if p.Effect == "" {
		p.Effect = EffectWrite
	}
	if p.TimeoutMS == 0 {
		p.TimeoutMS = u.TimeoutMS
	}
	if p.TimeoutMS == 0 {
		p.TimeoutMS = DefaultMCPTimeoutMS
	}
	return p, configured
}

// ToolProfile is what the ledger holds an upstream tool to: its effect and
// guarantees (the upstream's annotations are hints it does not trust), the
// paths of secrets in its arguments, and how recovery asks the same
// upstream about a call.
type ToolProfile struct {
	// Effect is read or write; "" means write.
	Effect            Effect     `json:"effect,omitempty"`
	Guarantees        Guarantees `json:"guarantees"`
	SecretPaths       []string   `json:"secret_paths,omitempty"`
	TimeoutMS         int64      `json:"timeout_ms,omitempty"`
	DedupRetentionMS  int64      `json:"dedup_retention_ms,omitempty"`
	QueryVisibilityMS int64      `json:"query_visibility_ms,omitempty"`
	Query             *ProbeTool `json:"query,omitempty"`
	Cancel            *ProbeTool `json:"cancel,omitempty"`
}

// ProbeTool is the upstream tool recovery calls to query or cancel a call
// by its dedup key.
type ProbeTool struct {
	Tool string `json:"tool"`
	// KeyArgument carries the dedup key; "" means "dedup_key".
	KeyArgument string `json:"key_argument,omitempty"`
	// EffectPointer locates a query's answer in the structured result;
	// "" means "/effect".
	EffectPointer string `json:"effect_pointer,omitempty"`
	// ConfirmedPointer locates a cancel's confirmation; "" means
	// "/confirmed".
	ConfirmedPointer string `json:"confirmed_pointer,omitempty"`
}

// ConfigTool is one tool of a config file: the fields of a tool descriptor,
// flat, and who executes it. A builtin tool has only Name and Executor: its
// descriptor is the build's.
type ConfigTool struct {
	// ToolDescriptor holds the descriptor's fields; its SchemaVersion is
	// CurrentVersion after parsing when the file gave none.
	ToolDescriptor
	// HTTPEndpoints are where the ledger reaches a tool of executor http;
	// zero for any other executor.
	HTTPEndpoints
	// Executor is client, builtin or http once parsed (mcp is refused).
	Executor Executor `json:"executor"`
	// HeartbeatTimeoutMS is a client tool's lease after each heartbeat; 0
	// means not set.
	HeartbeatTimeoutMS int64 `json:"heartbeat_timeout_ms,omitempty"`
	// MaxDurationMS bounds a client tool's lease from the attempt's start;
	// 0 means not set.
	MaxDurationMS int64 `json:"max_duration_ms,omitempty"`
	// DecisionTimeoutMS is how long a client tool's agent may leave a
	// recovery decision (query, cancel, resend) unanswered before a person
	// is asked; 0 means not set.
	DecisionTimeoutMS int64 `json:"decision_timeout_ms,omitempty"`
}

// HTTPEndpoints are where the ledger reaches a tool of executor http, and
// how (docs/http-tools.md): URL takes each call, QueryURL and CancelURL
// answer recovery by dedup key. The parser holds them to the tool's
// guarantees: query needs QueryURL and cancel CancelURL, and neither URL is
// given without its guarantee.
type HTTPEndpoints struct {
	// URL is where each call is POSTed: http or https, no credentials in it.
	URL string `json:"url,omitempty"`
	// QueryURL answers whether a dedup key's call took effect; "" if the
	// tool cannot say.
	QueryURL string `json:"query_url,omitempty"`
	// CancelURL cancels a dedup key's call; "" if the tool cannot.
	CancelURL string `json:"cancel_url,omitempty"`
	// BearerTokenEnv names the environment variable whose value is sent as
	// "Authorization: Bearer …" to each URL; "" sends none.
	BearerTokenEnv string `json:"bearer_token_env,omitempty"`
	// MaxResponseBytes caps an answer read; 0 means
	// DefaultHTTPMaxResponseBytes.
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`
}

// DefaultHTTPMaxResponseBytes is an http tool's max_response_bytes when
// its declaration sets none: 1 MiB.
const DefaultHTTPMaxResponseBytes = 1 << 20

// ResponseCap is the largest answer of the tool read, in bytes.
func (h HTTPEndpoints) ResponseCap() int64 {
	if h.MaxResponseBytes <= 0 {
		return DefaultHTTPMaxResponseBytes
	}
	return h.MaxResponseBytes
}

// DefaultHeartbeatTimeoutMS is a client tool's heartbeat_timeout_ms when
// its declaration sets none.
const DefaultHeartbeatTimeoutMS = 30000

// HeartbeatTimeout returns HeartbeatTimeoutMS as a duration; 0 means not set.
func (t *ConfigTool) HeartbeatTimeout() time.Duration { return msDuration(t.HeartbeatTimeoutMS) }

// MaxDuration returns MaxDurationMS as a duration; 0 means not set.
func (t *ConfigTool) MaxDuration() time.Duration { return msDuration(t.MaxDurationMS) }

// DecisionTimeout returns DecisionTimeoutMS as a duration; 0 means not set.
func (t *ConfigTool) DecisionTimeout() time.Duration { return msDuration(t.DecisionTimeoutMS) }

// ConfigAgent is one agent of a config file.
type ConfigAgent struct {
	// Name is what a run submission names ("agent").
	Name string `json:"name"`
	// Driver is client or builtin once parsed (llm is refused).
	Driver Driver `json:"driver"`
	// Tools are the names of the tools a client agent may call, each a
	// client tool of the file (never a builtin or http one, which the
	// ledger executes); a builtin agent has none here.
	Tools []string `json:"tools,omitempty"`
	// Tenants, if not empty, are the only tenants whose runs may name the
	// agent.
	Tenants []string `json:"tenants,omitempty"`
	// Policies are the agent's loop-policy thresholds, or nil.
	Policies *AgentPolicies `json:"policies,omitempty"`
}

// AgentPolicies are an agent's loop-policy thresholds; a zero field is not
// set (the schema refuses zero and negative values).
type AgentPolicies struct {
	RepeatLimit       int `json:"repeat_limit,omitempty"`
	NoProgressWindow  int `json:"no_progress_window,omitempty"`
	ConsecutiveErrors int `json:"consecutive_errors,omitempty"`
}

// ConfigOptions tell the parser what this build has, for the names a file
// may refer to without declaring.
type ConfigOptions struct {
	// BuiltinTools are the names of the tools an executor builtin may name.
	BuiltinTools []string
	// BuiltinAgents are the names of the agents a driver builtin may name.
	BuiltinAgents []string
}

// ParseConfig validates a config file written in JSON and decodes it. It
// lists every problem at once, each at its JSON Pointer, in one
// *ValidationError (ErrInvalid): a duplicate key, an unknown field, a
// breach of the schema, rules that break the rules schema (under /rules),
// an arguments schema that does not compile, and names that do not agree:
// a tool or agent declared twice, an agent calling a tool the file does not
// declare or one the ledger executes, a built-in tool or agent this build
// does not have (opts), and what this version does not support (executor
// mcp, driver llm), a client tool whose lease could never fit
// (max_duration_ms shorter than heartbeat_timeout_ms, given or default), and
// an http tool whose URLs are not http(s) URLs of a host without
// credentials, or disagree with its guarantees (query without query_url,
// query_url without query; cancel and cancel_url alike). A
// schema_version of another major version fails with a *VersionError
// (ErrUnsupportedVersion) and nothing else is checked.
func ParseConfig(data []byte, opts ConfigOptions) (*Config, error) {
	subject := SchemaConfig.String()
	v, err := decodeJSON(data)
	if err != nil {
		return nil, &ValidationError{Subject: subject, Issues: []Issue{{Message: err.Error()}}}
	}
	if err := checkVersion(SchemaConfig, v); err != nil {
		return nil, err
	}
	issues := duplicateKeys(data)
	schemaIssues, err := issuesOfValidate(compiled[SchemaConfig].validate(SchemaConfig, v))
	if err != nil {
		return nil, err
	}
	issues = append(issues, schemaIssues...)
	ruleIssues, err := configRulesIssues(v)
	if err != nil {
		return nil, err
	}
	issues = append(issues, ruleIssues...)
	issues = append(issues, configNameIssues(v, opts)...)
	issues = append(issues, configArgumentIssues(v, issues)...)
	issues = append(issues, configLeaseIssues(v, issues)...)
	issues = append(issues, configHTTPIssues(v, issues)...)
	if len(issues) > 0 {
		return nil, &ValidationError{Subject: subject, Issues: sortIssues(issues)}
	}
	var c Config
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return nil, fmt.Errorf("contracts: decode %s: %w", SchemaConfig, err)
	}
	for i := range c.Tools {
		if t := &c.Tools[i]; t.Executor != ExecutorBuiltin && t.SchemaVersion == "" {
			t.SchemaVersion = CurrentVersion
		}
	}
	return &c, nil
}

// ParseConfigYAML is ParseConfig for a config file written in YAML: the
// YAML is turned into JSON, which ParseConfig then checks. A key that
// appears twice in its mapping is listed with the others, at its JSON
// Pointer and with its line, and so is a second document (after "---"),
// at its line; a file that is not YAML at all is refused with the parser's
// complaint alone.
func ParseConfigYAML(data []byte, opts ConfigOptions) (*Config, error) {
	subject := SchemaConfig.String()
	var root, next yamlv3.Node
	d := yamlv3.NewDecoder(bytes.NewReader(data))
	if err := d.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, &ValidationError{Subject: subject, Issues: yamlIssues(err)}
	}
	dups := yamlDuplicateKeys(&root, "")
	switch err := d.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, &ValidationError{Subject: subject, Issues: yamlIssues(err)}
	default:
		// The converter below reads the first document only: what follows
		// would be ignored without a word.
		dups = append(dups, Issue{Message: fmt.Sprintf("line %d: a second YAML document starts here; a config file is one document: "+
			`remove the "---" and what follows, or merge it into the first`, next.Line)})
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, &ValidationError{Subject: subject, Issues: yamlIssues(err)}
	}
	c, err := ParseConfig(j, opts)
	if len(dups) == 0 {
		return c, err
	}
	var ve *ValidationError
	switch {
	case err == nil:
		return nil, &ValidationError{Subject: subject, Issues: sortIssues(dups)}
	case errors.As(err, &ve):
		return nil, &ValidationError{Subject: subject, Issues: sortIssues(append(slices.Clone(ve.Issues), dups...))}
	default:
		return nil, err
	}
}

// yamlDuplicateKeys finds every key that appears twice in its mapping, at
// the JSON Pointer the key has once the document is JSON. Aliases are not
// followed (their anchor is checked where it stands), and merge keys
// ("<<") are left to the converter.
func yamlDuplicateKeys(n *yamlv3.Node, loc string) []Issue {
	var out []Issue
	switch n.Kind {
	case yamlv3.DocumentNode:
		for _, c := range n.Content {
			out = append(out, yamlDuplicateKeys(c, loc)...)
		}
	case yamlv3.MappingNode:
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			child := loc + "/" + escapeToken(k.Value)
			if k.Value != "<<" {
				if first, dup := seen[k.Value]; dup {
					out = append(out, Issue{Location: child, Message: fmt.Sprintf(
						"duplicate key: the field appears more than once in its mapping (lines %d and %d)", first, k.Line)})
				} else {
					seen[k.Value] = k.Line
				}
			}
			out = append(out, yamlDuplicateKeys(v, child)...)
		}
	case yamlv3.SequenceNode:
		for i, c := range n.Content {
			out = append(out, yamlDuplicateKeys(c, loc+"/"+strconv.Itoa(i))...)
		}
	}
	return out
}

// yamlIssues turns the YAML library's error, which lists one problem per
// line ("line 3: did not find expected key"), into issues of the document.
func yamlIssues(err error) []Issue {
	msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
	msg = strings.TrimPrefix(msg, "yaml: ")
	var out []Issue
	for _, line := range strings.Split(msg, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line == "unmarshal errors:" {
			continue
		}
		out = append(out, Issue{Message: "not valid YAML: " + strings.TrimPrefix(line, "yaml: ")})
	}
	if len(out) == 0 {
		out = []Issue{{Message: "not valid YAML"}}
	}
	return out
}

// issuesOfValidate returns the issues of a validate error, nil for no
// error, and any other error as it is.
func issuesOfValidate(err error) ([]Issue, error) {
	var ve *ValidationError
	switch {
	case err == nil:
		return nil, nil
	case errors.As(err, &ve):
		return ve.Issues, nil
	default:
		return nil, err
	}
}

// duplicateKeys finds every key that appears twice in its object, at the
// key's location. data must be valid JSON; otherwise it finds nothing
// (decodeJSON says what is wrong).
func duplicateKeys(data []byte) []Issue {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var issues []Issue
	var walk func(loc string) error
	walk = func(loc string) error {
		tok, err := d.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return err
				}
				key, _ := kt.(string)
				child := loc + "/" + escapeToken(key)
				if seen[key] {
					issues = append(issues, Issue{Location: child, Message: "duplicate key: the field appears more than once in its object"})
				}
				seen[key] = true
				if err := walk(child); err != nil {
					return err
				}
			}
		case json.Delim('['):
			for i := 0; d.More(); i++ {
				if err := walk(loc + "/" + strconv.Itoa(i)); err != nil {
					return err
				}
			}
		default:
			return nil
		}
		_, err = d.Token() // the closing delimiter
		return err
	}
	if walk("") != nil {
		return nil
	}
	return issues
}

// configRulesIssues checks the file's rules against the rules schema,
// with the issues located under /rules. Rules that are not an object are
// the config schema's to report.
func configRulesIssues(v any) ([]Issue, error) {
	m, _ := v.(map[string]any)
	rules, ok := m["rules"].(map[string]any)
	if !ok {
		return nil, nil
	}
	err := compiled[SchemaRules].validate(SchemaRules, rules)
	var verr *VersionError
	if errors.As(err, &verr) {
		return []Issue{{Location: "/rules/schema_version", Message: fmt.Sprintf("rules schema_version %q is not supported (this build reads major version %d)",
			verr.Version, SupportedMajor)}}, nil
	}
	issues, err := issuesOfValidate(err)
	if err != nil {
		return nil, err
	}
	for i := range issues {
		issues[i].Location = "/rules" + issues[i].Location
	}
	return issues, nil
}

// configEntries returns the objects of the top-level array name, by index;
// items that are not objects are left out (the schema reports them).
func configEntries(v any, name string) map[int]map[string]any {
	m, _ := v.(map[string]any)
	arr, _ := m[name].([]any)
	out := make(map[int]map[string]any, len(arr))
	for i, item := range arr {
		if obj, ok := item.(map[string]any); ok {
			out[i] = obj
		}
	}
	return out
}

// configNameIssues checks that the names of a config file agree with each
// other and with the build. It reads the decoded document defensively, so
// that it can run, and its issues be listed, beside the schema's.
func configNameIssues(v any, opts ConfigOptions) []Issue {
	var issues []Issue
	add := func(loc, format string, args ...any) {
		issues = append(issues, Issue{Location: loc, Message: fmt.Sprintf(format, args...)})
	}
	tools := configEntries(v, "tools")
	executors := map[string]string{} // tool name → executor, of the first declaration
	firstTool := map[string]int{}
	for _, i := range sortedKeys(tools) {
		t := tools[i]
		at := "/tools/" + strconv.Itoa(i)
		name, _ := t["name"].(string)
		executor, _ := t["executor"].(string)
		if name != "" {
			if first, dup := firstTool[name]; dup {
				add(at+"/name", "tool %q is declared twice (first at /tools/%d)", name, first)
			} else {
				firstTool[name], executors[name] = i, executor
			}
		}
		switch Executor(executor) {
		case ExecutorMCP:
			add(at+"/executor", "executor mcp is not declared in /tools: the MCP gateway's tools come from mcp.upstreams")
		case ExecutorBuiltin:
			if name != "" && !slices.Contains(opts.BuiltinTools, name) {
				add(at+"/name", "this build has no built-in tool %q (built-in tools: %s)", name, listOrNone(opts.BuiltinTools))
			}
		}
		if sv, ok := t["schema_version"].(string); ok {
			if m := versionPattern.FindStringSubmatch(sv); m != nil {
				if major, err := strconv.ParseUint(m[1], 10, 64); err != nil || major != SupportedMajor {
					add(at+"/schema_version", "tool descriptor schema_version %q is not supported (this build reads major version %d)", sv, SupportedMajor)
				}
			}
		}
	}
	agents := configEntries(v, "agents")
	firstAgent := map[string]int{}
	for _, j := range sortedKeys(agents) {
		a := agents[j]
		at := "/agents/" + strconv.Itoa(j)
		name, _ := a["name"].(string)
		driver, _ := a["driver"].(string)
		if name != "" {
			if first, dup := firstAgent[name]; dup {
				add(at+"/name", "agent %q is declared twice (first at /agents/%d)", name, first)
			} else {
				firstAgent[name] = j
			}
		}
		builtin := slices.Contains(opts.BuiltinAgents, name)
		switch Driver(driver) {
		case DriverLLM:
			add(at+"/driver", "driver llm is not supported yet")
		case DriverBuiltin:
			if name != "" && !builtin {
				add(at+"/name", "this build has no built-in agent %q (built-in agents: %s)", name, listOrNone(opts.BuiltinAgents))
			}
		case DriverClient:
			if builtin {
				add(at+"/name", "%q is a built-in agent: declare it with driver builtin, or give this agent another name", name)
			}
			names, _ := a["tools"].([]any)
			for k, n := range names {
				tool, ok := n.(string)
				if !ok {
					continue
				}
				loc := at + "/tools/" + strconv.Itoa(k)
				switch executor, declared := executors[tool]; {
				case !declared:
					add(loc, "tool %q is not declared in /tools", tool)
				case executor == string(ExecutorBuiltin) || executor == string(ExecutorHTTP):
					add(loc, "tool %q is executed by the ledger (executor %s): a client agent may call only client tools", tool, executor)
				}
			}
		}
	}
	return append(issues, configMCPIssues(v, firstAgent, opts)...)
}

// configMCPIssues checks the names of the MCP gateway's section: its agent
// is no other agent, each upstream is named once, and a profile that
// promises query or cancel says which upstream tool does it.
func configMCPIssues(v any, agents map[string]int, opts ConfigOptions) []Issue {
	var issues []Issue
	add := func(loc, format string, args ...any) {
		issues = append(issues, Issue{Location: loc, Message: fmt.Sprintf(format, args...)})
	}
	m, _ := v.(map[string]any)
	mcp, ok := m["mcp"].(map[string]any)
	if !ok {
		return nil
	}
	agent, _ := mcp["agent"].(string)
	if agent == "" {
		agent = DefaultMCPAgent
	}
	if j, declared := agents[agent]; declared {
		add("/mcp/agent", "the gateway's runs are recorded under agent %q, which /agents/%d declares too: give mcp.agent another name", agent, j)
	} else if slices.Contains(opts.BuiltinAgents, agent) {
		add("/mcp/agent", "%q is a built-in agent: give mcp.agent another name", agent)
	}
	if w, ok := mcp["approval_wait"].(string); ok {
		if d, err := time.ParseDuration(w); err == nil && d <= 0 {
			add("/mcp/approval_wait", "approval_wait must be positive, not %q", w)
		}
	}
	ups, _ := mcp["upstreams"].([]any)
	first := map[string]int{}
	for i, item := range ups {
		u, ok := item.(map[string]any)
		if !ok {
			continue
		}
		at := "/mcp/upstreams/" + strconv.Itoa(i)
		if name, _ := u["name"].(string); name != "" {
			if j, dup := first[name]; dup {
				add(at+"/name", "upstream %q is declared twice (first at /mcp/upstreams/%d)", name, j)
			} else {
				first[name] = i
			}
		}
		tools, _ := u["tools"].(map[string]any)
		for _, tool := range slices.Sorted(maps.Keys(tools)) {
			p, ok := tools[tool].(map[string]any)
			if !ok {
				continue
			}
			loc := at + "/tools/" + escapeToken(tool)
			g, _ := p["guarantees"].(map[string]any)
			for _, probe := range []string{"query", "cancel"} {
				if promised, _ := g[probe].(bool); promised && p[probe] == nil {
					add(loc+"/"+probe, "guarantees.%s is promised but no %s tool says how: name the upstream tool that does it", probe, probe)
				}
			}
		}
	}
	return issues
}

// configArgumentIssues compiles the arguments schema of each client tool
// whose declaration has no issue of its own there yet, so that a schema
// that can never check arguments is refused at load, at its location.
func configArgumentIssues(v any, found []Issue) []Issue {
	var out []Issue
	tools := configEntries(v, "tools")
	for _, i := range sortedKeys(tools) {
		t := tools[i]
		at := "/tools/" + strconv.Itoa(i)
		raw, ok := t["arguments_schema"].(map[string]any)
		if !ok || slices.ContainsFunc(found, func(is Issue) bool {
			return is.Location == at || strings.HasPrefix(is.Location, at+"/arguments_schema")
		}) {
			continue
		}
		b, err := json.Marshal(raw)
		if err != nil {
			out = append(out, Issue{Location: at + "/arguments_schema", Message: err.Error()})
			continue
		}
		name, _ := t["name"].(string)
		d := ToolDescriptor{Name: name, ArgumentsSchema: b}
		if _, err := d.ArgumentValidator(); err != nil {
			is, _ := issuesOfValidate(err)
			for _, x := range is {
				out = append(out, Issue{Location: at + x.Location, Message: x.Message})
			}
		}
	}
	return out
}

// configLeaseIssues refuses a client tool whose lease could never fit:
// an attempt's lease starts heartbeat_timeout_ms long (its default when
// not set) and may never reach past max_duration_ms from the begin, so a
// maximum shorter than the heartbeat timeout would refuse every begin
// while /next says execute. A maximum shorter than timeout_ms is accepted:
// a call that ends within it completes. Entries with an issue of their
// own at either field are left to it.
func configLeaseIssues(v any, found []Issue) []Issue {
	var out []Issue
	tools := configEntries(v, "tools")
	for _, i := range sortedKeys(tools) {
		t := tools[i]
		at := "/tools/" + strconv.Itoa(i)
		if executor, _ := t["executor"].(string); Executor(executor) != ExecutorClient || slices.ContainsFunc(found, func(is Issue) bool {
			return is.Location == at || is.Location == at+"/max_duration_ms" || is.Location == at+"/heartbeat_timeout_ms"
		}) {
			continue
		}
		maxMS, ok := configInt(t["max_duration_ms"])
		if !ok {
			continue // absent: the default is at least the heartbeat timeout
		}
		hbMS, ok := configInt(t["heartbeat_timeout_ms"])
		hb := strconv.FormatInt(hbMS, 10)
		if !ok {
			hbMS, hb = DefaultHeartbeatTimeoutMS, strconv.Itoa(DefaultHeartbeatTimeoutMS)+", the default"
		}
		if maxMS < hbMS {
			out = append(out, Issue{Location: at + "/max_duration_ms", Message: fmt.Sprintf(
				"%d is shorter than heartbeat_timeout_ms (%s): an attempt's lease could never fit, and every begin would be refused; "+
					"make it at least %d, or set a shorter heartbeat_timeout_ms", maxMS, hb, hbMS)})
		}
	}
	return out
}

// configHTTPIssues checks the URLs of each http tool: each one an http or
// https URL with a host, and no credentials (they would be shown wherever
// the URL is) or fragment in it; and the guarantees agree with them:
// recovery queries only through query_url and cancels only through
// cancel_url, so guarantees.query needs the one and guarantees.cancel the
// other, and a URL whose guarantee is false would never be called.
// Entries with an issue of their own at a field are left to it.
func configHTTPIssues(v any, found []Issue) []Issue {
	var out []Issue
	tools := configEntries(v, "tools")
	for _, i := range sortedKeys(tools) {
		t := tools[i]
		at := "/tools/" + strconv.Itoa(i)
		if executor, _ := t["executor"].(string); Executor(executor) != ExecutorHTTP {
			continue
		}
		flagged := func(loc string) bool {
			return slices.ContainsFunc(found, func(is Issue) bool { return is.Location == loc })
		}
		for _, field := range []string{"url", "query_url", "cancel_url"} {
			raw, ok := t[field].(string)
			if !ok || flagged(at+"/"+field) {
				continue
			}
			if why := httpURLProblem(raw); why != "" {
				out = append(out, Issue{Location: at + "/" + field, Message: why})
			}
		}
		g, _ := t["guarantees"].(map[string]any)
		for _, probe := range []struct{ guarantee, field, does string }{
			{"query", "query_url", "asks whether a call took effect"},
			{"cancel", "cancel_url", "cancels a call"},
		} {
			promised, _ := g[probe.guarantee].(bool)
			_, given := t[probe.field]
			switch {
			case promised && !given && !flagged(at+"/guarantees/"+probe.guarantee):
				out = append(out, Issue{Location: at + "/guarantees/" + probe.guarantee, Message: fmt.Sprintf(
					"guarantees.%s is promised but no %s says where: recovery %s only through %s; give it, or set %s: false",
					probe.guarantee, probe.field, probe.does, probe.field, probe.guarantee)})
			case !promised && given && !flagged(at+"/"+probe.field):
				out = append(out, Issue{Location: at + "/" + probe.field, Message: fmt.Sprintf(
					"%s is given but guarantees.%s is false: recovery would never call it; set %s: true if the tool keeps that promise, or remove %s",
					probe.field, probe.guarantee, probe.guarantee, probe.field)})
			}
		}
	}
	return out
}

// httpURLProblem says what makes raw unfit as an http tool's URL, "" if
// nothing does.
func httpURLProblem(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Sprintf("not a URL: %v", errors.Unwrap(err))
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("an http or https URL, not %q", u.Scheme)
	case u.Host == "" || u.Hostname() == "":
		return "the URL names no host"
	case u.User != nil:
		return "the URL carries credentials, which would be shown wherever it is: put the secret in the variable bearer_token_env names"
	case u.Fragment != "" || strings.HasSuffix(raw, "#"):
		return "the URL has a fragment (#…), which is never sent: remove it"
	}
	return ""
}

// configInt is a field of a decoded config file as an integer; false if
// absent or not an integer (the schema reports that).
func configInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

func sortedKeys[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	s := slices.Clone(names)
	slices.Sort(s)
	return strings.Join(s, ", ")
}
