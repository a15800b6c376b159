package engine

import (
	"context"
	"encoding/json"
	"time"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// StepKind says what a model step asks for.
type StepKind string

// Step kinds.
const (
	StepToolCall StepKind = "tool_call" // call Tool with Arguments
	StepFinal    StepKind = "final"     // the run is done; Final is the answer
)

// Usage is what one model step consumed. A nil *Usage means the provider
// reported none: token accounting becomes unavailable, never zero.
type Usage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// Step is a model's answer to the history so far.
type Step struct {
	Kind      StepKind
	Tool      string          // StepToolCall: the tool's name
	Arguments json.RawMessage // StepToolCall: a JSON object
	Final     json.RawMessage // StepFinal: the answer
	Usage     *Usage
}

// HistoryEntry is one action the run recorded and what came of it.
type HistoryEntry struct {
	Action  *ledger.Action
	Attempt *ledger.Attempt // the last attempt, if any
}

// History is what a model sees: the run's input and every action so far, in
// order, as recorded in the ledger. A model must derive its next step from
// the history alone: after a restart the engine asks again with the same
// history and expects the same step.
type History struct {
	RunID   ledger.RunID
	Input   json.RawMessage
	Entries []HistoryEntry
}

// Model proposes the next step of a run.
type Model interface {
	Next(ctx context.Context, h History) (Step, error)
}

// Call is one execution of a tool for one attempt of an action.
//
// Its context carries the call's deadline: set before the engine last made
// sure the run's lease outlasts the call by a margin, so the deadline falls
// before any other process may take the run over (on this process's clock).
// A tool that cannot see that deadline where it acts (a request already on
// its way to a remote service, say) uses FencingToken instead: see
// docs/concepts.md, "Writing a tool".
type Call struct {
	RunID    ledger.RunID
	ActionID ledger.ActionID
	Attempt  int64
	// AttemptID names the attempt the call is made for, recorded before
	// the call; a tool may keep it with the effect as evidence of which
	// attempt acted.
	AttemptID ledger.AttemptID
	// DedupKey is stable per action across attempts (<run_id>/<action_id>);
	// a tool that dedups uses it to run the action's effect at most once.
	DedupKey string
	// FencingToken is the token of the run lease the call is made under:
	// it only grows from one holder of the run to the next, so a tool that
	// keeps the highest token it has seen for RunID, and refuses a write
	// that carries a lower one (with effect not_happened), refuses the late
	// call of a process that lost the run to another. 0 when the call is
	// made under no lease (Engine.Advance called outside the pool): such a
	// call cannot be fenced.
	FencingToken int64
	Arguments    json.RawMessage
}

// Result is a tool's answer to Execute.
type Result struct {
	Output json.RawMessage
	// Effect is what the tool says of the world: happened for a write that
	// took effect, not_happened for a read or a refused call, unknown if it
	// cannot say.
	Effect ledger.EffectFact
}

// Tool executes actions. Execute returns a *ToolError (or any error) when the
// call failed; context.DeadlineExceeded marks a timeout.
type Tool interface {
	Descriptor() contracts.ToolDescriptor
	Execute(ctx context.Context, c Call) (Result, error)
}

// QueryResult is what a tool knows of a dedup key's effect.
type QueryResult struct {
	Effect ledger.EffectFact // unknown is never read as not happened
	Output json.RawMessage
}

// Querier is implemented by tools whose descriptor declares query: the
// effect of a dedup key can be looked up after the fact.
type Querier interface {
	Query(ctx context.Context, dedupKey string) (QueryResult, error)
}

// CancelResult is a tool's answer to Cancel.
type CancelResult struct {
	Confirmed bool // the call will not take effect (or was undone)
	Detail    json.RawMessage
}

// Canceller is implemented by tools whose descriptor declares cancel.
type Canceller interface {
	Cancel(ctx context.Context, dedupKey string) (CancelResult, error)
}

// ToolError is a tool's failure with a stable code, persisted on the attempt.
type ToolError struct {
	Code    string
	Message string
	// Effect is what the tool knows of the world despite the error:
	// not_happened when it refused before acting, unknown otherwise.
	Effect ledger.EffectFact
}

// Error implements error.
func (e *ToolError) Error() string { return e.Code + ": " + e.Message }

// Driver says who runs an agent's loop.
type Driver string

// Drivers.
const (
	// DriverBuiltin: the engine asks the agent's model for each step and
	// calls its tools itself.
	DriverBuiltin Driver = "builtin"
	// DriverClient: a process outside the ledger runs the loop and reports
	// each tool call through the agent protocol (docs/agent-protocol.md);
	// the engine takes no model step and calls no tool of such a run.
	DriverClient Driver = "client"
	// DriverGateway: a front end of this process (the MCP gateway)
	// proposes each call for a caller attached to it, and the engine calls
	// the tool while that caller waits (gateway.go): no model step, and no
	// attempt begins without a caller attached. Its tools are the engine's
	// to call, query and cancel, as a built-in agent's.
	DriverGateway Driver = "gateway"
)

// Agent is a named pairing of a model and the tools it may call, as the
// submit body names it ({"agent": "practice-cards", ...}).
type Agent struct {
	Name string
	// Driver is who runs the loop; "" means DriverBuiltin.
	Driver Driver
	// NewModel returns the model for a run's input; it is called again after
	// a restart, so it must not hold state the history cannot rebuild.
	// Required for DriverBuiltin, unused for DriverClient.
	NewModel func(input json.RawMessage) (Model, error)
	Tools    []Tool
	// Tenants, if not empty, are the only tenants the agent's runs may be
	// submitted for; empty means every tenant.
	Tenants []string
	// Policy holds the agent's loop-policy thresholds; its zero fields take
	// the engine's (Config.Policy), and those take budget's defaults. Every
	// budget and loop check of the agent's runs uses it.
	Policy budget.Policy
	// ContinueOnToolError, for a built-in agent, reports a failed action
	// back to the model instead of ending the run with tool_error: the
	// action (state failed, its effect established as not happened) stays
	// in the history and the model takes its next step. Such a run is
	// bounded by the loop policies consecutive_errors and no_progress
	// (budget.Policy.Loop says what counts), and by its budgets. An
	// uncertain action is still recovery's: only a failure whose effect is
	// known not to have happened reaches the model. False, the default,
	// keeps the first failed action the end of the run.
	ContinueOnToolError bool
}

// Lease bounds an attempt a client executes (docs/agent-protocol.md,
// "Leases"): the lease lapses HeartbeatTimeout after the last heartbeat,
// and heartbeats renew it up to MaxDuration after the attempt began.
type Lease struct {
	HeartbeatTimeout time.Duration
	MaxDuration      time.Duration
	// DecisionTimeout is how long a recovery decision told to the agent
	// (query, cancel, resend) may go unanswered before the action goes to
	// a person (docs/recovery.md); 0 means DefaultDecisionTimeout.
	DecisionTimeout time.Duration
}

// DefaultHeartbeatTimeout is a client tool's lease when its declaration
// sets none.
const DefaultHeartbeatTimeout = 30 * time.Second

// DefaultDecisionTimeout is how long an agent has to act on a recovery
// decision about a client tool's call when its declaration sets none.
const DefaultDecisionTimeout = 5 * time.Minute

// clientTool is a tool a client executes: the engine never calls it.
type clientTool struct {
	desc  contracts.ToolDescriptor
	lease Lease
}

// ClientTool returns the tool described by d whose calls an outside agent
// makes and reports through the agent protocol; the engine never calls
// its Execute. A zero lease.HeartbeatTimeout means
// DefaultHeartbeatTimeout, a zero lease.MaxDuration the descriptor's
// timeout (and at least the heartbeat timeout), a zero
// lease.DecisionTimeout DefaultDecisionTimeout.
func ClientTool(d contracts.ToolDescriptor, lease Lease) Tool {
	if lease.HeartbeatTimeout <= 0 {
		lease.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if lease.MaxDuration <= 0 {
		lease.MaxDuration = max(d.Timeout(), lease.HeartbeatTimeout)
	}
	if lease.DecisionTimeout <= 0 {
		lease.DecisionTimeout = DefaultDecisionTimeout
	}
	return &clientTool{desc: d, lease: lease}
}

// Descriptor implements Tool.
func (t *clientTool) Descriptor() contracts.ToolDescriptor { return t.desc }

// Execute implements Tool; it always fails: a client makes the calls.
func (t *clientTool) Execute(context.Context, Call) (Result, error) {
	return Result{}, &ToolError{Code: "client_tool", Message: "tool " + t.desc.Name + " is executed by the agent's client, not by the engine",
		Effect: ledger.EffectNotHappened}
}

// LeaseOf returns the lease of a client tool, and false for any other.
func LeaseOf(t Tool) (Lease, bool) {
	if c, ok := t.(*clientTool); ok {
		return c.lease, true
	}
	return Lease{}, false
}
