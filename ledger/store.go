package ledger

import (
	"context"
	"encoding/json"
	"time"
)

// Store keeps the ledger's facts durable. Every method that changes state
// runs in one write transaction that also appends the events recording the
// change, so a fact and its event are committed together or not at all.
// Transitions are guarded in SQL (UPDATE … WHERE state = from) and checked
// against the tables in states.go.
//
// Errors are *Error values: CodeInvalid for a malformed request or illegal
// transition, CodeNotFound for an unknown id, CodeConflict when the stored
// state does not allow the request (a lost race, a reused idempotency key, a
// digest mismatch), CodeApprovalRequired and CodeBudgetExceeded as named.
type Store interface {
	// SubmitRun creates a run for the request identity (tenant, principal,
	// idempotency key) or returns the existing one. Same identity and same
	// request digest: the existing run with Replayed set. Same identity and
	// another digest: CodeConflict, nothing changes. Another principal's
	// key is another identity. Concurrent submits of one identity produce
	// exactly one run. With p.MaxPendingApprovals set, a new run (not a
	// replay) is CodeBudgetExceeded while the tenant has that many pending
	// approvals and queued or running runs together.
	SubmitRun(ctx context.Context, p SubmitRunParams) (SubmitRunResult, error)
	// TransitionRun moves a run from p.From to p.To. CodeConflict if the run
	// is no longer in p.From.
	TransitionRun(ctx context.Context, p RunTransition) (*Run, error)
	// FindRunByID returns one run with its budget. CodeNotFound if unknown.
	FindRunByID(ctx context.Context, id RunID) (*Run, error)
	// FindRuns lists runs matching the filter in id order.
	FindRuns(ctx context.Context, f RunFilter) ([]*Run, error)

	// CreateAction records an action proposed by a model. The caller's
	// idempotency key (unique within the run) makes a replayed step return
	// the existing action with Duplicate set; the same key with other
	// content is CodeConflict. With p.Gate set, the action leaves proposed
	// in the same transaction, and awaiting_approval opens a pending
	// approval bound to the action digest. p.Usage and p.StartAttempt fold
	// the step's usage and the first attempt into the same transaction.
	CreateAction(ctx context.Context, p CreateActionParams) (CreateActionResult, error)
	// TransitionAction moves an action along an edge that needs no other
	// fact. Edges owned by another method (→ running: StartAttempt;
	// awaiting_approval → approved/denied/expired: DecideApproval,
	// ExpireApprovals; running → outcome: FinishAttempt) are CodeInvalid
	// here. Entering awaiting_approval opens a pending approval bound to the
	// action digest; leaving it other than by a decision invalidates it.
	TransitionAction(ctx context.Context, p ActionTransition) (*Action, error)
	// FindActionByID returns one action. CodeNotFound if unknown.
	FindActionByID(ctx context.Context, id ActionID) (*Action, error)
	// FindActions lists actions matching the filter in (run, seq) order.
	FindActions(ctx context.Context, f ActionFilter) ([]*Action, error)

	// StartAttempt records a new attempt of an approved action before the
	// tool is called, moves the action to running and counts the attempt
	// against the run's budget, all in one transaction.
	// CodeApprovalRequired if the action is not approved,
	// CodeApprovalStale if its newest granted approval passed its
	// execute_by (ReaskApproval then asks again), CodeBudgetExceeded
	// if an attempt or time budget or the deadline forbids another attempt,
	// CodeConflict if the run is not running or its cancel was accepted.
	StartAttempt(ctx context.Context, p StartAttemptParams) (*Attempt, error)
	// FinishAttempt records an attempt's outcome (status, optional effect
	// observation, result or error), adds its duration to the run's
	// execution budget and moves the action where the outcome table
	// (OutcomeOf) sends it, with its run to needs_review if the action goes
	// there. A combination the table refuses is CodeInvalid wrapping
	// ErrOutcomeNotAllowed, and nothing is written.
	FinishAttempt(ctx context.Context, p FinishAttemptParams) (FinishAttemptResult, error)
	// RecordObservation appends tool-side or human evidence about an
	// attempt. An established effect (happened, not_happened) is written on
	// the attempt if its effect was unknown; evidence contradicting an
	// established effect is CodeConflict and nothing is recorded.
	RecordObservation(ctx context.Context, p RecordObservationParams) (*Observation, *Attempt, error)
	// SettleReview records a person's verdict on an action in review, in
	// one transaction: the verdict as an observation (source person) on the
	// action's last attempt, the action moved to p.To (succeeded, failed or
	// abandoned), and the run back from needs_review to running once no
	// other action of it waits for a person. CodeConflict if the action is
	// not in review; CodeNotFound if unknown.
	SettleReview(ctx context.Context, p SettleReviewParams) (*Action, error)
	// FindAttempts lists attempts matching the filter in (action, no) order.
	FindAttempts(ctx context.Context, f AttemptFilter) ([]*Attempt, error)
	// FindObservations lists observations matching the filter in time order.
	FindObservations(ctx context.Context, f ObservationFilter) ([]*Observation, error)

	// DecideApproval grants or denies the pending approval of an action,
	// only if p.ActionDigest is the digest it is bound to, and moves the
	// action to approved or denied. A grant with p.ExecuteWithin sets the
	// approval's execute_by that much after the decision. A run in awaiting_approval with no other
	// pending approval goes back to running in the same transaction, so the
	// engine picks it up. CodeConflict on a digest mismatch, if no approval
	// is pending, or if it has passed its expiry time; nothing changes then.
	DecideApproval(ctx context.Context, p DecideApprovalParams) (DecideApprovalResult, error)
	// ExpireApprovals expires every pending approval whose time has passed,
	// and its action, and resumes the run as DecideApproval does, returning
	// what it expired.
	ExpireApprovals(ctx context.Context) ([]*Approval, error)
	// FindApprovals lists approvals matching the filter in id order.
	FindApprovals(ctx context.Context, f ApprovalFilter) ([]*Approval, error)
	// ReaskApproval asks a person again for an approved action whose
	// approval no longer covers a begin, in one transaction: its newest
	// granted approval, if it has one, records p.Reason and the time as
	// why it went stale; the action moves approved → awaiting_approval;
	// and a new pending approval opens, bound to the same action digest,
	// with p.ApprovalTTL. The run is not moved: whoever drives it treats
	// the action as any other that waits for a person. CodeConflict,
	// nothing written, if the action is not approved; CodeNotFound if
	// unknown.
	ReaskApproval(ctx context.Context, p ReaskApprovalParams) (ReaskApprovalResult, error)

	// RequestCancel cancels a run in one transaction: the cancellation is
	// recorded as requested, accepted at once (from then on StartAttempt
	// refuses every attempt of the run), and the run moves to stopping,
	// each with its event. A repeat returns the same cancellation with
	// Created false, whatever its state, settling it first if it was left
	// half-done (see SettleCancellations). CodeConflict, and nothing
	// written, if the run ended without a cancellation; CodeNotFound if the
	// run is unknown.
	RequestCancel(ctx context.Context, p RequestCancelParams) (RequestCancelResult, error)
	// SettleCancellations, in one transaction, brings into line every
	// cancellation an older build or a crash left half-done, and returns
	// them: on a run that ended before it was confirmed, it becomes
	// too_late; on a live run, a requested one is accepted and the run
	// moved to stopping. The recovery scan calls it at start-up.
	SettleCancellations(ctx context.Context) ([]*Cancellation, error)
	// TransitionCancellation moves a run's cancellation one step. Confirming
	// it (stopping → stopped) is CodeConflict while an attempt of the run is
	// still started with an unknown effect; too_late is CodeConflict while
	// the run has not ended.
	TransitionCancellation(ctx context.Context, p CancellationTransition) (*Cancellation, error)
	// FindCancellation returns a run's cancellation. CodeNotFound if none.
	FindCancellation(ctx context.Context, run RunID) (*Cancellation, error)

	// AddUsage adds model-step usage (steps, tokens, execution time) to a
	// run's persisted budget.
	AddUsage(ctx context.Context, p AddUsageParams) (*Budget, error)

	// RecordRecovery writes one recovery pass over an action in one
	// transaction: its decisions and the tools' answers in order, then the
	// act on the final decision (close the interrupted attempt, move the
	// action, move the run). CodeConflict if the action is no longer in
	// p.ActionState, the attempt is no longer started, the run is no longer
	// in p.Run.From or an answer contradicts an established effect;
	// nothing is written then.
	RecordRecovery(ctx context.Context, p RecordRecoveryParams) (RecordRecoveryResult, error)
	// FindRecoveryFacts returns, in (run, seq) order, every action approved,
	// running or uncertain of a run that is not terminal, a page of runs at
	// a time (f.AfterRun, f.Runs) — or, with f.ActionID, that one action
	// (CodeNotFound if unknown) — with its run and budget, its last
	// attempt, the failed queries about that attempt and the run's
	// cancellation, all from one snapshot.
	FindRecoveryFacts(ctx context.Context, f RecoveryFilter) ([]*RecoveryFacts, error)

	// FindEvents returns a run's events in sequence order.
	FindEvents(ctx context.Context, run RunID) ([]*Event, error)
	// FindEventsAfter returns, in sequence order, the events of f.RunID
	// whose seq is greater than f.AfterSeq, at most f.Limit of them (0: no
	// limit): what a reader that has seen the chain up to f.AfterSeq has
	// not seen yet, read in SQL on the (run, seq) index, so its cost grows
	// with what is new, not with the run. None for an unknown run;
	// CodeInvalid for a negative AfterSeq or Limit.
	FindEventsAfter(ctx context.Context, f EventFilter) ([]*Event, error)
	// VerifyChain walks a run's event chain, checks every row of the run
	// against the newest event that bound it and every stored rule set its
	// actions cite against its digest, and names the first broken link,
	// changed row or changed rule set. CodeNotFound if the run is unknown.
	VerifyChain(ctx context.Context, run RunID) (ChainReport, error)
	// FindChain returns a run's events and rows with VerifyChain's verdict
	// on them and the newest signature of its head, read from one
	// snapshot. CodeNotFound if the run is unknown.
	FindChain(ctx context.Context, run RunID) (*Chain, error)

	// LeaseStore: the agent protocol's leases and decisions (leases.go).
	LeaseStore

	// RunLeaseStore: which process may advance and recover a run
	// (runleases.go): ClaimRuns, RenewRunLeases, ReleaseRunLease and
	// FindRunLease. A write whose context carries a lease (WithRunLease)
	// and moves that run's chain head is refused with ErrLeaseLost
	// (CodeConflict), nothing written, once another process has claimed
	// the run; a write whose context carries none is not fenced.
	RunLeaseStore

	// CountByState counts every run, action and approval by state, every
	// attempt by status and effect, and the runs whose head each signing
	// key signed last, across tenants, from one snapshot and without
	// loading rows (metrics; the signing check at start-up).
	CountByState(ctx context.Context) (*Counts, error)

	// PutRuleSet stores an approval rule set, its canonical JSON, under
	// its digest (sha256 of that JSON), once: a rule set stored already is
	// returned with Created false, and is CodeConflict if its stored
	// document no longer has its digest. CodeInvalid if document is not
	// JSON. It appends no event: a rule set belongs to no run, and its
	// digest, which the gates of the actions it decided carry into their
	// runs' chains, is what vouches for it (rulesets.go).
	PutRuleSet(ctx context.Context, document json.RawMessage) (PutRuleSetResult, error)
	// FindRuleSets returns the stored rule sets f selects: those of
	// f.Digests that are stored, or every one, newest first.
	FindRuleSets(ctx context.Context, f RuleSetFilter) ([]*RuleSet, error)

	// ProbeWrite runs one write that reaches the database's log and
	// commits but changes nothing the ledger reads: the check, while
	// writes fail (storehealth.Tracker), that they succeed again when
	// nothing else writes.
	ProbeWrite(ctx context.Context) error

	// Close releases the database.
	Close() error
}

// SubmitRunParams is a run submission. The request digest is computed from
// the canonical form of {agent, input, budgets}.
type SubmitRunParams struct {
	Tenant         string
	IdempotencyKey string
	Principal      string
	Agent          string
	Input          json.RawMessage
	Budgets        BudgetLimits
	// MaxPendingApprovals, if positive, refuses a new run of a tenant that
	// has this many approvals pending and runs queued or running, together
	// (such a run may ask for one at its next step): CodeBudgetExceeded.
	// 0: no cap.
	MaxPendingApprovals int
	// Start creates the run running instead of queued (a client-driven
	// run: nothing in the ledger takes its first step).
	Start bool
}

// SubmitRunResult is the run and whether it already existed.
type SubmitRunResult struct {
	Run      *Run
	Replayed bool
}

// RunTransition moves a run. StopReason is required for, and only for, a
// terminal target.
type RunTransition struct {
	ID         RunID
	From, To   RunState
	StopReason StopReason
	Actor      string
	Data       any // recorded in the event; marshalled to canonical JSON
	// also are other rows the event binds as they stand (a write that
	// moves the run on another row's account, within package ledger).
	also []Content
}

// RunFilter selects runs. Nil fields match everything.
type RunFilter struct {
	Tenant      *string
	SubmittedBy *string // the principal that submitted the run
	State       *RunState
	AfterID     *RunID // cursor: ids strictly after this one
	Limit       int    // 0: no limit
	// NotAgents leaves out runs of these agents (the engine's pool skips
	// runs a client drives).
	NotAgents []string
}

// CreateActionParams records an action.
type CreateActionParams struct {
	RunID RunID
	// IdempotencyKey identifies the model step that proposed the action,
	// unique within the run (for example "step-3").
	IdempotencyKey string
	Tool           string
	ToolVersion    string
	Effect         Effect
	Arguments      json.RawMessage // a JSON object
	// Supersedes, if set, names an earlier action of the same run that this
	// one replaces; it moves to superseded and its pending approval is
	// invalidated.
	Supersedes ActionID
	// Gate, if set, is the state the rules chose: approved,
	// awaiting_approval or denied.
	Gate ActionState
	// ApprovalTTL bounds a pending approval's life; 0 means no expiry.
	ApprovalTTL time.Duration
	// GateAudit, with Gate, says which rule of which rule set chose it. It
	// is stored on the action (Action.Gate), enters the content its events
	// bind, and the gate's event (proposed → Gate) carries it in its data
	// as {"gate": {"rule": N or null, "reason", "rules_digest"}}. The zero
	// GateAudit records none, as before the gate was audited.
	GateAudit GateAudit
	Actor     string
	// Usage, if set, is the usage of the model step that proposed the
	// action, added to the run's budget in the same transaction (and not
	// again when the step is replayed). Its RunID is ignored.
	Usage *AddUsageParams
	// StartAttempt, with Gate approved, also starts the action's first
	// attempt in the same transaction: one commit for everything that must
	// be durable before the tool is called. If the attempt is refused (a
	// budget, a cancel), the action is still recorded and StartErr says why.
	StartAttempt bool
	// MaxPendingApprovals, if positive, refuses (CodeBudgetExceeded, and
	// nothing recorded) an action that would wait for approval, when its
	// run has one pending already, while its tenant's pending approvals
	// and live runs reach it, as SubmitRun refuses a new run. A run's first
	// pending approval takes the place its run held under the cap.
	MaxPendingApprovals int
}

// GateAudit is why the gate chose an action's state: what an auditor needs
// to tell why a write ran without a person, or waited for one.
type GateAudit struct {
	// Rule is the 0-based index of the matching rule in the rules file, or
	// -1 when no rule matched and the default decided.
	Rule int
	// Reason says it in words, e.g. "rule 2: cards.write is auto-approved";
	// at most MaxGateReasonLength bytes, without control characters.
	Reason string
	// RulesDigest is the digest of the rule set in force, defaults
	// included (approval.Policy.RulesDigest). Required with any other field.
	RulesDigest Digest
}

// MaxGateReasonLength is the longest GateAudit.Reason, in bytes.
const MaxGateReasonLength = 1000

// CreateActionResult is the action, its pending approval if one was opened,
// whether the action already existed, and the attempt started with it.
type CreateActionResult struct {
	Action    *Action
	Approval  *Approval
	Duplicate bool
	Attempt   *Attempt
	StartErr  error
	// Chain is how the write moved the run's chain head (zero for a
	// duplicate, which writes nothing).
	Chain ChainMove
}

// ChainMove is how one write moved a run's chain head: From is the seq of
// the run's last event when the write began, To the seq of the last event
// it appended. A reader that knew the run at From knows it at To from
// what the write returned; a From it did not know means another write
// came in between.
type ChainMove struct {
	From, To int64
}

// ActionTransition moves an action along an edge owned by no other method.
type ActionTransition struct {
	ID       ActionID
	From, To ActionState
	// ApprovalTTL bounds the life of the approval opened when To is
	// awaiting_approval; 0 means no expiry.
	ApprovalTTL time.Duration
	Actor       string
	Data        any
}

// EventFilter selects a page of a run's events: those after a seq.
type EventFilter struct {
	RunID    RunID
	AfterSeq int64 // cursor: events whose seq is greater than this; 0 from the first
	Limit    int   // 0: no limit
}

// ActionFilter selects actions. Nil fields match everything.
type ActionFilter struct {
	RunID  *RunID
	Tenant *string
	State  *ActionState
	Limit  int
}

// StartAttemptParams starts an attempt.
type StartAttemptParams struct {
	ActionID ActionID
	Actor    string
}

// ObservationInput is evidence recorded with an attempt's outcome.
type ObservationInput struct {
	Source ObservationSource
	Effect EffectFact
	Detail json.RawMessage
}

// FinishAttemptParams records an attempt's outcome.
type FinishAttemptParams struct {
	AttemptID AttemptID
	Status    AttemptStatus // not started
	// Observation, if set, is recorded; an established effect in it is
	// written on the attempt.
	Observation *ObservationInput
	Result      json.RawMessage
	Error       *AttemptError
	Actor       string
	// Lease, if set, is the client's lease the outcome is reported
	// through: CodeForbidden for another token, CodeConflict if it lapsed
	// or was completed before; its digest is kept for replays.
	Lease *LeaseOutcome
}

// FinishAttemptResult is the attempt and action after the outcome.
type FinishAttemptResult struct {
	Attempt     *Attempt
	Action      *Action
	Observation *Observation
	// Chain is how the write moved the run's chain head.
	Chain ChainMove
}

// RecordObservationParams appends evidence about an attempt.
type RecordObservationParams struct {
	AttemptID AttemptID
	Source    ObservationSource
	Effect    EffectFact
	Detail    json.RawMessage
	Actor     string
	// DecisionID, if set, is the agent decision (LeaseStore) the
	// observation answers: CodeConflict, and nothing recorded, unless it is
	// the action's current decision and not answered yet.
	DecisionID string
}

// AttemptFilter selects attempts.
type AttemptFilter struct {
	ActionID *ActionID
	RunID    *RunID
	Status   *AttemptStatus
	Limit    int
}

// ObservationFilter selects observations.
type ObservationFilter struct {
	RunID     *RunID
	ActionID  *ActionID
	AttemptID *AttemptID
}

// ApprovalDecision is a person's answer.
type ApprovalDecision string

// Decisions.
const (
	DecisionGrant ApprovalDecision = "grant"
	DecisionDeny  ApprovalDecision = "deny"
)

// DecideApprovalParams decides an action's pending approval.
type DecideApprovalParams struct {
	ActionID     ActionID
	ActionDigest Digest
	Decision     ApprovalDecision
	Principal    string
	Reason       string
	// ExecuteWithin, for a grant, sets the approval's execute_by this long
	// after the decision: an attempt begun at or after it needs a new
	// approval. 0: no execute_by. Negative is CodeInvalid.
	ExecuteWithin time.Duration
}

// ReaskApprovalParams asks for an approved action's approval again.
type ReaskApprovalParams struct {
	ActionID ActionID
	// Reason says why the approval no longer covers a begin, recorded on
	// the stale approval and in the action's event; required, at most
	// MaxGateReasonLength bytes, without control characters.
	Reason string
	// ApprovalTTL bounds the new pending approval's life; 0 means no
	// expiry.
	ApprovalTTL time.Duration
	Actor       string
}

// ReaskApprovalResult is the action back in awaiting_approval, its new
// pending approval, and the granted approval that went stale (nil if the
// action had none: the rules had approved it).
type ReaskApprovalResult struct {
	Action   *Action
	Approval *Approval
	Stale    *Approval
}

// DecideApprovalResult is the decided approval and the action after it.
type DecideApprovalResult struct {
	Approval *Approval
	Action   *Action
}

// ApprovalFilter selects approvals.
type ApprovalFilter struct {
	Tenant   *string
	State    *ApprovalState
	ActionID *ActionID
	RunID    *RunID
	AfterID  *ApprovalID // cursor: ids strictly after this one
	Limit    int
}

// RequestCancelParams requests a run's cancellation.
type RequestCancelParams struct {
	RunID     RunID
	Principal string
	Reason    string
}

// RequestCancelResult is the cancellation and whether this call created it.
type RequestCancelResult struct {
	Cancellation *Cancellation
	Created      bool
}

// CancellationTransition moves a cancellation one step.
type CancellationTransition struct {
	RunID    RunID
	From, To CancellationState
	Actor    string
	Data     any // recorded in the event
}

// AddUsageParams adds usage to a run's budget.
type AddUsageParams struct {
	RunID     RunID
	Steps     int64
	Tokens    int64
	Execution time.Duration
	// TokensUnavailable marks that a step reported no token usage.
	TokensUnavailable bool
}

// SettleReviewParams is a person's verdict on an action in review.
type SettleReviewParams struct {
	ActionID ActionID
	To       ActionState     // succeeded, failed or abandoned
	Effect   EffectFact      // what the person says of the effect
	Detail   json.RawMessage // recorded with the observation
	Actor    string
	Data     any // recorded with the action's transition
}

// Chain is everything a run's hash chain vouches for, read from one
// snapshot: its events in sequence order, its rows, the newest signature
// of its head, and the verdict on them.
type Chain struct {
	Events []*Event
	Report ChainReport
	// Run is the run with its budget.
	Run *Run
	// Actions are in sequence order, Attempts in (action, number) order,
	// Approvals in id order, Observations in time order; Cancellation is
	// nil if none was requested.
	Actions      []*Action
	Attempts     []*Attempt
	Approvals    []*Approval
	Cancellation *Cancellation
	Observations []*Observation
	// RuleSets are the stored rule sets the actions' gates cite, in the
	// order of their first citation; a cited rule set that was never
	// stored is missing here, which the verdict does not count against
	// the chain (an action recorded before rule sets were stored).
	RuleSets []*RuleSet
	// Signature is the newest signature of the run's head (signing.go);
	// nil if none was made. The verdict does not check it: only a public
	// key can (VerifySignedHead).
	Signature *HeadSignature
}

// ChainReport is the result of walking a run's event chain and checking
// its rows against it.
type ChainReport struct {
	RunID  RunID `json:"run_id"`
	Events int   `json:"events"`
	OK     bool  `json:"ok"`
	// BrokenSeq is the sequence number of the first broken link (0 if OK):
	// the event that does not verify, or the event that recorded a row
	// that no longer matches it.
	BrokenSeq int64  `json:"broken_seq,omitempty"`
	Reason    string `json:"reason,omitempty"`
	// Rows is how many rows were checked against the chain; Unbound how
	// many of them no event binds because they were last written before
	// rows were bound (events of format 1), which the chain cannot vouch
	// for.
	Rows    int `json:"rows"`
	Unbound int `json:"unbound,omitempty"`
	// Entity and EntityID name the row that broke the chain, if one did.
	Entity   string `json:"entity,omitempty"`
	EntityID string `json:"entity_id,omitempty"`
}
