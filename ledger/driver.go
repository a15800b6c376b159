package ledger

import (
	"context"
	"time"
)

// The storage seam. The ledger's rules (gating, budgets, effect facts,
// recovery writes, the event chain) are written once, in this package, over
// a Driver; a driver only stores rows and guards moves. ledger/sqlite and
// ledger/postgres are the drivers, and ledger/storetest is the suite every
// driver passes.
//
// What every driver guarantees:
//   - Every error it returns is an *Error: CodeNotFound for a Get of a row
//     that does not exist, CodeConflict for a unique constraint, CodeInvalid
//     for a foreign key or check constraint, CodeInternal for anything else,
//     whichever path (ORM or prepared statement) raised it.
//   - A guarded move (Move…, Finish…, Set…, Answer…) changes the row only if
//     it still is in the state the caller names, and reports with its bool
//     whether it did; it never reads first and writes later.
//   - Times are stored in microseconds and come back in UTC.
//   - Writes are serialisable: a write commits only if no write committed
//     in between changed what it read (SQLite's IMMEDIATE transactions run
//     one at a time; PostgreSQL locks each run a write touches before
//     reading it, so the writes of one run run one after another, and
//     retries a deadlock). So the rules may read, decide, then write.

// Driver stores the ledger's rows.
type Driver interface {
	// Write runs fn in one write transaction and commits it if fn returns
	// nil; a driver may run several callers' fn in one commit (group
	// commit), each rolled back alone if it fails, and may run fn again
	// from the start after a serialisation failure, so fn keeps no state
	// between runs. fn must not keep tx.
	Write(ctx context.Context, fn func(Tx) error) error
	// Read runs fn on one consistent snapshot of the database, and may
	// run fn again from the start, on a new snapshot, when the database
	// ended the session under it, so fn keeps no state between runs.
	Read(ctx context.Context, fn func(Reader) error) error
	// Reader is the driver's reader outside any snapshot: each call sees
	// what was committed when it ran.
	Reader() Reader
	// SchemaVersion is the schema version the database records.
	SchemaVersion(ctx context.Context) (int, error)
	// LatestSchemaVersion is the schema version this build of the driver
	// writes.
	LatestSchemaVersion() int
	// Close releases the database.
	Close() error
}

// Reader reads rows. Get… is CodeNotFound when the row does not exist;
// List… returns an empty slice then.
type Reader interface {
	// GetRun returns a run with its budget.
	GetRun(ctx context.Context, id RunID) (*Run, error)
	// GetRunByRequest returns the run of a request identity.
	GetRunByRequest(ctx context.Context, tenant, principal, key string) (*Run, error)
	// ListRuns lists runs (with budgets) in id order.
	ListRuns(ctx context.Context, f RunFilter) ([]*Run, error)
	// CountWaiting counts a tenant's pending approvals plus its queued and
	// running runs, each of the two counted up to limit.
	CountWaiting(ctx context.Context, tenant string, limit int) (int, error)
	// ChainHead is the run's recorded chain head.
	ChainHead(ctx context.Context, run RunID) (seq int64, hash string, err error)

	// GetAction returns one action.
	GetAction(ctx context.Context, id ActionID) (*Action, error)
	// GetActionByKey returns a run's action by its idempotency key.
	GetActionByKey(ctx context.Context, run RunID, key string) (*Action, error)
	// MaxActionSeq is the highest action sequence number of a run, 0 if none.
	MaxActionSeq(ctx context.Context, run RunID) (int64, error)
	// ListActions lists actions in (run, seq) order.
	ListActions(ctx context.Context, f ActionFilter) ([]*Action, error)
	// CountActions counts a run's actions in state.
	CountActions(ctx context.Context, run RunID, state ActionState) (int64, error)

	// GetAttempt returns one attempt.
	GetAttempt(ctx context.Context, id AttemptID) (*Attempt, error)
	// LastAttempt returns an action's attempt with the highest number.
	LastAttempt(ctx context.Context, action ActionID) (*Attempt, error)
	// ListAttempts lists attempts in (action, number) order.
	ListAttempts(ctx context.Context, f AttemptFilter) ([]*Attempt, error)
	// ListObservations lists observations in (time, id) order.
	ListObservations(ctx context.Context, f ObservationFilter) ([]*Observation, error)

	// GetApproval returns one approval.
	GetApproval(ctx context.Context, id ApprovalID) (*Approval, error)
	// PendingApproval returns an action's pending approval.
	PendingApproval(ctx context.Context, action ActionID) (*Approval, error)
	// GrantedApproval returns an action's newest granted approval.
	GrantedApproval(ctx context.Context, action ActionID) (*Approval, error)
	// ListApprovals lists approvals in id order.
	ListApprovals(ctx context.Context, f ApprovalFilter) ([]*Approval, error)
	// CountPendingApprovals counts a run's pending approvals.
	CountPendingApprovals(ctx context.Context, run RunID) (int64, error)
	// ListDueApprovals lists, in id order, pending approvals whose expiry is
	// at or before at.
	ListDueApprovals(ctx context.Context, at time.Time) ([]*Approval, error)

	// GetCancellation returns a run's cancellation.
	GetCancellation(ctx context.Context, run RunID) (*Cancellation, error)
	// ListUnsettledCancellations lists, in id order, the cancellations
	// requested, accepted or stopping.
	ListUnsettledCancellations(ctx context.Context) ([]*Cancellation, error)

	// GetAttemptLease returns an attempt's lease.
	GetAttemptLease(ctx context.Context, attempt AttemptID) (*AttemptLease, error)
	// GetAttemptLeaseByKey returns the lease an action's begin key made.
	GetAttemptLeaseByKey(ctx context.Context, action ActionID, key string) (*AttemptLease, error)
	// ListLapsedLeases lists, by (until, attempt), leases with no outcome
	// that lapsed before before, of attempts still started, but for those
	// whose agent was told a decision after the lapse and has not answered
	// it; limit ≤ 0 is no limit.
	ListLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*AttemptLease, error)
	// GetAgentDecision returns the decision last told about an action.
	GetAgentDecision(ctx context.Context, action ActionID) (*AgentDecision, error)
	// ListAgentDecisions lists the decisions f selects: told, unanswered,
	// about actions that are approved, running or uncertain, by
	// (decided_at, action).
	ListAgentDecisions(ctx context.Context, f AgentDecisionFilter) ([]*AgentDecision, error)

	// ListEvents lists a run's events in sequence order; sizeHint is how
	// many there should be (0 if unknown).
	ListEvents(ctx context.Context, run RunID, sizeHint int64) ([]*Event, error)
	// ListEventsAfter lists, in sequence order, the events f selects
	// (Store.FindEventsAfter), f already checked.
	ListEventsAfter(ctx context.Context, f EventFilter) ([]*Event, error)
	// GetSignature returns the signature of a run's head.
	GetSignature(ctx context.Context, run RunID) (*HeadSignature, error)
	// ListRecoveryFacts returns the facts RecoveryFilter selects (see
	// Store.FindRecoveryFacts) with FailedQueries, UnknownQueries and
	// UnknownCancels left zero, and the observations with an unknown effect
	// from the sources query and cancel about those facts' attempts, for
	// the ledger to count.
	ListRecoveryFacts(ctx context.Context, f RecoveryFilter) ([]*RecoveryFacts, []*Observation, error)
	// CountByState is Store.CountByState.
	CountByState(ctx context.Context) (*Counts, error)
	// GetRuleSet returns the rule set stored under digest.
	GetRuleSet(ctx context.Context, digest Digest) (*RuleSet, error)
	// ListRuleSets lists rule sets newest stored first (then by digest),
	// at most limit of them (0: no limit).
	ListRuleSets(ctx context.Context, limit int) ([]*RuleSet, error)
	// GetRunLease returns a run's lease (Store.FindRunLease).
	GetRunLease(ctx context.Context, run RunID) (*RunLease, error)
	// ListRunLeaseOwners is Store.FindRunLeaseOwners.
	ListRunLeaseOwners(ctx context.Context) ([]string, error)
}

// Tx is one write transaction: it reads what the transaction has written.
type Tx interface {
	Reader

	// InsertRun inserts a run and its budget.
	InsertRun(ctx context.Context, r *Run) error
	// MoveRun sets a run's state, stop reason and updated time and raises
	// its version, if it is in from; it returns the run without its budget.
	MoveRun(ctx context.Context, id RunID, from, to RunState, reason StopReason, at time.Time) (*Run, bool, error)
	// AddUsage adds usage to a run's budget unless a sum would pass
	// math.MaxInt64, and returns the budget after it; false if the run has
	// no budget or a sum would overflow.
	AddUsage(ctx context.Context, run RunID, u BudgetUsage) (*Budget, bool, error)
	// CountAttempt adds one attempt to a run's budget; CodeNotFound if the
	// run has none.
	CountAttempt(ctx context.Context, run RunID) error
	// SpendExecution adds d to a run's execution budget and returns the
	// budget after it.
	SpendExecution(ctx context.Context, run RunID, d time.Duration) (*Budget, error)
	// SetBudgetUsed sets a run's budget usage to to and raises its version,
	// if its usage is still from.
	SetBudgetUsed(ctx context.Context, run RunID, from, to BudgetUsage) (bool, error)

	// InsertAction inserts an action.
	InsertAction(ctx context.Context, a *Action) error
	// MoveAction sets an action's state and updated time, raises its
	// version and its attempt count to at least attemptCount, if it is in
	// from; it returns the action after it.
	MoveAction(ctx context.Context, id ActionID, from, to ActionState, attemptCount int64, at time.Time) (*Action, bool, error)
	// SetAction writes a's state, attempt count, version and updated time,
	// if the stored action is still at version from.
	SetAction(ctx context.Context, a *Action, from int64) (bool, error)

	// InsertAttempt inserts an attempt.
	InsertAttempt(ctx context.Context, a *Attempt) error
	// FinishAttempt writes a's status, result, error and finished time and
	// raises its version, if the stored attempt is still started.
	FinishAttempt(ctx context.Context, a *Attempt) (bool, error)
	// SetAttemptEffect writes an attempt's effect and the observation that
	// established it, if its effect is still unknown.
	SetAttemptEffect(ctx context.Context, id AttemptID, effect EffectFact, by ObservationID) (bool, error)
	// SetAttempt writes a's status, effect and the observation that
	// established it, result, error, finished time and version, if the
	// stored attempt is still at version from.
	SetAttempt(ctx context.Context, a *Attempt, from int64) (bool, error)
	// InsertObservation inserts an observation.
	InsertObservation(ctx context.Context, o *Observation) error

	// InsertApproval inserts an approval.
	InsertApproval(ctx context.Context, a *Approval) error
	// MoveApproval sets an approval's state, decision time and reason (and
	// its decider, if decidedBy is not empty, and its execute_by, if
	// executeBy is not nil) and raises its version, if it is in from; it
	// returns the approval after it.
	MoveApproval(ctx context.Context, id ApprovalID, from, to ApprovalState, at time.Time, reason, decidedBy string, executeBy *time.Time) (*Approval, bool, error)
	// StaleApproval sets a granted approval's stale time and reason and
	// raises its version, if it is granted and not stale yet; it returns
	// the approval after it.
	StaleApproval(ctx context.Context, id ApprovalID, at time.Time, reason string) (*Approval, bool, error)

	// InsertCancellation inserts a cancellation.
	InsertCancellation(ctx context.Context, c *Cancellation) error
	// MoveCancellation sets a run's cancellation state and the time of that
	// state and raises its version, if it is in from.
	MoveCancellation(ctx context.Context, run RunID, from, to CancellationState, at time.Time) (bool, error)

	// InsertAttemptLease inserts an attempt's lease.
	InsertAttemptLease(ctx context.Context, l *AttemptLease) error
	// UpdateAttemptLease writes a lease's until, heartbeats, progress and
	// outcome; CodeNotFound if the attempt has no lease.
	UpdateAttemptLease(ctx context.Context, l *AttemptLease) error
	// PutAgentDecision inserts or replaces the decision told about an
	// action.
	PutAgentDecision(ctx context.Context, d *AgentDecision) error
	// AnswerAgentDecision marks the decision id about action answered, if
	// it is the current one and was not answered.
	AnswerAgentDecision(ctx context.Context, action ActionID, id string) (bool, error)

	// InsertEvent inserts an event.
	InsertEvent(ctx context.Context, e *Event) error
	// MoveChainHead sets a run's chain head to (seq, hash) if it is at
	// fromSeq.
	MoveChainHead(ctx context.Context, run RunID, fromSeq, seq int64, hash string) (bool, error)
	// MoveChainHeadFenced is MoveChainHead guarded also on the run's lease
	// token, in the same statement: it moves the head only if the run's
	// token is still token.
	MoveChainHeadFenced(ctx context.Context, run RunID, fromSeq, seq int64, hash string, token int64) (bool, error)
	// PutSignature inserts or replaces the signature of a run's head.
	PutSignature(ctx context.Context, h *HeadSignature) error

	// InsertRuleSet inserts a rule set unless one is stored under its
	// digest, and reports whether it did.
	InsertRuleSet(ctx context.Context, r *RuleSet) (bool, error)

	// Probe raises the counter of the store_probes row: a statement that
	// changes a row each time, so that its write reaches the database's
	// log and disk, and changes nothing the ledger reads
	// (Store.ProbeWrite).
	Probe(ctx context.Context) error

	// Run leases (runleases.go). The ledger has checked the parameters; now
	// is the Store's clock, which a driver of a database several hosts
	// share replaces with the database's own.

	// ClaimRuns is Store.ClaimRuns: in one statement (or under locks that
	// make it one), it sets owner, token + 1 and until now + p.TTL on up
	// to p.Limit runs in p.States (less p.NotAgents; among p.Runs if set)
	// whose lease is free or lapsed (until ≤ now) or held by one of
	// p.TakeOver, lowest id first, and returns their leases in id order.
	ClaimRuns(ctx context.Context, p ClaimRunsParams, now time.Time) ([]RunLease, error)
	// RenewRunLeases sets the until of each lease whose run still has its
	// owner and token to the later of its until and now + ttl, and returns
	// those leases with their until, in the order given.
	RenewRunLeases(ctx context.Context, leases []RunLease, now time.Time, ttl time.Duration) ([]RunLease, error)
	// ReleaseRunLease clears the owner and until of a run whose owner and
	// token are still l's, keeping its token; false if they are not.
	ReleaseRunLease(ctx context.Context, l RunLease) (bool, error)
}
