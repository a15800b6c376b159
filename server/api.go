package server

import (
	"encoding/json"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// The wire types of HTTP API v1 (docs/api.md). The server encodes
// them and the CLI decodes them: field names are the contract outside
// clients rely on, so change them only with the design.
//
// They are also the one source of openapi.json's components.schemas:
// `go generate ./server` reflects them (internal/openapigen), taking each
// type's and field's doc comment as its description, a field without
// omitempty as required, and the jsonschema struct tags as constraints;
// a test fails when the committed document is not what they generate.

//go:generate go run ./internal/openapigen/cmd/openapigen -root .. -document openapi.json

// Problem is an RFC 9457 problem document with the stable code clients
// branch on.
type Problem struct {
	// Type is https://actionledger.dev/problems/<code>.
	Type   string `json:"type" jsonschema:"format=uri"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Code is the stable code clients branch on (docs/api.md lists them).
	Code string `json:"code"`
	// Instance is urn:request:<id>, the X-Request-ID of the answer: quote
	// it to an operator, whose log lines of the request carry the same id.
	Instance string `json:"instance,omitempty" jsonschema:"format=uri"`
	// Errors says where the body fails its schema; for invalid_arguments,
	// where the arguments fail the tool's schema (pointers under
	// /arguments).
	Errors []FieldError `json:"errors,omitempty"`
	// Action is, for step_key_reused, the action recorded for this step
	// key; for approval_stale, the action to follow: the same one asking
	// for approval again, or the one that supersedes it.
	Action *Action `json:"action,omitempty"`
	// Recorded is, for outcome_conflict, the outcome as recorded.
	Recorded *Outcome `json:"recorded,omitempty"`
	// StopReason is, for run_stopped, why the run stopped.
	StopReason ledger.StopReason `json:"stop_reason,omitempty"`
}

// FieldError is one failing location of a request body (a JSON pointer).
type FieldError struct {
	// Location is a JSON pointer into the body, or the query parameter's
	// name.
	Location string `json:"location"`
	Message  string `json:"message"`
}

// SubmitRequest is the body of POST /v1/runs; it must also pass the
// contracts run_submission schema (unknown and server-owned fields refused).
// The document's RunSubmission is that schema, so SubmitRequest and
// SubmitBudgets are not generated into it.
type SubmitRequest struct {
	SchemaVersion string          `json:"schema_version,omitempty"`
	Agent         string          `json:"agent"`
	Input         json.RawMessage `json:"input"`
	Budgets       *SubmitBudgets  `json:"budgets,omitempty"`
}

// SubmitBudgets are the optional budgets of a submission.
type SubmitBudgets struct {
	MaxAttemptsPerAction int64 `json:"max_attempts_per_action,omitempty"`
	MaxAttemptsPerRun    int64 `json:"max_attempts_per_run,omitempty"`
	MaxExecutionMS       int64 `json:"max_execution_ms,omitempty"`
	DeadlineMS           int64 `json:"deadline_ms,omitempty"`
	MaxSteps             int64 `json:"max_steps,omitempty"`
	MaxTokens            int64 `json:"max_tokens,omitempty"`
}

// Budget is a run's budget: its limits and what it has used, durations in
// milliseconds as a submission gives them.
type Budget struct {
	Limits BudgetLimits `json:"limits"`
	Used   BudgetUsage  `json:"used"`
}

// BudgetLimits are a run's limits; an absent limit is none.
type BudgetLimits struct {
	MaxAttemptsPerAction int64 `json:"max_attempts_per_action,omitempty" jsonschema:"minimum=1"`
	MaxAttemptsPerRun    int64 `json:"max_attempts_per_run,omitempty" jsonschema:"minimum=1"`
	// MaxExecutionMS is the time the run's attempts may spend in tools, in
	// milliseconds: the submission's max_execution_ms.
	MaxExecutionMS int64 `json:"max_execution_ms,omitempty" jsonschema:"minimum=1"`
	// Deadline is the run's wall-clock deadline, fixed at submit: its
	// created_at plus the submission's deadline_ms.
	Deadline  *time.Time `json:"deadline,omitempty"`
	MaxSteps  int64      `json:"max_steps,omitempty" jsonschema:"minimum=1"`
	MaxTokens int64      `json:"max_tokens,omitempty" jsonschema:"minimum=1"`
}

// BudgetUsage is what a run has used so far; it survives restarts.
type BudgetUsage struct {
	Attempts int64 `json:"attempts" jsonschema:"minimum=0"`
	// ExecutionMS is the time the run's attempts spent in tools, in whole
	// milliseconds (rounded down).
	ExecutionMS int64 `json:"execution_ms" jsonschema:"minimum=0"`
	Steps       int64 `json:"steps" jsonschema:"minimum=0"`
	Tokens      int64 `json:"tokens" jsonschema:"minimum=0"`
	// TokensUnavailable is set once a step reported no usage: from then on
	// tokens is a lower bound, never treated as complete.
	TokensUnavailable bool `json:"tokens_unavailable"`
}

// budgetView puts a run's budget on the wire in milliseconds: a limit
// rounded up (a limit under a millisecond does not read as none), what was
// used rounded down, as the evidence report does.
func budgetView(b ledger.Budget) Budget {
	return Budget{
		Limits: BudgetLimits{
			MaxAttemptsPerAction: b.Limits.MaxAttemptsPerAction,
			MaxAttemptsPerRun:    b.Limits.MaxAttemptsPerRun,
			MaxExecutionMS:       ledger.CeilMS(b.Limits.MaxExecution),
			Deadline:             b.Deadline,
			MaxSteps:             b.Limits.MaxSteps,
			MaxTokens:            b.Limits.MaxTokens,
		},
		Used: BudgetUsage{
			Attempts:          b.Used.Attempts,
			ExecutionMS:       b.Used.Execution.Milliseconds(),
			Steps:             b.Used.Steps,
			Tokens:            b.Used.Tokens,
			TokensUnavailable: b.Used.TokensUnavailable,
		},
	}
}

// SubmitResponse is the 201 answer to a submit, and byte for byte the
// answer to every replay of the same key and body: it holds only facts
// fixed when the run was accepted, so it can be rebuilt exactly.
type SubmitResponse struct {
	ID     ledger.RunID `json:"id"`
	Tenant string       `json:"tenant"`
	Agent  string       `json:"agent"`
	// State is the state at acceptance: queued, or running for an agent
	// driven by a client (the agent protocol).
	State         ledger.RunState `json:"state" jsonschema:"enum=queued,enum=running"`
	RequestDigest ledger.Digest   `json:"request_digest"`
	CreatedAt     time.Time       `json:"created_at"`
	// Links has self: /v1/runs/{id}.
	Links map[string]string `json:"links"`
}

// Run is GET /v1/runs/{run_id}: the run with its actions, attempts,
// approvals, cancellation and budget.
type Run struct {
	ID           ledger.RunID      `json:"id"`
	Tenant       string            `json:"tenant"`
	Agent        string            `json:"agent"`
	State        ledger.RunState   `json:"state"`
	StopReason   ledger.StopReason `json:"stop_reason,omitempty"`
	SubmittedBy  string            `json:"submitted_by"`
	CreatedAt    time.Time         `json:"created_at"`
	UpdatedAt    time.Time         `json:"updated_at"`
	Budget       Budget            `json:"budget"`
	Cancellation *Cancellation     `json:"cancellation,omitempty"`
	Actions      []Action          `json:"actions"`
}

// RunSummary is one row of GET /v1/runs.
type RunSummary struct {
	ID          ledger.RunID      `json:"id"`
	Tenant      string            `json:"tenant"`
	Agent       string            `json:"agent"`
	State       ledger.RunState   `json:"state"`
	StopReason  ledger.StopReason `json:"stop_reason,omitempty"`
	SubmittedBy string            `json:"submitted_by"`
	CreatedAt   time.Time         `json:"created_at"`
}

// RunList is GET /v1/runs: a page, and the cursor of the next one ("" at
// the end).
type RunList struct {
	Runs []RunSummary `json:"runs"`
	// NextCursor is passed as ?cursor= for the next page; absent on the
	// last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Action is one action with its digest, redacted arguments, attempts,
// approvals and gate (GET /v1/actions/{action_id}, and within a run).
type Action struct {
	ID          ledger.ActionID    `json:"id"`
	RunID       ledger.RunID       `json:"run_id"`
	Seq         int64              `json:"seq"`
	Tool        string             `json:"tool"`
	ToolVersion string             `json:"tool_version"`
	Effect      ledger.Effect      `json:"effect"`
	State       ledger.ActionState `json:"state"`
	// Version grows with every change of the action (state, attempts,
	// approvals): a long-poll of GET /v1/actions/{action_id} compares it.
	Version      int64         `json:"version" jsonschema:"minimum=1"`
	ActionDigest ledger.Digest `json:"action_digest"`
	// Arguments are the action's arguments, with the values at the tool's
	// secret_paths replaced by "[redacted]".
	Arguments json.RawMessage `json:"arguments"`
	DedupKey  string          `json:"dedup_key"`
	// Supersedes is the earlier action of the run this one replaced.
	Supersedes ledger.ActionID `json:"supersedes,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	Attempts   []Attempt       `json:"attempts"`
	Approvals  []Approval      `json:"approvals"`
	// Gate is what the gate decided when the action was recorded, and
	// why; absent for an action recorded before the gate was audited.
	Gate *ActionGate `json:"gate,omitempty"`
}

// ActionGate is the gate's decision on an action: the state it chose, the
// rule that chose it (nil, absent, when the default did), the reason in
// words and the digest of the rule set in force.
type ActionGate struct {
	Decision ledger.ActionState `json:"decision" jsonschema:"enum=approved,enum=awaiting_approval,enum=denied"`
	// Rule is the 0-based index of the rule that decided in the rules file
	// (the JSON Pointer /rules/N); absent when no rule matched and the
	// default decided.
	Rule *int `json:"rule,omitempty" jsonschema:"minimum=0"`
	// Reason says why, in words, e.g. "rule 2: cards.write is
	// auto-approved" or "default: write actions require approval".
	Reason string `json:"reason"`
	// RulesDigest is the sha256 of the canonical JSON (RFC 8785) of the
	// rules in force and the defaults that applied (ledger serve logs it
	// at start-up).
	RulesDigest ledger.Digest `json:"rules_digest"`
}

// Attempt keeps status (what was seen of the call) and effect (did the
// world change) as separate facts.
type Attempt struct {
	ID                ledger.AttemptID     `json:"id"`
	No                int64                `json:"attempt_no"`
	Status            ledger.AttemptStatus `json:"status"`
	Effect            ledger.EffectFact    `json:"effect"`
	EffectObservation ledger.ObservationID `json:"effect_observation_id,omitempty"`
	Error             *ledger.AttemptError `json:"error,omitempty"`
	StartedAt         time.Time            `json:"started_at"`
	FinishedAt        *time.Time           `json:"finished_at,omitempty"`
}

// Approval is one approval request and its decision.
type Approval struct {
	ID           ledger.ApprovalID    `json:"id"`
	ActionID     ledger.ActionID      `json:"action_id"`
	RunID        ledger.RunID         `json:"run_id"`
	ActionDigest ledger.Digest        `json:"action_digest"`
	State        ledger.ApprovalState `json:"state"`
	DecidedBy    string               `json:"decided_by,omitempty"`
	Reason       string               `json:"reason,omitempty"`
	RequestedAt  time.Time            `json:"requested_at"`
	ExpiresAt    *time.Time           `json:"expires_at,omitempty"`
	DecidedAt    *time.Time           `json:"decided_at,omitempty"`
	// ExecuteBy, on a granted approval, is when it stops covering a begin:
	// an attempt begun later asks for approval again.
	ExecuteBy *time.Time `json:"execute_by,omitempty"`
	// StaleAt and StaleReason, on a granted approval, say when and why it
	// stopped covering its action; a new approval was asked for then.
	StaleAt     *time.Time `json:"stale_at,omitempty"`
	StaleReason string     `json:"stale_reason,omitempty"`
}

// ApprovalList is GET /v1/approvals: a page, and the cursor of the next one
// ("" at the end).
type ApprovalList struct {
	Approvals []Approval `json:"approvals"`
	// NextCursor is passed as ?cursor= for the next page; absent on the
	// last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Cancellation shows the facts of a cancellation, each with its time:
// requested, accepted, stopping and stopped (confirmed); or too_late, when
// the run ended before the cancel took effect.
type Cancellation struct {
	// ID is the same for every repeat of the run's cancel.
	ID ledger.CancellationID `json:"id"`
	// State too_late: the run ended before the cancel took effect (a
	// cancellation an older version left unsettled); it is never
	// confirmed. Acceptance says nothing about side effects; the attempts
	// do.
	State       ledger.CancellationState `json:"state"`
	RequestedBy string                   `json:"requested_by"`
	Reason      string                   `json:"reason,omitempty"`
	RequestedAt time.Time                `json:"requested_at"`
	AcceptedAt  *time.Time               `json:"accepted_at,omitempty"`
	StoppingAt  *time.Time               `json:"stopping_at,omitempty"`
	StoppedAt   *time.Time               `json:"stopped_at,omitempty"`
	TooLateAt   *time.Time               `json:"too_late_at,omitempty"`
}

// CancelRequest is the optional body of POST /v1/runs/{run_id}/cancel.
type CancelRequest struct {
	// Reason is redacted (secret-shaped strings become
	// [redacted:<8 hex>]) before it is stored.
	Reason string `json:"reason,omitempty" jsonschema:"maxLength=1000"`
}

// DecisionRequest is the body of approve and deny.
type DecisionRequest struct {
	// ActionDigest is the digest the person saw; the decision applies only
	// if the pending approval is bound to it.
	ActionDigest ledger.Digest `json:"action_digest"`
	// Reason is redacted (secret-shaped strings become
	// [redacted:<8 hex>]) before it is stored.
	Reason string `json:"reason,omitempty" jsonschema:"maxLength=1000"`
}

// DecisionResponse is the answer to approve and deny.
type DecisionResponse struct {
	Approval Approval `json:"approval"`
	Action   Action   `json:"action"`
}

// ResolveRequest is the body of POST /v1/actions/{action_id}/resolve.
type ResolveRequest struct {
	Outcome string `json:"outcome" jsonschema:"enum=happened,enum=not_happened,enum=abandon"`
	// Note is redacted (secret-shaped strings become [redacted:<8 hex>])
	// before it is stored.
	Note string `json:"note,omitempty" jsonschema:"maxLength=2000"`
}

// TimelineEvent is one event of GET /v1/runs/{run_id}/timeline.
type TimelineEvent struct {
	Seq        int64  `json:"seq"`
	Type       string `json:"type"`
	EntityType string `json:"entity_type"`
	EntityID   string `json:"entity_id"`
	FromState  string `json:"from_state,omitempty"`
	ToState    string `json:"to_state,omitempty"`
	Actor      string `json:"actor,omitempty"`
	// Data is the event's data, redacted.
	Data      json.RawMessage `json:"data,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	Hash      string          `json:"hash"`
}

// Timeline is GET /v1/runs/{run_id}/timeline, with the chain verified.
type Timeline struct {
	// RunID is the run whose events these are.
	RunID  ledger.RunID       `json:"run_id"`
	Chain  ledger.ChainReport `json:"chain"`
	Events []TimelineEvent    `json:"events"`
}

// ResourceMetadata is the MCP endpoint's protected-resource metadata
// (RFC 9728), the answer of GET /.well-known/oauth-protected-resource/mcp.
// It names no authorization server: the tokens are the API's own.
type ResourceMetadata struct {
	// Resource is this server's /mcp.
	Resource string `json:"resource"`
	// BearerMethodsSupported is ["header"].
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceName           string   `json:"resource_name"`
}

// Status is the answer of GET /healthz and GET /readyz.
type Status struct {
	// Status is ok (healthz) or ready (readyz).
	Status string `json:"status" jsonschema:"enum=ok,enum=ready"`
	// Leases, on /readyz, is what the engine's run lease loop last did.
	Leases *LeaseLoop `json:"leases,omitempty"`
}

// LeaseLoop is the state of the engine's run leases (docs/operations.md,
// "Several processes on one database"): /readyz is not ready while the
// last claim or renewal failed.
type LeaseLoop struct {
	// Held is how many runs' leases this process holds now.
	Held int `json:"held"`
	// LastClaim and LastRenew are when a claim of runs, and a renewal of
	// the leases held, last succeeded; absent if none has yet.
	LastClaim *time.Time `json:"last_claim,omitempty"`
	LastRenew *time.Time `json:"last_renew,omitempty"`
}

// The agent protocol's wire types (docs/agent-protocol.md).

// Usage is what the model step that chose a call, or finished a run,
// consumed.
type Usage struct {
	InputTokens  int64 `json:"input_tokens" jsonschema:"minimum=0"`
	OutputTokens int64 `json:"output_tokens" jsonschema:"minimum=0"`
}

// ProposeRequest is the body of POST /v1/runs/{run_id}/actions; the
// Idempotency-Key header is the step key.
type ProposeRequest struct {
	Tool string `json:"tool" jsonschema:"minLength=1"`
	// Arguments are checked against the tool's arguments schema.
	Arguments json.RawMessage `json:"arguments" jsonschema:"type=object"`
	// Usage is what the model step that chose this call consumed; without
	// it, token accounting becomes unavailable, never zero.
	Usage *Usage `json:"usage,omitempty"`
	// Supersedes is an earlier action of the run this one replaces: it
	// becomes superseded, its pending approval invalidated.
	Supersedes ledger.ActionID `json:"supersedes,omitempty"`
}

// BeginRequest is the optional body of POST /v1/actions/{action_id}/attempts:
// {} for now, begin takes no options yet.
type BeginRequest struct{}

// BeginResponse is the 201 answer to a begin: the attempt, durable before
// the answer, its secret token, and what to execute.
type BeginResponse struct {
	Attempt Attempt `json:"attempt"`
	// AttemptToken is secret: shown here only, stored hashed.
	AttemptToken string `json:"attempt_token"`
	DedupKey     string `json:"dedup_key"`
	// Arguments are the canonical, approved arguments: execute exactly
	// these.
	Arguments    json.RawMessage `json:"arguments"`
	ActionDigest ledger.Digest   `json:"action_digest"`
	// LeaseRemainingS is the seconds left on the lease, by the server's
	// clock.
	LeaseRemainingS float64 `json:"lease_remaining_s" jsonschema:"minimum=0"`
}

// HeartbeatRequest is the body of POST /v1/attempts/{attempt_id}/heartbeat.
type HeartbeatRequest struct {
	AttemptToken string `json:"attempt_token"`
	// Progress is any JSON; stored redacted.
	Progress json.RawMessage `json:"progress,omitempty"`
}

// HeartbeatResponse is the answer to a heartbeat.
type HeartbeatResponse struct {
	// LeaseRemainingS is the seconds left on the lease, by the server's
	// clock.
	LeaseRemainingS float64 `json:"lease_remaining_s" jsonschema:"minimum=0"`
	// CancelRequested is set once the run's cancel was accepted: stop the
	// call if the tool can, and report what happened.
	CancelRequested bool `json:"cancel_requested"`
}

// Outcome is an attempt's outcome as recorded (a problem's recorded).
type Outcome struct {
	Status ledger.AttemptStatus `json:"status"`
	Effect ledger.EffectFact    `json:"effect,omitempty"`
	// Output is what the tool answered, redacted.
	Output json.RawMessage      `json:"output,omitempty"`
	Error  *ledger.AttemptError `json:"error,omitempty"`
}

// CompleteRequest is the body of POST /v1/attempts/{attempt_id}/complete.
// The outcomes a tool may report are listed in docs/agent-protocol.md; any
// other is 422 outcome_not_allowed.
type CompleteRequest struct {
	AttemptToken string               `json:"attempt_token"`
	Status       ledger.AttemptStatus `json:"status" jsonschema:"enum=succeeded,enum=failed,enum=timed_out,enum=cancelled"`
	// Effect is required for a write, absent for a read.
	Effect ledger.EffectFact `json:"effect,omitempty"`
	// Output is what the tool answered; stored redacted.
	Output json.RawMessage      `json:"output,omitempty"`
	Error  *ledger.AttemptError `json:"error,omitempty"`
}

// CompleteResponse is the answer to a complete and to an abandon.
type CompleteResponse struct {
	Attempt Attempt `json:"attempt"`
	Action  Action  `json:"action"`
}

// AbandonRequest is the optional body of POST
// /v1/attempts/{attempt_id}/abandon.
type AbandonRequest struct {
	// Reason is redacted before it is stored.
	Reason string `json:"reason,omitempty" jsonschema:"maxLength=1000"`
}

// ObservationRequest is the body of POST
// /v1/attempts/{attempt_id}/observations: a query's effect or a cancel's
// confirmation, or the error the tool answered either with: a query
// carries effect or error, a cancel confirmed or error.
type ObservationRequest struct {
	// DecisionID is the decision_id of the directive this answers.
	DecisionID string `json:"decision_id" jsonschema:"minLength=1"`
	Kind       string `json:"kind" jsonschema:"enum=query,enum=cancel"`
	// Effect is a query's answer.
	Effect ledger.EffectFact `json:"effect,omitempty"`
	// Confirmed is a cancel's answer: the call will not take effect.
	Confirmed *bool `json:"confirmed,omitempty"`
	// Detail is any JSON the tool said; stored redacted.
	Detail json.RawMessage      `json:"detail,omitempty"`
	Error  *ledger.AttemptError `json:"error,omitempty"`
}

// Observation is evidence about an attempt's effect.
type Observation struct {
	ID        ledger.ObservationID     `json:"id"`
	RunID     ledger.RunID             `json:"run_id"`
	ActionID  ledger.ActionID          `json:"action_id"`
	AttemptID ledger.AttemptID         `json:"attempt_id,omitempty"`
	Source    ledger.ObservationSource `json:"source"`
	Effect    ledger.EffectFact        `json:"effect"`
	// Detail is what the tool or person said, redacted.
	Detail     json.RawMessage `json:"detail,omitempty"`
	ObservedAt time.Time       `json:"observed_at"`
}

// ObservationResponse is the 201 answer to an observation: what was
// recorded, and what /next says now.
type ObservationResponse struct {
	Observation Observation `json:"observation"`
	Next        []Directive `json:"next"`
}

// Directive is one thing a run's agent must do (GET /v1/runs/{run_id}/next).
type Directive struct {
	Directive string `json:"directive" jsonschema:"enum=propose,enum=wait_approval,enum=execute,enum=in_flight,enum=query,enum=resend,enum=cancel,enum=review,enum=stop"`
	// DecisionID names the facts the directive rests on; it changes when
	// they change.
	DecisionID string           `json:"decision_id,omitempty"`
	ActionID   ledger.ActionID  `json:"action_id,omitempty"`
	AttemptID  ledger.AttemptID `json:"attempt_id,omitempty"`
	Tool       string           `json:"tool,omitempty"`
	DedupKey   string           `json:"dedup_key,omitempty"`
	// LeaseRemainingS is set for in_flight: the open attempt's lease
	// left, in seconds.
	LeaseRemainingS *float64          `json:"lease_remaining_s,omitempty" jsonschema:"minimum=0"`
	StopReason      ledger.StopReason `json:"stop_reason,omitempty"`
	Rationale       string            `json:"rationale,omitempty"`
}

// NextResponse is GET /v1/runs/{run_id}/next.
type NextResponse struct {
	RunID      ledger.RunID      `json:"run_id"`
	RunState   ledger.RunState   `json:"run_state"`
	StopReason ledger.StopReason `json:"stop_reason,omitempty"`
	Directives []Directive       `json:"directives" jsonschema:"minItems=1"`
}

// FinishRequest is the body of POST /v1/runs/{run_id}/finish.
type FinishRequest struct {
	Outcome string `json:"outcome" jsonschema:"enum=completed,enum=failed"`
	// StopReason is for failed only: provider_error, tool_error,
	// invalid_model_response or internal_error (the default).
	StopReason ledger.StopReason `json:"stop_reason,omitempty" jsonschema:"enum=provider_error,enum=tool_error,enum=invalid_model_response,enum=internal_error"`
	// Output is the run's answer; stored redacted.
	Output json.RawMessage `json:"output,omitempty"`
	// Usage is what the model step that finished the run consumed.
	Usage *Usage `json:"usage,omitempty"`
}
