package postgres

import (
	"context"
	"database/sql"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// Run locks: how a write transaction (READ COMMITTED) makes the rules'
// read, decide, write safe. See the package doc for the argument.
//
// The first time a write touches a run (reads or writes any row of it: the
// run, its budget, actions, attempts, approvals, cancellation, leases,
// events, chain head), it locks the run's row with SELECT … FOR NO KEY
// UPDATE, and only then reads. Every write of a run does the same, so the
// writes of one run run one after another, each reading what the one
// before it committed, while writes of different runs run in parallel. A
// row found by its own id (an action, attempt or approval) is first mapped
// to its run (run_id never changes) in the statement that locks the run.
//
// FOR NO KEY UPDATE rather than FOR UPDATE: it is the lock an UPDATE of the
// run's non-key columns takes anyway, it excludes every other writer of the
// run just as well, and it leaves alone the FOR KEY SHARE locks that the
// foreign keys of rows inserted for the run take on it.

// entity is a kind of row that belongs to a run and is found by its own id.
type entity uint8

const (
	entityAction entity = iota
	entityAttempt
	entityApproval
)

// lockEntitySQL locks the run of a row of each entity, found by the row's
// id, and reads the run's chain head, which no one else can move while
// the lock is held; no row if the entity does not exist (yet).
var lockEntitySQL = [...]string{
	entityAction:   `SELECT id, event_seq, event_hash FROM runs WHERE id = (SELECT run_id FROM actions WHERE id = ?) FOR NO KEY UPDATE`,
	entityAttempt:  `SELECT id, event_seq, event_hash FROM runs WHERE id = (SELECT run_id FROM attempts WHERE id = ?) FOR NO KEY UPDATE`,
	entityApproval: `SELECT id, event_seq, event_hash FROM runs WHERE id = (SELECT run_id FROM approvals WHERE id = ?) FOR NO KEY UPDATE`,
}

const lockRunSQL = `SELECT id, event_seq, event_hash FROM runs WHERE id = ? FOR NO KEY UPDATE`

// chainHead is a run's event_seq and event_hash.
type chainHead struct {
	seq  int64
	hash string
}

// entityKey names one row of an entity in txState.runOf.
type entityKey struct {
	kind entity
	id   string
}

// locked reports whether the transaction holds run's lock.
func (s *txState) isLocked(run ledger.RunID) bool {
	_, ok := s.locked[run]
	return ok
}

// hold records that the transaction holds run's lock, with the run's
// chain head if the statement that locked it read it (nil: not read, or
// kept as it was), and that the row (kind, id), if id is set, is one of
// run's.
func (s *txState) hold(run ledger.RunID, head *chainHead, kind entity, id string) {
	if s.locked == nil {
		s.locked = map[ledger.RunID]*chainHead{}
		s.runOf = map[entityKey]ledger.RunID{}
	}
	if known, ok := s.locked[run]; !ok || head != nil || known == nil {
		s.locked[run] = head
	}
	if id != "" {
		s.runOf[entityKey{kind, id}] = run
	}
}

// lockRun locks run's row unless the transaction holds it already. A run
// that does not exist is not locked: the read that follows finds nothing.
func (t *tx) lockRun(ctx context.Context, run ledger.RunID) error {
	if run == "" || t.st.isLocked(run) {
		return nil
	}
	var (
		id   string
		head chainHead
	)
	found, err := t.one(ctx, lockRunSQL, []any{string(run)}, &id, &head.seq, &head.hash)
	if err != nil {
		return wrapErr("lock run "+string(run), err)
	}
	if found {
		t.st.hold(run, &head, 0, "")
	}
	return nil
}

// lockEntity locks the run of the row (kind, id) unless the transaction
// holds it already.
func (t *tx) lockEntity(ctx context.Context, kind entity, id string) error {
	if run, ok := t.st.runOf[entityKey{kind, id}]; ok && t.st.isLocked(run) {
		return nil
	}
	var (
		run  string
		head chainHead
	)
	found, err := t.one(ctx, lockEntitySQL[kind], []any{id}, &run, &head.seq, &head.hash)
	if err != nil {
		return wrapErr("lock the run of "+id, err)
	}
	if found {
		t.st.hold(ledger.RunID(run), &head, kind, id)
	}
	return nil
}

// lockedRead reads a row (or rows) of one run found through the entity
// (kind, id): it locks that run, then reads. If the row was committed
// after the lock looked for it (so its run was not locked), it locks the
// row's run and reads again. runOf is the run of what read returned, ""
// when it says nothing about one.
func lockedRead[T any](ctx context.Context, t *tx, kind entity, id string, read func() (T, error), runOf func(T) ledger.RunID) (T, error) {
	var zero T
	if err := t.lockEntity(ctx, kind, id); err != nil {
		return zero, err
	}
	v, err := read()
	if err != nil {
		return v, err
	}
	run := runOf(v)
	if run == "" || t.st.isLocked(run) {
		return v, nil
	}
	if err := t.lockRun(ctx, run); err != nil {
		return zero, err
	}
	return read()
}

// runReads: the Reader methods of a transaction, each locking the run it
// reads first.

// GetRun implements ledger.Tx: it locks the run, then reads it.
func (t *tx) GetRun(ctx context.Context, id ledger.RunID) (*ledger.Run, error) {
	if err := t.lockRun(ctx, id); err != nil {
		return nil, err
	}
	return t.reader.GetRun(ctx, id)
}

// GetRunByRequest implements ledger.Tx: it locks the request's run, if
// there is one, then reads it. Two writes that both find none and insert
// one collide on the unique request identity; Write runs the loser again,
// which finds the winner's run.
func (t *tx) GetRunByRequest(ctx context.Context, tenant, principal, key string) (*ledger.Run, error) {
	var (
		id   string
		head chainHead
	)
	found, err := t.one(ctx, `SELECT id, event_seq, event_hash FROM runs WHERE tenant = ? AND submitted_by = ? AND idempotency_key = ? FOR NO KEY UPDATE`,
		[]any{tenant, principal, key}, &id, &head.seq, &head.hash)
	if err != nil {
		return nil, wrapErr("get run by request", err)
	}
	if found {
		t.st.hold(ledger.RunID(id), &head, 0, "")
	}
	return t.reader.GetRunByRequest(ctx, tenant, principal, key)
}

// ChainHead implements ledger.Tx: the head read when the run was locked,
// as this write has moved it since.
func (t *tx) ChainHead(ctx context.Context, run ledger.RunID) (int64, string, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return 0, "", err
	}
	if head := t.st.locked[run]; head != nil {
		return head.seq, head.hash, nil
	}
	seq, hash, err := t.reader.ChainHead(ctx, run)
	if err == nil && t.st.isLocked(run) {
		t.st.locked[run] = &chainHead{seq: seq, hash: hash}
	}
	return seq, hash, err
}

// movedHead records run's chain head after this write moved it.
func (s *txState) movedHead(run ledger.RunID, seq int64, hash string) {
	if s.isLocked(run) {
		s.locked[run] = &chainHead{seq: seq, hash: hash}
	}
}

// GetRunLease implements ledger.Tx.
func (t *tx) GetRunLease(ctx context.Context, run ledger.RunID) (*ledger.RunLease, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return nil, err
	}
	return t.reader.GetRunLease(ctx, run)
}

// GetCancellation implements ledger.Tx.
func (t *tx) GetCancellation(ctx context.Context, run ledger.RunID) (*ledger.Cancellation, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return nil, err
	}
	return t.reader.GetCancellation(ctx, run)
}

// GetSignature implements ledger.Tx.
func (t *tx) GetSignature(ctx context.Context, run ledger.RunID) (*ledger.HeadSignature, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return nil, err
	}
	return t.reader.GetSignature(ctx, run)
}

// ListEvents implements ledger.Tx.
func (t *tx) ListEvents(ctx context.Context, run ledger.RunID, sizeHint int64) ([]*ledger.Event, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return nil, err
	}
	if err := t.flushEvents(ctx); err != nil {
		return nil, err
	}
	return t.reader.ListEvents(ctx, run, sizeHint)
}

// ListEventsAfter implements ledger.Tx, as ListEvents.
func (t *tx) ListEventsAfter(ctx context.Context, f ledger.EventFilter) ([]*ledger.Event, error) {
	if err := t.lockRun(ctx, f.RunID); err != nil {
		return nil, err
	}
	if err := t.flushEvents(ctx); err != nil {
		return nil, err
	}
	return t.reader.ListEventsAfter(ctx, f)
}

// GetAction implements ledger.Tx.
func (t *tx) GetAction(ctx context.Context, id ledger.ActionID) (*ledger.Action, error) {
	return lockedRead(ctx, t, entityAction, string(id),
		func() (*ledger.Action, error) { return t.reader.GetAction(ctx, id) },
		func(a *ledger.Action) ledger.RunID { return a.RunID })
}

// GetActionByKey implements ledger.Tx.
func (t *tx) GetActionByKey(ctx context.Context, run ledger.RunID, key string) (*ledger.Action, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return nil, err
	}
	a, err := t.reader.GetActionByKey(ctx, run, key)
	if err == nil {
		t.st.hold(run, nil, entityAction, string(a.ID))
	}
	return a, err
}

// MaxActionSeq implements ledger.Tx.
func (t *tx) MaxActionSeq(ctx context.Context, run ledger.RunID) (int64, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return 0, err
	}
	return t.reader.MaxActionSeq(ctx, run)
}

// CountActions implements ledger.Tx.
func (t *tx) CountActions(ctx context.Context, run ledger.RunID, state ledger.ActionState) (int64, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return 0, err
	}
	return t.reader.CountActions(ctx, run, state)
}

// ListActions implements ledger.Tx: a run's actions after locking it; a
// list across runs reads what was committed.
func (t *tx) ListActions(ctx context.Context, f ledger.ActionFilter) ([]*ledger.Action, error) {
	if f.RunID != nil {
		if err := t.lockRun(ctx, *f.RunID); err != nil {
			return nil, err
		}
	}
	return t.reader.ListActions(ctx, f)
}

// GetAttempt implements ledger.Tx.
func (t *tx) GetAttempt(ctx context.Context, id ledger.AttemptID) (*ledger.Attempt, error) {
	return lockedRead(ctx, t, entityAttempt, string(id),
		func() (*ledger.Attempt, error) { return t.reader.GetAttempt(ctx, id) },
		func(a *ledger.Attempt) ledger.RunID { return a.RunID })
}

// LastAttempt implements ledger.Tx.
func (t *tx) LastAttempt(ctx context.Context, action ledger.ActionID) (*ledger.Attempt, error) {
	return lockedRead(ctx, t, entityAction, string(action),
		func() (*ledger.Attempt, error) { return t.reader.LastAttempt(ctx, action) },
		func(a *ledger.Attempt) ledger.RunID { return a.RunID })
}

// ListAttempts implements ledger.Tx: locked by run or action, when the
// filter names one.
func (t *tx) ListAttempts(ctx context.Context, f ledger.AttemptFilter) ([]*ledger.Attempt, error) {
	if err := t.lockFilter(ctx, f.RunID, f.ActionID); err != nil {
		return nil, err
	}
	return t.reader.ListAttempts(ctx, f)
}

// ListObservations implements ledger.Tx: locked by run, action or
// attempt, when the filter names one.
func (t *tx) ListObservations(ctx context.Context, f ledger.ObservationFilter) ([]*ledger.Observation, error) {
	if err := t.lockFilter(ctx, f.RunID, f.ActionID); err != nil {
		return nil, err
	}
	if f.RunID == nil && f.ActionID == nil && f.AttemptID != nil {
		if err := t.lockEntity(ctx, entityAttempt, string(*f.AttemptID)); err != nil {
			return nil, err
		}
	}
	return t.reader.ListObservations(ctx, f)
}

// lockFilter locks the run a list filter names, directly or by action.
func (t *tx) lockFilter(ctx context.Context, run *ledger.RunID, action *ledger.ActionID) error {
	switch {
	case run != nil:
		return t.lockRun(ctx, *run)
	case action != nil:
		return t.lockEntity(ctx, entityAction, string(*action))
	}
	return nil
}

// GetApproval implements ledger.Tx.
func (t *tx) GetApproval(ctx context.Context, id ledger.ApprovalID) (*ledger.Approval, error) {
	return lockedRead(ctx, t, entityApproval, string(id),
		func() (*ledger.Approval, error) { return t.reader.GetApproval(ctx, id) },
		func(a *ledger.Approval) ledger.RunID { return a.RunID })
}

// PendingApproval implements ledger.Tx.
func (t *tx) PendingApproval(ctx context.Context, action ledger.ActionID) (*ledger.Approval, error) {
	return lockedRead(ctx, t, entityAction, string(action),
		func() (*ledger.Approval, error) { return t.reader.PendingApproval(ctx, action) },
		func(a *ledger.Approval) ledger.RunID { return a.RunID })
}

// GrantedApproval implements ledger.Tx.
func (t *tx) GrantedApproval(ctx context.Context, action ledger.ActionID) (*ledger.Approval, error) {
	return lockedRead(ctx, t, entityAction, string(action),
		func() (*ledger.Approval, error) { return t.reader.GrantedApproval(ctx, action) },
		func(a *ledger.Approval) ledger.RunID { return a.RunID })
}

// ListApprovals implements ledger.Tx: locked by run or action, when the
// filter names one.
func (t *tx) ListApprovals(ctx context.Context, f ledger.ApprovalFilter) ([]*ledger.Approval, error) {
	if err := t.lockFilter(ctx, f.RunID, f.ActionID); err != nil {
		return nil, err
	}
	return t.reader.ListApprovals(ctx, f)
}

// CountPendingApprovals implements ledger.Tx.
func (t *tx) CountPendingApprovals(ctx context.Context, run ledger.RunID) (int64, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return 0, err
	}
	return t.reader.CountPendingApprovals(ctx, run)
}

// GetAttemptLease implements ledger.Tx.
func (t *tx) GetAttemptLease(ctx context.Context, attempt ledger.AttemptID) (*ledger.AttemptLease, error) {
	return lockedRead(ctx, t, entityAttempt, string(attempt),
		func() (*ledger.AttemptLease, error) { return t.reader.GetAttemptLease(ctx, attempt) },
		func(l *ledger.AttemptLease) ledger.RunID { return l.RunID })
}

// GetAttemptLeaseByKey implements ledger.Tx.
func (t *tx) GetAttemptLeaseByKey(ctx context.Context, action ledger.ActionID, key string) (*ledger.AttemptLease, error) {
	return lockedRead(ctx, t, entityAction, string(action),
		func() (*ledger.AttemptLease, error) { return t.reader.GetAttemptLeaseByKey(ctx, action, key) },
		func(l *ledger.AttemptLease) ledger.RunID { return l.RunID })
}

// GetAgentDecision implements ledger.Tx. A decision's action exists
// before it (a foreign key), so locking by the action is enough.
func (t *tx) GetAgentDecision(ctx context.Context, action ledger.ActionID) (*ledger.AgentDecision, error) {
	if err := t.lockEntity(ctx, entityAction, string(action)); err != nil {
		return nil, err
	}
	return t.reader.GetAgentDecision(ctx, action)
}

// ListRecoveryFacts implements ledger.Tx: the facts of one action after
// locking its run; a page across runs reads what was committed.
func (t *tx) ListRecoveryFacts(ctx context.Context, f ledger.RecoveryFilter) ([]*ledger.RecoveryFacts, []*ledger.Observation, error) {
	if f.ActionID != nil {
		if err := t.lockEntity(ctx, entityAction, string(*f.ActionID)); err != nil {
			return nil, nil, err
		}
	}
	return t.reader.ListRecoveryFacts(ctx, f)
}

// Sweeps across runs. The rules act on each row they list, so the rows'
// runs are locked, in id order (two sweeps never wait on each other in a
// cycle), and the list is read again, of those runs only: what the rules
// get is what the locks keep true. A row that became due after the first
// read waits for the next sweep.

// lockRunsOf locks, in id order, the runs of the rows q selects (q returns
// run ids) that the transaction does not hold yet, and returns every run
// it holds among them.
func (t *tx) lockRunsOf(ctx context.Context, what, q string, args ...any) ([]string, error) {
	ids, err := all(ctx, &t.reader, `SELECT id FROM runs WHERE id IN (`+q+`) ORDER BY id FOR NO KEY UPDATE`, args,
		func(rows *sql.Rows) (string, error) {
			var id string
			err := rows.Scan(&id)
			return id, err
		})
	if err != nil {
		return nil, wrapErr(what, err)
	}
	for _, id := range ids {
		t.st.hold(ledger.RunID(id), nil, 0, "")
	}
	return ids, nil
}

// ListDueApprovals implements ledger.Tx: it locks the runs of the due
// approvals, then lists the due approvals of those runs.
func (t *tx) ListDueApprovals(ctx context.Context, at time.Time) ([]*ledger.Approval, error) {
	const due = `state = ? AND expires_at IS NOT NULL AND expires_at <= ?`
	args := []any{string(ledger.ApprovalPending), sqlrows.Micros(at)}
	runs, err := t.lockRunsOf(ctx, "list due approvals", `SELECT run_id FROM approvals WHERE `+due, args...)
	if err != nil || len(runs) == 0 {
		return []*ledger.Approval{}, err
	}
	out, err := all(ctx, &t.reader, `SELECT `+sqlrows.ApprovalCols+` FROM approvals WHERE `+due+` AND run_id IN ? ORDER BY id`,
		append(args, runs), sqlrows.ScanApproval)
	return out, wrapErr("list due approvals", err)
}

// ListUnsettledCancellations implements ledger.Tx: it locks the runs of
// the unsettled cancellations, then lists those runs' unsettled ones.
func (t *tx) ListUnsettledCancellations(ctx context.Context) ([]*ledger.Cancellation, error) {
	const unsettled = sqlrows.UnsettledCancellation
	runs, err := t.lockRunsOf(ctx, "list unsettled cancellations", `SELECT run_id FROM cancellations WHERE `+unsettled)
	if err != nil || len(runs) == 0 {
		return []*ledger.Cancellation{}, err
	}
	out, err := all(ctx, &t.reader, `SELECT `+sqlrows.CancellationCols+` FROM cancellations WHERE `+unsettled+` AND run_id IN ? ORDER BY id`,
		[]any{runs}, sqlrows.ScanCancellation)
	return out, wrapErr("list unsettled cancellations", err)
}

// tenantLockSpace is the first key of the advisory locks on tenants (the
// second is the hash of the tenant's name): "lt" in ASCII.
const tenantLockSpace int32 = 0x6c74

// CountWaiting implements ledger.Tx. SubmitRun counts before it inserts a
// run, across the tenant's runs, so it first takes an advisory lock on the
// tenant for the rest of the write: two submits of one tenant under a cap
// count one after the other and the cap holds exactly, while submits of
// other tenants, and submits without a cap (which do not count), run in
// parallel. Two tenants whose names hash alike merely share the lock.
func (t *tx) CountWaiting(ctx context.Context, tenant string, limit int) (int, error) {
	if _, err := t.exec(ctx, `SELECT pg_advisory_xact_lock(?, hashtext(?))`, tenantLockSpace, tenant); err != nil {
		return 0, wrapErr("lock tenant "+tenant, err)
	}
	return t.reader.CountWaiting(ctx, tenant, limit)
}
