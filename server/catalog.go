package server

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
)

// ToolList is GET /v1/tools: the tools the caller's tenant may have called,
// in name order.
type ToolList struct {
	// Tools are in name order.
	Tools []Tool `json:"tools"`
}

// Tool is one tool as GET /v1/tools shows it: its descriptor's fields (but
// schema_version), who executes it, and a client tool's lease.
type Tool struct {
	Name        string           `json:"name"`
	Version     string           `json:"version"`
	Effect      contracts.Effect `json:"effect"`
	Description string           `json:"description,omitempty"`
	// ArgumentsSchema is the JSON Schema (draft 2020-12) of the tool's
	// arguments.
	ArgumentsSchema json.RawMessage      `json:"arguments_schema" jsonschema:"type=object"`
	Guarantees      contracts.Guarantees `json:"guarantees"`
	// TimeoutMS is the longest a single call may take.
	TimeoutMS int64 `json:"timeout_ms" jsonschema:"minimum=1"`
	// DedupRetentionMS is how long the tool honours a dedup key; absent: no
	// limit declared.
	DedupRetentionMS int64 `json:"dedup_retention_ms,omitempty" jsonschema:"minimum=1"`
	// QueryVisibilityMS is how long after a call a query may still miss
	// it; absent: 0.
	QueryVisibilityMS int64 `json:"query_visibility_ms,omitempty" jsonschema:"minimum=0"`
	// SecretPaths are JSON Pointers into the arguments whose values are
	// redacted.
	SecretPaths []string `json:"secret_paths,omitempty"`
	// Executor is client (the agent's own process makes the calls and
	// reports them, docs/agent-protocol.md), builtin (the ledger does, with
	// a tool of its own) or http (the ledger does, over HTTP,
	// docs/http-tools.md).
	Executor contracts.Executor `json:"executor"`
	// HeartbeatTimeoutMS is, for a client tool only, how long after its
	// last heartbeat an attempt's lease lapses.
	HeartbeatTimeoutMS int64 `json:"heartbeat_timeout_ms,omitempty" jsonschema:"minimum=1"`
	// MaxDurationMS is, for a client tool only, how long after the attempt
	// began heartbeats may renew its lease.
	MaxDurationMS int64 `json:"max_duration_ms,omitempty" jsonschema:"minimum=1"`
	// DecisionTimeoutMS is, for a client tool only, how long its agent may
	// leave a recovery decision unanswered before a person is asked.
	DecisionTimeoutMS int64 `json:"decision_timeout_ms,omitempty" jsonschema:"minimum=1"`
}

// AgentList is GET /v1/agents: the agents the caller's tenant may submit
// runs of, in name order.
type AgentList struct {
	// Agents are in name order.
	Agents []Agent `json:"agents"`
}

// Agent is one agent as GET /v1/agents shows it.
type Agent struct {
	Name string `json:"name"`
	// Driver is builtin (the ledger runs the loop) or client (a process
	// outside the ledger, through the agent protocol).
	Driver engine.Driver `json:"driver"`
	// Tools are the names of the tools the agent may call (GET
	// /v1/tools), in its order.
	Tools []string `json:"tools"`
	// Policies are the loop-policy thresholds its runs are held to.
	Policies AgentPolicies `json:"policies"`
}

// AgentPolicies are an agent's loop-policy thresholds, defaults applied.
type AgentPolicies struct {
	// RepeatLimit: an action already proposed this many times is refused
	// (repeated_action).
	RepeatLimit int `json:"repeat_limit" jsonschema:"minimum=1"`
	// NoProgressWindow: this many actions in a row none of which succeeded
	// stop the run (no_progress).
	NoProgressWindow int `json:"no_progress_window" jsonschema:"minimum=1"`
	// ConsecutiveErrors: this many failed attempts in a row stop the run
	// (consecutive_errors).
	ConsecutiveErrors int `json:"consecutive_errors" jsonschema:"minimum=1"`
}

// tenantAgents are the registered agents whose runs tenant may submit,
// in name order.
func (s *Server) tenantAgents(tenant string) []engine.AgentInfo {
	var out []engine.AgentInfo
	for _, a := range s.engine.Agents() {
		if info, ok := s.engine.AgentFor(a.Name, tenant); ok {
			out = append(out, info)
		}
	}
	return out
}

// listTools is GET /v1/tools, for any role: every tool of the agents the
// caller's tenant may use, and the tools the engine registers apart from
// any agent (the http tools, the ledger's own to call for whichever agent
// is given them), once each.
func (s *Server) listTools(c echo.Context) error {
	id, err := needRole(c, Roles()...)
	if err != nil {
		return err
	}
	byName := map[string]Tool{}
	for _, a := range s.tenantAgents(id.Tenant) {
		for _, d := range a.Tools {
			if _, seen := byName[d.Name]; !seen {
				byName[d.Name] = s.toolView(d)
			}
		}
	}
	for _, d := range s.engine.Tools() {
		if _, seen := byName[d.Name]; !seen {
			byName[d.Name] = s.toolView(d)
		}
	}
	out := ToolList{Tools: make([]Tool, 0, len(byName))}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out.Tools = append(out.Tools, byName[name])
	}
	return sendJSON(c, http.StatusOK, out)
}

func (s *Server) toolView(d contracts.ToolDescriptor) Tool {
	t := Tool{Name: d.Name, Version: d.Version, Effect: d.Effect, Description: d.Description, ArgumentsSchema: d.ArgumentsSchema,
		Guarantees: d.Guarantees, TimeoutMS: d.TimeoutMS, DedupRetentionMS: d.DedupRetentionMS, QueryVisibilityMS: d.QueryVisibilityMS,
		SecretPaths: slices.Clone(d.SecretPaths), Executor: contracts.ExecutorBuiltin}
	if len(t.SecretPaths) == 0 {
		t.SecretPaths = nil
	}
	if s.httpTools[d.Name] {
		t.Executor = contracts.ExecutorHTTP
	}
	if lease, ok := s.clientTools[d.Name]; ok {
		t.Executor = contracts.ExecutorClient
		t.HeartbeatTimeoutMS = lease.HeartbeatTimeout.Milliseconds()
		t.MaxDurationMS = lease.MaxDuration.Milliseconds()
		t.DecisionTimeoutMS = lease.DecisionTimeout.Milliseconds()
	}
	return t
}

// listAgents is GET /v1/agents, for any role: the agents the caller's
// tenant may submit runs of.
func (s *Server) listAgents(c echo.Context) error {
	id, err := needRole(c, Roles()...)
	if err != nil {
		return err
	}
	agents := s.tenantAgents(id.Tenant)
	out := AgentList{Agents: make([]Agent, 0, len(agents))}
	for _, a := range agents {
		v := Agent{Name: a.Name, Driver: a.Driver, Tools: make([]string, 0, len(a.Tools)), Policies: AgentPolicies{
			RepeatLimit: a.Policy.RepeatLimit, NoProgressWindow: a.Policy.NoProgressWindow, ConsecutiveErrors: a.Policy.ConsecutiveErrors}}
		for _, d := range a.Tools {
			v.Tools = append(v.Tools, d.Name)
		}
		out.Agents = append(out.Agents, v)
	}
	return sendJSON(c, http.StatusOK, out)
}
