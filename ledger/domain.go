package ledger

import (
	"encoding/json"
	"time"

	"github.com/actionledger/ledger/contracts"
)

// Effect says whether a tool only reads or changes the world; it is the
// tool descriptor's effect (package contracts).
type Effect = contracts.Effect

// Tool effects.
const (
	EffectRead  = contracts.EffectRead
	EffectWrite = contracts.EffectWrite
)

// Run is one agent run, submitted once per (tenant, idempotency key).
type Run struct {
	ID             RunID           `json:"id"`
	Tenant         string          `json:"tenant"`
	IdempotencyKey string          `json:"idempotency_key"`
	RequestDigest  Digest          `json:"request_digest"`
	SubmittedBy    string          `json:"submitted_by"`
	Agent          string          `json:"agent"`
	Input          json.RawMessage `json:"input"`
	State          RunState        `json:"state"`
	StopReason     StopReason      `json:"stop_reason,omitempty"`
	Budget         Budget          `json:"budget"`
	Version        int64           `json:"version"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	// EventSeq and EventHash are the head of the run's event chain; keeping
	// the head on the run lets Verify notice a truncated tail.
	EventSeq  int64  `json:"event_seq"`
	EventHash string `json:"event_hash"`
}

// Action is one tool call a model proposed. Its tool, version, effect and
// arguments never change once recorded, so neither does its digest.
type Action struct {
	ID             ActionID        `json:"id"`
	RunID          RunID           `json:"run_id"`
	Tenant         string          `json:"tenant"`
	Seq            int64           `json:"seq"`
	IdempotencyKey string          `json:"idempotency_key"`
	Tool           string          `json:"tool"`
	ToolVersion    string          `json:"tool_version"`
	Effect         Effect          `json:"effect"`
	Arguments      json.RawMessage `json:"arguments"`
	ActionDigest   Digest          `json:"action_digest"`
	// DedupKey is what the tool receives on every attempt of this action:
	// <run_id>/<action_id>, never per attempt.
	DedupKey     string      `json:"dedup_key"`
	Supersedes   ActionID    `json:"supersedes,omitempty"`
	State        ActionState `json:"state"`
	AttemptCount int64       `json:"attempt_count"`
	Version      int64       `json:"version"`
	CreatedAt    time.Time   `json:"created_at"`
	UpdatedAt    time.Time   `json:"updated_at"`
	// Gate is what the gate decided when the action was recorded, and why;
	// nil for an action recorded before the gate was audited, or without
	// an audit (CreateActionParams.GateAudit).
	Gate *ActionGate `json:"gate,omitempty"`
}

// ActionGate is the gate's decision on an action as the ledger recorded
// it: the state the action entered from proposed, the rule that decided,
// the reason in words and the digest of the rule set in force. It never
// changes once recorded.
type ActionGate struct {
	// Decision is approved, awaiting_approval or denied.
	Decision ActionState `json:"decision"`
	// Rule is the 0-based index of the rule that decided in the rules file,
	// or -1 when no rule matched and the default decided.
	Rule        int    `json:"rule"`
	Reason      string `json:"reason"`
	RulesDigest Digest `json:"rules_digest"`
}

// DedupKeyFor returns the stable dedup key of an action.
func DedupKeyFor(run RunID, action ActionID) string { return string(run) + "/" + string(action) }

// AttemptError is the stable form of an error persisted on an attempt.
type AttemptError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Attempt is one try at executing an action, recorded before the tool is
// called. Status is what was seen of the call; Effect is whether the world
// changed, with the observation that established it.
type Attempt struct {
	ID       AttemptID     `json:"id"`
	ActionID ActionID      `json:"action_id"`
	RunID    RunID         `json:"run_id"`
	No       int64         `json:"attempt_no"`
	Status   AttemptStatus `json:"status"`
	Effect   EffectFact    `json:"effect"`
	// EffectObservation is the observation that established Effect; empty
	// while Effect is unknown.
	EffectObservation ObservationID   `json:"effect_observation_id,omitempty"`
	Result            json.RawMessage `json:"result,omitempty"`
	Error             *AttemptError   `json:"error,omitempty"`
	Version           int64           `json:"version"`
	StartedAt         time.Time       `json:"started_at"`
	FinishedAt        *time.Time      `json:"finished_at,omitempty"`
}

// Approval is a request for a person to allow one action digest.
type Approval struct {
	ID           ApprovalID    `json:"id"`
	ActionID     ActionID      `json:"action_id"`
	RunID        RunID         `json:"run_id"`
	Tenant       string        `json:"tenant"`
	ActionDigest Digest        `json:"action_digest"`
	State        ApprovalState `json:"state"`
	DecidedBy    string        `json:"decided_by,omitempty"`
	Reason       string        `json:"reason,omitempty"`
	Version      int64         `json:"version"`
	RequestedAt  time.Time     `json:"requested_at"`
	ExpiresAt    *time.Time    `json:"expires_at,omitempty"`
	DecidedAt    *time.Time    `json:"decided_at,omitempty"`
	// ExecuteBy, on a granted approval, is when it stops covering a begin:
	// an attempt begun at or after it needs a new approval. Nil for an
	// approval granted without one (DecideApprovalParams.ExecuteWithin 0)
	// and for every approval not granted.
	ExecuteBy *time.Time `json:"execute_by,omitempty"`
	// StaleAt and StaleReason, on a granted approval, say when and why it
	// stopped covering its action (ReaskApproval): a begin came after its
	// ExecuteBy, or the action had to be asked for again. Nil and "" while
	// it covers it.
	StaleAt     *time.Time `json:"stale_at,omitempty"`
	StaleReason string     `json:"stale_reason,omitempty"`
}

// Cancellation is a run's cancellation; each step is a separate fact with its
// own time. It says nothing about side effects: attempts do.
type Cancellation struct {
	ID          CancellationID    `json:"id"`
	RunID       RunID             `json:"run_id"`
	Tenant      string            `json:"tenant"`
	State       CancellationState `json:"state"`
	RequestedBy string            `json:"requested_by"`
	Reason      string            `json:"reason,omitempty"`
	Version     int64             `json:"version"`
	RequestedAt time.Time         `json:"requested_at"`
	AcceptedAt  *time.Time        `json:"accepted_at,omitempty"`
	StoppingAt  *time.Time        `json:"stopping_at,omitempty"`
	StoppedAt   *time.Time        `json:"stopped_at,omitempty"`
	// TooLateAt is when the cancellation was found too late: its run had
	// ended before the cancel took effect.
	TooLateAt *time.Time `json:"too_late_at,omitempty"`
}

// ObservationSource names where tool-side evidence came from.
type ObservationSource string

// Observation sources.
const (
	ObservedResult ObservationSource = "tool_result" // the tool's own answer to Execute
	ObservedQuery  ObservationSource = "tool_query"  // a query by dedup key
	ObservedCancel ObservationSource = "tool_cancel" // the tool's answer to Cancel
	ObservedPerson ObservationSource = "person"      // a person settling a review
	// ObservedLate is an outcome a client reported after its attempt's
	// lease lapsed or recovery moved on: kept as evidence, and a happened
	// in it counts as a query's answer.
	ObservedLate ObservationSource = "late_outcome"
	// ObservedStaleHolder is the outcome of a tool call that reached the
	// engine's worker after it lost its run's lease (runleases.go): kept as
	// evidence for the new holder's recovery, an established effect in it
	// written on the attempt, instead of finishing the attempt.
	ObservedStaleHolder ObservationSource = "stale_holder"
	// ObservedDelivered records that a front end handed the attempt's
	// recorded outcome to the caller it ran the tool for (the MCP
	// gateway); it says nothing of the effect (always unknown). A call
	// repeated after a crash joins an action whose outcome was never
	// delivered instead of making the call again.
	ObservedDelivered ObservationSource = "delivered"
)

// Valid reports whether s is a known source.
func (s ObservationSource) Valid() bool {
	switch s {
	case ObservedResult, ObservedQuery, ObservedCancel, ObservedPerson, ObservedLate, ObservedStaleHolder, ObservedDelivered:
		return true
	}
	return false
}

// Observation is tool-side (or human) evidence about an attempt's effect.
// Observations are append-only.
type Observation struct {
	ID         ObservationID     `json:"id"`
	RunID      RunID             `json:"run_id"`
	ActionID   ActionID          `json:"action_id"`
	AttemptID  AttemptID         `json:"attempt_id,omitempty"`
	Source     ObservationSource `json:"source"`
	Effect     EffectFact        `json:"effect"`
	Detail     json.RawMessage   `json:"detail,omitempty"`
	ObservedAt time.Time         `json:"observed_at"`
}

// BudgetLimits are the limits a submission asks for; zero means "no
// limit". They are part of the request, so they hold only relative values:
// a replay of the same request must have the same digest.
type BudgetLimits struct {
	MaxAttemptsPerAction int64         `json:"max_attempts_per_action,omitempty"`
	MaxAttemptsPerRun    int64         `json:"max_attempts_per_run,omitempty"`
	MaxExecution         time.Duration `json:"max_execution,omitempty"`
	MaxSteps             int64         `json:"max_steps,omitempty"`
	MaxTokens            int64         `json:"max_tokens,omitempty"`
	// DeadlineAfter fixes the run's wall-clock deadline at submit time plus
	// this much (Budget.Deadline); 0 for none.
	DeadlineAfter time.Duration `json:"deadline_after,omitempty"`
}

// BudgetUsage is what a run has used; persisted, never reset by a restart.
type BudgetUsage struct {
	Attempts  int64         `json:"attempts"`
	Execution time.Duration `json:"execution"`
	Steps     int64         `json:"steps"`
	Tokens    int64         `json:"tokens"`
	// TokensUnavailable is set once a step reported no usage: from then on
	// the token count is a lower bound, never treated as complete.
	TokensUnavailable bool `json:"tokens_unavailable"`
}

// Budget is a run's limits and usage.
type Budget struct {
	Limits BudgetLimits `json:"limits"`
	// Deadline is the wall-clock deadline fixed at submit; nil for none.
	Deadline *time.Time  `json:"deadline,omitempty"`
	Used     BudgetUsage `json:"used"`
}

// Event is one entry of a run's append-only, hash-chained log. Every
// transition writes its event in the same transaction.
type Event struct {
	ID         EventID         `json:"id"`
	RunID      RunID           `json:"run_id"`
	Seq        int64           `json:"seq"`
	Type       string          `json:"type"`
	EntityType string          `json:"entity_type"`
	EntityID   string          `json:"entity_id"`
	FromState  string          `json:"from_state,omitempty"`
	ToState    string          `json:"to_state,omitempty"`
	Actor      string          `json:"actor,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	PrevHash   string          `json:"prev_hash"`
	Hash       string          `json:"hash"`
	// Format is how Hash is computed: 1 (or 0) for events written before
	// rows were bound into the chain, whose Data is hashed inline; 2 since,
	// whose hash covers the digest of Data and Rows instead, so that a
	// report that redacts Data can still be checked against it.
	Format int `json:"format"`
	// Rows, format 2 only, is the canonical JSON object of the rows this
	// event's write left changed: RowKey ("<entity>/<id>") → the digest of
	// the row's content after the write (content.go); nil if none.
	Rows json.RawMessage `json:"rows,omitempty"`
	// DataDigest stands in for Data in a format 2 hash when Data itself is
	// not known (a report that redacted part of it): its tree digest
	// (DocDigest); ignored when Data is set.
	DataDigest Digest `json:"-"`
}
