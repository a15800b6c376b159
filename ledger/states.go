package ledger

import "slices"

// RunState is the state of a run. The same strings appear in the CHECK
// constraint of the runs table.
type RunState string

// Run states.
const (
	RunQueued           RunState = "queued"            // submitted, no step taken yet
	RunRunning          RunState = "running"           // a worker may take the next step
	RunAwaitingApproval RunState = "awaiting_approval" // an action waits for a person; no goroutine held
	RunNeedsReview      RunState = "needs_review"      // an effect is unknown; a person decides
	RunStopping         RunState = "stopping"          // cancel accepted; waiting for in-flight attempts
	RunCompleted        RunState = "completed"         // terminal: the agent gave its final answer
	RunStopped          RunState = "stopped"           // terminal: a person, a policy or a budget stopped it
	RunFailed           RunState = "failed"            // terminal: an error ended it
)

// ActionState is the state of an action.
type ActionState string

// Action states. Superseded is ours, beyond the core machine: an action that
// a model re-proposed with other arguments; its pending approval becomes
// invalidated. Denied is also reached from proposed when a rule denies.
const (
	ActionProposed         ActionState = "proposed"
	ActionAwaitingApproval ActionState = "awaiting_approval"
	ActionApproved         ActionState = "approved"
	ActionRunning          ActionState = "running"
	ActionSucceeded        ActionState = "succeeded"
	ActionFailed           ActionState = "failed"
	ActionUncertain        ActionState = "uncertain"
	ActionNeedsReview      ActionState = "needs_review"
	ActionDenied           ActionState = "denied"
	ActionExpired          ActionState = "expired"
	ActionCancelled        ActionState = "cancelled"
	ActionAbandoned        ActionState = "abandoned"
	ActionSuperseded       ActionState = "superseded"
)

// AttemptStatus is what was seen of one call of a tool. It says nothing about
// whether the world changed: that is the separate EffectFact.
type AttemptStatus string

// Attempt statuses.
const (
	AttemptStarted   AttemptStatus = "started"
	AttemptSucceeded AttemptStatus = "succeeded"
	AttemptFailed    AttemptStatus = "failed"
	AttemptTimedOut  AttemptStatus = "timed_out"
	AttemptCancelled AttemptStatus = "cancelled"
	AttemptUncertain AttemptStatus = "uncertain"
)

// EffectFact is whether an attempt changed the world, established by an
// observation. Unknown is never read as "did not happen".
type EffectFact string

// Effect facts.
const (
	EffectUnknown     EffectFact = "unknown"
	EffectHappened    EffectFact = "happened"
	EffectNotHappened EffectFact = "not_happened"
)

// ApprovalState is the state of one approval request, bound to an action
// digest.
type ApprovalState string

// Approval states.
const (
	ApprovalPending     ApprovalState = "pending"
	ApprovalGranted     ApprovalState = "granted"
	ApprovalDenied      ApprovalState = "denied"
	ApprovalExpired     ApprovalState = "expired"
	ApprovalInvalidated ApprovalState = "invalidated"
)

// CancellationState is the state of a run's cancellation. Each state is a
// separate fact with its own time; none of them says anything about effects.
type CancellationState string

// Cancellation states. TooLate is ours, beyond the four-step lifecycle: the
// run ended (completed, stopped or failed) before the cancel took effect,
// so the cancellation will never be confirmed. Since a cancel moves its run
// to stopping in the same write, only an older build left such rows; the
// recovery scan (and a repeated cancel) settles them.
const (
	CancelRequested CancellationState = "requested"
	CancelAccepted  CancellationState = "accepted"
	CancelStopping  CancellationState = "stopping"
	CancelStopped   CancellationState = "stopped"
	CancelTooLate   CancellationState = "too_late"
)

// StopReason says why a terminal run ended. Exactly one per terminal run.
type StopReason string

// Stop reasons (docs/state-machines.md).
const (
	StopCompleted            StopReason = "completed"
	StopMaxSteps             StopReason = "max_steps"
	StopMaxRuntime           StopReason = "max_runtime"
	StopTokenBudgetExceeded  StopReason = "token_budget_exceeded"
	StopRepeatedAction       StopReason = "repeated_action"
	StopNoProgress           StopReason = "no_progress"
	StopConsecutiveErrors    StopReason = "consecutive_errors"
	StopPolicyDenied         StopReason = "policy_denied"
	StopApprovalDenied       StopReason = "approval_denied"
	StopApprovalExpired      StopReason = "approval_expired"
	StopRetryBudgetExhausted StopReason = "retry_budget_exhausted"
	StopProviderError        StopReason = "provider_error"
	StopToolError            StopReason = "tool_error"
	StopInvalidModelResponse StopReason = "invalid_model_response"
	StopUserCancelled        StopReason = "user_cancelled"
	StopInternalError        StopReason = "internal_error"
)

// transitions is one entity's table of legal moves: from → allowed targets.
// A state absent from the keys is terminal.
type transitions[S ~string] map[S][]S

func (t transitions[S]) allows(from, to S) bool { return slices.Contains(t[from], to) }

// RunTransitions is the run state machine.
var runTransitions = transitions[RunState]{
	RunQueued:           {RunRunning, RunStopping, RunStopped, RunFailed},
	RunRunning:          {RunAwaitingApproval, RunNeedsReview, RunStopping, RunCompleted, RunStopped, RunFailed},
	RunAwaitingApproval: {RunRunning, RunStopping, RunStopped, RunFailed},
	RunNeedsReview:      {RunRunning, RunStopping, RunStopped, RunFailed},
	RunStopping:         {RunStopped, RunFailed},
}

var actionTransitions = transitions[ActionState]{
	ActionProposed:         {ActionApproved, ActionAwaitingApproval, ActionDenied, ActionCancelled, ActionSuperseded},
	ActionAwaitingApproval: {ActionApproved, ActionDenied, ActionExpired, ActionCancelled, ActionSuperseded},
	// approved → succeeded: a retry was allowed, then a late outcome of
	// the last attempt established that its effect happened (reconciled).
	// approved → needs_review: a retry was allowed after an attempt whose
	// effect is unknown, and it never began (nobody resent it within the
	// tool's decision timeout, or the run was cancelled first): a person
	// settles the earlier attempt's effect.
	// approved → awaiting_approval: its approval no longer covers a begin
	// (past its execute_by, or the rules no longer approve it): a person is
	// asked again (ReaskApproval).
	ActionApproved: {ActionRunning, ActionCancelled, ActionSuperseded, ActionSucceeded, ActionNeedsReview, ActionAwaitingApproval},
	// running → needs_review: a client reported that its call failed but
	// took effect (docs/agent-protocol.md): a person settles it.
	ActionRunning:     {ActionSucceeded, ActionFailed, ActionUncertain, ActionNeedsReview, ActionCancelled},
	ActionUncertain:   {ActionSucceeded, ActionApproved, ActionNeedsReview, ActionFailed},
	ActionNeedsReview: {ActionSucceeded, ActionFailed, ActionAbandoned},
}

var attemptTransitions = transitions[AttemptStatus]{
	AttemptStarted: {AttemptSucceeded, AttemptFailed, AttemptTimedOut, AttemptCancelled, AttemptUncertain},
}

var effectTransitions = transitions[EffectFact]{
	EffectUnknown: {EffectHappened, EffectNotHappened},
}

var approvalTransitions = transitions[ApprovalState]{
	ApprovalPending: {ApprovalGranted, ApprovalDenied, ApprovalExpired, ApprovalInvalidated},
}

var cancellationTransitions = transitions[CancellationState]{
	CancelRequested: {CancelAccepted, CancelTooLate},
	CancelAccepted:  {CancelStopping, CancelTooLate},
	CancelStopping:  {CancelStopped, CancelTooLate},
}

// stopReasonState says which terminal state each stop reason belongs to.
var stopReasonState = map[StopReason]RunState{
	StopCompleted:            RunCompleted,
	StopMaxSteps:             RunStopped,
	StopMaxRuntime:           RunStopped,
	StopTokenBudgetExceeded:  RunStopped,
	StopRepeatedAction:       RunStopped,
	StopNoProgress:           RunStopped,
	StopConsecutiveErrors:    RunStopped,
	StopPolicyDenied:         RunStopped,
	StopApprovalDenied:       RunStopped,
	StopApprovalExpired:      RunStopped,
	StopRetryBudgetExhausted: RunStopped,
	StopUserCancelled:        RunStopped,
	StopProviderError:        RunFailed,
	StopToolError:            RunFailed,
	StopInvalidModelResponse: RunFailed,
	StopInternalError:        RunFailed,
}

// CanMoveTo reports whether the run state machine has the edge s → to.
func (s RunState) CanMoveTo(to RunState) bool { return runTransitions.allows(s, to) }

// Terminal reports whether no transition leaves s.
func (s RunState) Terminal() bool { _, ok := runTransitions[s]; return !ok && s.Valid() }

// Valid reports whether s is a known run state.
func (s RunState) Valid() bool {
	return validState(runTransitions, s, RunCompleted, RunStopped, RunFailed)
}

// Terminal reports whether no transition leaves s.
func (s ActionState) Terminal() bool { _, ok := actionTransitions[s]; return !ok && s.Valid() }

// Valid reports whether s is a known action state.
func (s ActionState) Valid() bool {
	return validState(actionTransitions, s, ActionSucceeded, ActionFailed, ActionDenied, ActionExpired,
		ActionCancelled, ActionAbandoned, ActionSuperseded)
}

// Valid reports whether s is a known attempt status.
func (s AttemptStatus) Valid() bool {
	return validState(attemptTransitions, s, AttemptSucceeded, AttemptFailed, AttemptTimedOut,
		AttemptCancelled, AttemptUncertain)
}

// Valid reports whether f is a known effect fact.
func (f EffectFact) Valid() bool {
	return validState(effectTransitions, f, EffectHappened, EffectNotHappened)
}

// Valid reports whether s is a known approval state.
func (s ApprovalState) Valid() bool {
	return validState(approvalTransitions, s, ApprovalGranted, ApprovalDenied, ApprovalExpired, ApprovalInvalidated)
}

// Terminal reports whether no transition leaves s (stopped, too_late).
func (s CancellationState) Terminal() bool {
	_, ok := cancellationTransitions[s]
	return !ok && s.Valid()
}

// Valid reports whether s is a known cancellation state.
func (s CancellationState) Valid() bool {
	return validState(cancellationTransitions, s, CancelStopped, CancelTooLate)
}

// Valid reports whether r is a known stop reason.
func (r StopReason) Valid() bool { _, ok := stopReasonState[r]; return ok }

// TerminalState returns the run state a stop reason ends in.
func (r StopReason) TerminalState() RunState { return stopReasonState[r] }

func validState[S ~string](t transitions[S], s S, terminals ...S) bool {
	if _, ok := t[s]; ok {
		return true
	}
	return slices.Contains(terminals, s)
}

// ValidateRunTransition checks a run move against the table; a move into a
// terminal state must carry the stop reason that belongs to it, and no other
// move may carry one.
func ValidateRunTransition(from, to RunState, reason StopReason) error {
	if err := validate("run", runTransitions, from, to); err != nil {
		return err
	}
	switch {
	case to.Terminal() && reason == "":
		return Errorf(CodeInvalid, "run %s → %s needs a stop reason", from, to)
	case to.Terminal() && !reason.Valid():
		return Errorf(CodeInvalid, "unknown stop reason %q", reason)
	case to.Terminal() && reason.TerminalState() != to:
		return Errorf(CodeInvalid, "stop reason %s ends a run in %s, not %s", reason, reason.TerminalState(), to)
	case !to.Terminal() && reason != "":
		return Errorf(CodeInvalid, "run %s → %s is not terminal and takes no stop reason", from, to)
	}
	return nil
}

// ValidateActionTransition checks an action move against the table.
func ValidateActionTransition(from, to ActionState) error {
	return validate("action", actionTransitions, from, to)
}

// ValidateAttemptTransition checks an attempt status move against the table.
func ValidateAttemptTransition(from, to AttemptStatus) error {
	return validate("attempt", attemptTransitions, from, to)
}

// ValidateEffectTransition checks that an effect fact moves only from
// unknown to established, and never back.
func ValidateEffectTransition(from, to EffectFact) error {
	return validate("effect", effectTransitions, from, to)
}

// ValidateApprovalTransition checks an approval move against the table.
func ValidateApprovalTransition(from, to ApprovalState) error {
	return validate("approval", approvalTransitions, from, to)
}

// ValidateCancellationTransition checks a cancellation move against the table.
func ValidateCancellationTransition(from, to CancellationState) error {
	return validate("cancellation", cancellationTransitions, from, to)
}

func validate[S interface {
	~string
	Valid() bool
}](entity string, t transitions[S], from, to S) error {
	switch {
	case !from.Valid():
		return Errorf(CodeInvalid, "unknown %s state %q", entity, from)
	case !to.Valid():
		return Errorf(CodeInvalid, "unknown %s state %q", entity, to)
	case !t.allows(from, to):
		return Errorf(CodeInvalid, "illegal %s transition %s → %s", entity, from, to)
	}
	return nil
}

// RunStates lists every run state, in table order.
func RunStates() []RunState {
	return []RunState{RunQueued, RunRunning, RunAwaitingApproval, RunNeedsReview, RunStopping, RunCompleted, RunStopped, RunFailed}
}

// ActionStates lists every action state.
func ActionStates() []ActionState {
	return []ActionState{ActionProposed, ActionAwaitingApproval, ActionApproved, ActionRunning, ActionSucceeded,
		ActionFailed, ActionUncertain, ActionNeedsReview, ActionDenied, ActionExpired, ActionCancelled,
		ActionAbandoned, ActionSuperseded}
}

// AttemptStatuses lists every attempt status.
func AttemptStatuses() []AttemptStatus {
	return []AttemptStatus{AttemptStarted, AttemptSucceeded, AttemptFailed, AttemptTimedOut, AttemptCancelled, AttemptUncertain}
}

// EffectFacts lists every effect fact.
func EffectFacts() []EffectFact {
	return []EffectFact{EffectUnknown, EffectHappened, EffectNotHappened}
}

// ApprovalStates lists every approval state.
func ApprovalStates() []ApprovalState {
	return []ApprovalState{ApprovalPending, ApprovalGranted, ApprovalDenied, ApprovalExpired, ApprovalInvalidated}
}

// CancellationStates lists every cancellation state.
func CancellationStates() []CancellationState {
	return []CancellationState{CancelRequested, CancelAccepted, CancelStopping, CancelStopped, CancelTooLate}
}

// StopReasons lists every stop reason.
func StopReasons() []StopReason {
	return []StopReason{StopCompleted, StopMaxSteps, StopMaxRuntime, StopTokenBudgetExceeded, StopRepeatedAction,
		StopNoProgress, StopConsecutiveErrors, StopPolicyDenied, StopApprovalDenied, StopApprovalExpired,
		StopRetryBudgetExhausted, StopProviderError, StopToolError, StopInvalidModelResponse, StopUserCancelled,
		StopInternalError}
}
