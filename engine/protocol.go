package engine

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// The agent protocol (docs/agent-protocol.md): a client-driven run's agent
// proposes each tool call, begins an attempt before it calls its tool,
// heartbeats while the call runs, completes it with what happened, and
// after a crash asks Next what is safe. Each method is one step of that
// protocol, checked against the ledger's rules and recorded in the store;
// the server maps ProtocolError codes to HTTP statuses.

// Caller is who makes a protocol call: the tenant it acts in, its
// principal, and whether it may drive a given run (its role and agent
// binding, the server's to judge). A run of another tenant, or one the
// caller may not drive, is ledger.CodeNotFound, so ids leak nothing.
type Caller struct {
	Tenant    string
	Principal string
	MayDrive  func(run *ledger.Run) bool
}

// Protocol error codes (ProtocolError.Code): stable, and the `code` of the
// problem document the server answers with.
const (
	CodeNotClientDriven = "not_client_driven"
	CodeUnknownTool     = "unknown_tool"
	CodeToolNotAllowed  = "tool_not_allowed"
	CodeInvalidArgs     = "invalid_arguments"
	CodeStepKeyReused   = "step_key_reused"
	CodeActionInDoubt   = "action_in_doubt"
	CodeRunStopped      = "run_stopped"
	CodeRunCancelled    = "run_cancelled"
	CodeNotApproved     = "not_approved"
	CodeApprovalStale   = "approval_stale"
	CodeAttemptOpen     = "attempt_open"
	CodeAttemptClosed   = "attempt_closed"
	CodeBadToken        = "bad_attempt_token"
	CodeOutcomeConflict = "outcome_conflict"
	CodeOutcomeInvalid  = "outcome_not_allowed"
	CodeStaleDecision   = "stale_decision"
	CodeFinishInvalid   = "invalid_finish"
	// CodeCannotSupersede: the action named by supersedes is of another
	// run of the tenant, or has begun, or is settled or superseded.
	CodeCannotSupersede = "cannot_supersede"
	// CodePendingCap: the proposal would wait for approval while its run
	// has one pending already and the tenant is at its cap of pending
	// approvals (ProposeParams.MaxPendingApprovals).
	CodePendingCap = "too_many_pending_approvals"
)

// ProtocolError is a protocol step the ledger refused, with a stable code
// and, for some codes, the recorded fact the caller clashed with. Nothing
// was changed by the refused step (a late outcome aside, which is kept as
// evidence: see Complete).
type ProtocolError struct {
	Code    string
	Message string
	// Action is the recorded action (step_key_reused).
	Action *ledger.Action
	// Recorded is the outcome as recorded (outcome_conflict).
	Recorded *Outcome
	// StopReason is why the run stopped (run_stopped).
	StopReason ledger.StopReason
	// Issues are the arguments' schema failures (invalid_arguments).
	Issues []contracts.Issue
}

// Error implements error.
func (e *ProtocolError) Error() string { return e.Code + ": " + e.Message }

func protoErr(code, format string, args ...any) *ProtocolError {
	return &ProtocolError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ProposeParams is a client's proposal of one tool call.
type ProposeParams struct {
	Caller Caller
	RunID  ledger.RunID
	// StepKey is the agent's idempotency key of the step: (run, step key)
	// is one proposal, whoever presents it.
	StepKey   string
	Tool      string
	Arguments json.RawMessage
	// Usage is the model step's usage; nil marks token accounting
	// unavailable.
	Usage      *Usage
	Supersedes ledger.ActionID
	// MaxPendingApprovals, if positive, caps the tenant's pending
	// approvals and live runs for a proposal that would wait for approval
	// while its run has one pending already (CodePendingCap).
	MaxPendingApprovals int
}

// ProposeResult is the recorded action, the approval it waits for (if
// any), and whether the step key had been seen with this body before.
type ProposeResult struct {
	Action   *ledger.Action
	Approval *ledger.Approval
	Replayed bool
}

// BeginParams begins an attempt of an approved action.
type BeginParams struct {
	Caller   Caller
	ActionID ledger.ActionID
	// Key is the begin's idempotency key: a replay returns the same
	// attempt and token.
	Key string
}

// BeginResult is the attempt begun (durably, before the answer), its
// secret token and the lease left.
type BeginResult struct {
	Attempt        *ledger.Attempt
	Action         *ledger.Action
	Token          string
	LeaseRemaining time.Duration
	Replayed       bool
}

// HeartbeatParams renews an attempt's lease.
type HeartbeatParams struct {
	Caller    Caller
	AttemptID ledger.AttemptID
	Token     string
	// Progress is stored redacted; nil keeps the last.
	Progress json.RawMessage
}

// HeartbeatResult is the lease left and whether the run's cancel was
// accepted (the agent should stop the call if its tool can).
type HeartbeatResult struct {
	LeaseRemaining  time.Duration
	CancelRequested bool
}

// Outcome is what a client reports of a call.
type Outcome struct {
	Status ledger.AttemptStatus `json:"status"`
	Effect ledger.EffectFact    `json:"effect,omitempty"`
	Output json.RawMessage      `json:"output,omitempty"`
	Error  *ledger.AttemptError `json:"error,omitempty"`
}

// CompleteParams reports an attempt's outcome.
type CompleteParams struct {
	Caller    Caller
	AttemptID ledger.AttemptID
	Token     string
	Outcome   Outcome
}

// CompleteResult is the attempt and action after a complete or an
// abandon.
type CompleteResult struct {
	Attempt  *ledger.Attempt
	Action   *ledger.Action
	Replayed bool
}

// AbandonParams closes an attempt whose call the agent lost.
type AbandonParams struct {
	Caller    Caller
	AttemptID ledger.AttemptID
	Reason    string
}

// ObservationKind is what the agent asked its tool: query or cancel.
type ObservationKind string

// Observation kinds.
const (
	ObserveQuery  ObservationKind = "query"
	ObserveCancel ObservationKind = "cancel"
)

// ObserveParams is what the agent learned from its tool about a dedup key,
// in answer to the directive DecisionID.
type ObserveParams struct {
	Caller     Caller
	AttemptID  ledger.AttemptID
	DecisionID string
	Kind       ObservationKind
	// Effect answers a query (happened, not_happened, unknown).
	Effect ledger.EffectFact
	// Confirmed answers a cancel.
	Confirmed bool
	Detail    json.RawMessage
	// Error is a query or cancel that failed: never an answer.
	Error *ledger.AttemptError
}

// ObserveResult is the recorded observation and what the agent must do
// now.
type ObserveResult struct {
	Observation *ledger.Observation
	Next        []Directive
}

// DirectiveKind is what /next tells the agent to do about one action.
type DirectiveKind string

// Directives.
const (
	DirectivePropose      DirectiveKind = "propose"
	DirectiveWaitApproval DirectiveKind = "wait_approval"
	DirectiveExecute      DirectiveKind = "execute"
	DirectiveInFlight     DirectiveKind = "in_flight"
	DirectiveQuery        DirectiveKind = "query"
	DirectiveResend       DirectiveKind = "resend"
	DirectiveCancel       DirectiveKind = "cancel"
	DirectiveReview       DirectiveKind = "review"
	DirectiveStop         DirectiveKind = "stop"
)

// Directive is one thing the agent must do, with the decision it rests on.
type Directive struct {
	Kind DirectiveKind
	// DecisionID names the facts the directive rests on; it changes when
	// they change. An observation answering another id is stale.
	DecisionID     string
	ActionID       ledger.ActionID
	AttemptID      ledger.AttemptID
	Tool           string
	DedupKey       string
	LeaseRemaining time.Duration
	StopReason     ledger.StopReason
	Rationale      string
}

// NextResult is the run as it stands and one directive per non-terminal
// action (or one propose, or one stop).
type NextResult struct {
	Run        *ledger.Run
	Directives []Directive
}

// FinishParams ends a client-driven run.
type FinishParams struct {
	Caller Caller
	RunID  ledger.RunID
	// Outcome is "completed" or "failed".
	Outcome    string
	StopReason ledger.StopReason
	Output     json.RawMessage
	Usage      *Usage
}
