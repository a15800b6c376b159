package server

import (
	"encoding/json"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// The wire types of HTTP API v1 (docs/api.md). The server encodes
// them and the CLI decodes them: field names are the contract outside
// clients rely on, so change them only with the design.

// Problem is an RFC 9457 problem document with the stable code clients
// branch on.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
	// Instance names this occurrence: ProblemInstancePrefix and the
	// request's id (the X-Request-ID of the answer), which every log line
	// about the request carries too.
	Instance string `json:"instance,omitempty"`
	// Errors lists schema validation failures, when there are any; for
	// invalid_arguments, the arguments' failures under /arguments.
	Errors []FieldError `json:"errors,omitempty"`
	// Action is the recorded action of a step_key_reused.
	Action *Action `json:"action,omitempty"`
	// Recorded is the outcome as recorded, of an outcome_conflict.
	Recorded *Outcome `json:"recorded,omitempty"`
	// StopReason is why the run stopped, of a run_stopped.
	StopReason ledger.StopReason `json:"stop_reason,omitempty"`
}

// FieldError is one failing location of a request body (a JSON pointer).
type FieldError struct {
	Location string `json:"location"`
	Message  string `json:"message"`
}

// SubmitRequest is the body of POST /v1/runs; it must also pass the
// contracts run_submission schema (unknown and server-owned fields refused).
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

// SubmitResponse is the 201 answer to a submit, and byte for byte the
// answer to every replay of the same key and body: it holds only facts
// fixed when the run was accepted, so it can be rebuilt exactly.
type SubmitResponse struct {
	ID            ledger.RunID      `json:"id"`
	Tenant        string            `json:"tenant"`
	Agent         string            `json:"agent"`
	State         ledger.RunState   `json:"state"` // always "queued": the state at acceptance
	RequestDigest ledger.Digest     `json:"request_digest"`
	CreatedAt     time.Time         `json:"created_at"`
	Links         map[string]string `json:"links"` // "self": /v1/runs/{id}
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
	Budget       ledger.Budget     `json:"budget"`
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
	Runs       []RunSummary `json:"runs"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// Action is one action with its digest, redacted arguments, attempts,
// approvals and gate (GET /v1/actions/{action_id}, and within a run).
type Action struct {
	ID           ledger.ActionID    `json:"id"`
	RunID        ledger.RunID       `json:"run_id"`
	Seq          int64              `json:"seq"`
	Tool         string             `json:"tool"`
	ToolVersion  string             `json:"tool_version"`
	Effect       ledger.Effect      `json:"effect"`
	State        ledger.ActionState `json:"state"`
	Version      int64              `json:"version"` // grows with every change; a long-poll compares it
	ActionDigest ledger.Digest      `json:"action_digest"`
	Arguments    json.RawMessage    `json:"arguments"`
	DedupKey     string             `json:"dedup_key"`
	Supersedes   ledger.ActionID    `json:"supersedes,omitempty"`
	CreatedAt    time.Time          `json:"created_at"`
	Attempts     []Attempt          `json:"attempts"`
	Approvals    []Approval         `json:"approvals"`
	// Gate is what the gate decided and why; nil (absent) for an action
	// recorded before the gate was audited.
	Gate *ActionGate `json:"gate,omitempty"`
}

// ActionGate is the gate's decision on an action: the state it chose, the
// rule that chose it (nil, absent, when the default did), the reason in
// words and the digest of the rule set in force.
type ActionGate struct {
	Decision    ledger.ActionState `json:"decision"`
	Rule        *int               `json:"rule,omitempty"`
	Reason      string             `json:"reason"`
	RulesDigest ledger.Digest      `json:"rules_digest"`
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
}

// ApprovalList is GET /v1/approvals: a page, and the cursor of the next one
// ("" at the end).
type ApprovalList struct {
	Approvals  []Approval `json:"approvals"`
	NextCursor string     `json:"next_cursor,omitempty"`
}

// Cancellation shows the facts of a cancellation, each with its time:
// requested, accepted, stopping and stopped (confirmed); or too_late, when
// the run ended before the cancel took effect.
type Cancellation struct {
	// ID is the same for every repeat of a run's cancel.
	ID          ledger.CancellationID    `json:"id"`
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
	Reason string `json:"reason,omitempty"`
}

// DecisionRequest is the body of approve and deny.
type DecisionRequest struct {
	ActionDigest ledger.Digest `json:"action_digest"`
	Reason       string        `json:"reason,omitempty"`
}

// DecisionResponse is the answer to approve and deny.
type DecisionResponse struct {
	Approval Approval `json:"approval"`
	Action   Action   `json:"action"`
}

// ResolveRequest is the body of POST /v1/actions/{action_id}/resolve.
type ResolveRequest struct {
	Outcome string `json:"outcome"` // happened | not_happened | abandon
	Note    string `json:"note,omitempty"`
}

// TimelineEvent is one event of GET /v1/runs/{run_id}/timeline.
type TimelineEvent struct {
	Seq        int64           `json:"seq"`
	Type       string          `json:"type"`
	EntityType string          `json:"entity_type"`
	EntityID   string          `json:"entity_id"`
	FromState  string          `json:"from_state,omitempty"`
	ToState    string          `json:"to_state,omitempty"`
	Actor      string          `json:"actor,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	Hash       string          `json:"hash"`
}

// Timeline is GET /v1/runs/{run_id}/timeline, with the chain verified.
type Timeline struct {
	RunID  ledger.RunID       `json:"run_id"`
	Chain  ledger.ChainReport `json:"chain"`
	Events []TimelineEvent    `json:"events"`
}

// The agent protocol's wire types (docs/agent-protocol.md).

// Usage is what the model step that chose a call, or finished a run,
// consumed.
type Usage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// ProposeRequest is the body of POST /v1/runs/{run_id}/actions; the
// Idempotency-Key header is the step key.
type ProposeRequest struct {
	Tool       string          `json:"tool"`
	Arguments  json.RawMessage `json:"arguments"`
	Usage      *Usage          `json:"usage,omitempty"`
	Supersedes ledger.ActionID `json:"supersedes,omitempty"`
}

// BeginRequest is the optional body of POST /v1/actions/{action_id}/attempts:
// {} for now.
type BeginRequest struct{}

// BeginResponse is the 201 answer to a begin: the attempt, durable before
// the answer, its secret token, and what to execute.
type BeginResponse struct {
	Attempt      Attempt         `json:"attempt"`
	AttemptToken string          `json:"attempt_token"`
	DedupKey     string          `json:"dedup_key"`
	Arguments    json.RawMessage `json:"arguments"`
	ActionDigest ledger.Digest   `json:"action_digest"`
	// LeaseRemainingS is the lease left, in seconds.
	LeaseRemainingS float64 `json:"lease_remaining_s"`
}

// HeartbeatRequest is the body of POST /v1/attempts/{attempt_id}/heartbeat.
type HeartbeatRequest struct {
	AttemptToken string          `json:"attempt_token"`
	Progress     json.RawMessage `json:"progress,omitempty"`
}

// HeartbeatResponse is the answer to a heartbeat.
type HeartbeatResponse struct {
	LeaseRemainingS float64 `json:"lease_remaining_s"`
	CancelRequested bool    `json:"cancel_requested"`
}

// Outcome is an attempt's outcome as recorded (a problem's recorded).
type Outcome struct {
	Status ledger.AttemptStatus `json:"status"`
	Effect ledger.EffectFact    `json:"effect,omitempty"`
	Output json.RawMessage      `json:"output,omitempty"`
	Error  *ledger.AttemptError `json:"error,omitempty"`
}

// CompleteRequest is the body of POST /v1/attempts/{attempt_id}/complete.
type CompleteRequest struct {
	AttemptToken string               `json:"attempt_token"`
	Status       ledger.AttemptStatus `json:"status"`
	Effect       ledger.EffectFact    `json:"effect,omitempty"`
	Output       json.RawMessage      `json:"output,omitempty"`
	Error        *ledger.AttemptError `json:"error,omitempty"`
}

// CompleteResponse is the answer to a complete and to an abandon.
type CompleteResponse struct {
	Attempt Attempt `json:"attempt"`
	Action  Action  `json:"action"`
}

// AbandonRequest is the optional body of POST
// /v1/attempts/{attempt_id}/abandon.
type AbandonRequest struct {
	Reason string `json:"reason,omitempty"`
}

// ObservationRequest is the body of POST
// /v1/attempts/{attempt_id}/observations: a query's effect or a cancel's
// confirmation, or the error the tool answered either with.
type ObservationRequest struct {
	DecisionID string               `json:"decision_id"`
	Kind       string               `json:"kind"`
	Effect     ledger.EffectFact    `json:"effect,omitempty"`
	Confirmed  *bool                `json:"confirmed,omitempty"`
	Detail     json.RawMessage      `json:"detail,omitempty"`
	Error      *ledger.AttemptError `json:"error,omitempty"`
}

// Observation is evidence about an attempt's effect.
type Observation struct {
	ID         ledger.ObservationID     `json:"id"`
	RunID      ledger.RunID             `json:"run_id"`
	ActionID   ledger.ActionID          `json:"action_id"`
	AttemptID  ledger.AttemptID         `json:"attempt_id,omitempty"`
	Source     ledger.ObservationSource `json:"source"`
	Effect     ledger.EffectFact        `json:"effect"`
	Detail     json.RawMessage          `json:"detail,omitempty"`
	ObservedAt time.Time                `json:"observed_at"`
}

// ObservationResponse is the 201 answer to an observation: what was
// recorded, and what /next says now.
type ObservationResponse struct {
	Observation Observation `json:"observation"`
	Next        []Directive `json:"next"`
}

// Directive is one thing a run's agent must do (GET /v1/runs/{run_id}/next).
type Directive struct {
	Directive  string           `json:"directive"`
	DecisionID string           `json:"decision_id,omitempty"`
	ActionID   ledger.ActionID  `json:"action_id,omitempty"`
	AttemptID  ledger.AttemptID `json:"attempt_id,omitempty"`
	Tool       string           `json:"tool,omitempty"`
	DedupKey   string           `json:"dedup_key,omitempty"`
	// LeaseRemainingS is set for in_flight: the open attempt's lease
	// left, in seconds.
	LeaseRemainingS *float64          `json:"lease_remaining_s,omitempty"`
	StopReason      ledger.StopReason `json:"stop_reason,omitempty"`
	Rationale       string            `json:"rationale,omitempty"`
}

// NextResponse is GET /v1/runs/{run_id}/next.
type NextResponse struct {
	RunID      ledger.RunID      `json:"run_id"`
	RunState   ledger.RunState   `json:"run_state"`
	StopReason ledger.StopReason `json:"stop_reason,omitempty"`
	Directives []Directive       `json:"directives"`
}

// FinishRequest is the body of POST /v1/runs/{run_id}/finish.
type FinishRequest struct {
	Outcome    string            `json:"outcome"`
	StopReason ledger.StopReason `json:"stop_reason,omitempty"`
	Output     json.RawMessage   `json:"output,omitempty"`
	Usage      *Usage            `json:"usage,omitempty"`
}
