package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
)

// conn is where a reader's statements run: the writer's transaction, a
// read snapshot or the reader pool. Hot reads are plain SQL declared with
// declare (stmts.go) and run through query; the rest go through GORM on
// db, the same connection.
type conn struct {
	db    *gorm.DB
	query func(ctx context.Context, st *stmt, args ...any) (*sql.Rows, error)
	// snap runs fn on one snapshot: the transaction itself, or a read
	// transaction of the pool.
	snap func(ctx context.Context, fn func(*gorm.DB) error) error
}

// reader implements ledger.Reader on a conn.
type reader struct{ c conn }

var _ ledger.Reader = reader{}

// one scans the first row of st's answer with scan; no row is
// CodeNotFound, with what naming the object.
func (r reader) one(ctx context.Context, what string, st *stmt, scan func(*sql.Rows) error, args ...any) error {
	rows, err := r.c.query(ctx, st, args...)
	return scanOne(rows, err, what, scan)
}

// snapshot runs fn on one snapshot.
func (r reader) snapshot(ctx context.Context, fn func(*gorm.DB) error) error {
	return r.c.snap(ctx, fn)
}

// gorm is the GORM handle for ctx.
func (r reader) gorm(ctx context.Context) *gorm.DB { return r.c.db.WithContext(ctx) }

var (
	findRunSQL = declare(`SELECT ` + runBudgetCols + `
FROM runs r JOIN budgets b ON b.run_id = r.id WHERE r.id = ?`)
	findRunByRequestSQL = declare(`SELECT ` + runBudgetCols + `
FROM runs r JOIN budgets b ON b.run_id = r.id WHERE r.tenant = ? AND r.submitted_by = ? AND r.idempotency_key = ?`)
	countWaitingSQL = declare(`SELECT
	(SELECT COUNT(*) FROM (SELECT 1 FROM approvals WHERE tenant = ? AND state = 'pending' LIMIT ?)) +
	(SELECT COUNT(*) FROM (SELECT 1 FROM runs WHERE tenant = ? AND state IN ('queued', 'running') LIMIT ?))`)
	selectHeadSQL      = declare(`SELECT event_seq, event_hash FROM runs WHERE id = ?`)
	findActionSQL      = declare(`SELECT ` + actionCols + ` FROM actions WHERE id = ?`)
	findActionByKeySQL = declare(`SELECT ` + actionCols + ` FROM actions WHERE run_id = ? AND idempotency_key = ?`)
	maxActionSeqSQL    = declare(`SELECT COALESCE(MAX(seq), 0) FROM actions WHERE run_id = ?`)
	countActionsSQL    = declare(`SELECT COUNT(*) FROM actions WHERE run_id = ? AND state = ?`)
	findAttemptSQL     = declare(`SELECT ` + attemptCols + ` FROM attempts WHERE id = ?`)
	lastAttemptSQL     = declare(`SELECT ` + attemptCols + ` FROM attempts WHERE action_id = ? ORDER BY attempt_no DESC LIMIT 1`)
	findApprovalSQL    = declare(`SELECT ` + approvalCols + ` FROM approvals WHERE id = ?`)
	pendingApprovalSQL = declare(`SELECT ` + approvalCols + ` FROM approvals WHERE action_id = ? AND state = 'pending'`)
	countPendingSQL    = declare(`SELECT COUNT(*) FROM approvals WHERE run_id = ? AND state = 'pending'`)
	findCancelSQL      = declare(`SELECT ` + cancellationCols + ` FROM cancellations WHERE run_id = ?`)
)

func scanRun(rows *sql.Rows) (*ledger.Run, error) {
	var (
		r runRow
		b budgetRow
	)
	if err := rows.Scan(runBudgetTargets(&r, &b)...); err != nil {
		return nil, err
	}
	b.RunID = r.ID
	return r.toRun(&b), nil
}

func (r reader) GetRun(ctx context.Context, id ledger.RunID) (*ledger.Run, error) {
	var out *ledger.Run
	err := r.one(ctx, "run "+string(id), findRunSQL, func(rows *sql.Rows) (err error) { out, err = scanRun(rows); return err }, string(id))
	return out, translate(err)
}

func (r reader) GetRunByRequest(ctx context.Context, tenant, principal, key string) (*ledger.Run, error) {
	var out *ledger.Run
	err := r.one(ctx, "run of key "+key, findRunByRequestSQL, func(rows *sql.Rows) (err error) { out, err = scanRun(rows); return err },
		tenant, principal, key)
	return out, translate(err)
}

func (r reader) ListRuns(ctx context.Context, f ledger.RunFilter) ([]*ledger.Run, error) {
	q := r.gorm(ctx).Model(&runRow{})
	if f.Tenant != nil {
		q = q.Where("tenant = ?", *f.Tenant)
	}
	if f.State != nil {
		q = q.Where("state = ?", *f.State)
	}
	if f.SubmittedBy != nil {
		q = q.Where("submitted_by = ?", *f.SubmittedBy)
	}
	if f.AfterID != nil {
		q = q.Where("id > ?", *f.AfterID)
	}
	if len(f.NotAgents) > 0 {
		q = q.Where("agent NOT IN ?", f.NotAgents)
	}
	if f.Limit > 0 {
		q = q.Limit(f.Limit)
	}
	var rows []runRow
	if err := q.Order("id").Find(&rows).Error; err != nil {
		return nil, translate(err)
	}
	if len(rows) == 0 {
		return []*ledger.Run{}, nil
	}
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = rows[i].ID
	}
	var budgets []budgetRow
	if err := r.gorm(ctx).Where("run_id IN ?", ids).Find(&budgets).Error; err != nil {
		return nil, translate(err)
	}
	byRun := make(map[string]*budgetRow, len(budgets))
	for i := range budgets {
		byRun[budgets[i].RunID] = &budgets[i]
	}
	out := make([]*ledger.Run, len(rows))
	for i := range rows {
		out[i] = rows[i].toRun(byRun[rows[i].ID])
	}
	return out, nil
}

func (r reader) CountWaiting(ctx context.Context, tenant string, limit int) (int, error) {
	var n int
	err := r.one(ctx, "waiting", countWaitingSQL, func(rows *sql.Rows) error { return rows.Scan(&n) }, tenant, limit, tenant, limit)
	return n, translate(err)
}

func (r reader) ChainHead(ctx context.Context, run ledger.RunID) (int64, string, error) {
	var (
		seq  int64
		hash string
	)
	err := r.one(ctx, "run "+string(run), selectHeadSQL, func(rows *sql.Rows) error { return rows.Scan(&seq, &hash) }, string(run))
	return seq, hash, translate(err)
}

func (r reader) action(ctx context.Context, what string, st *stmt, args ...any) (*ledger.Action, error) {
	var row actionRow
	if err := r.one(ctx, what, st, func(rows *sql.Rows) error { return scanAction(rows, &row) }, args...); err != nil {
		return nil, translate(err)
	}
	return row.toAction(), nil
}

func (r reader) GetAction(ctx context.Context, id ledger.ActionID) (*ledger.Action, error) {
	return r.action(ctx, "action "+string(id), findActionSQL, string(id))
}

func (r reader) GetActionByKey(ctx context.Context, run ledger.RunID, key string) (*ledger.Action, error) {
	return r.action(ctx, "action", findActionByKeySQL, string(run), key)
}

func (r reader) count(ctx context.Context, st *stmt, args ...any) (int64, error) {
	var n int64
	err := r.one(ctx, "count", st, func(rows *sql.Rows) error { return rows.Scan(&n) }, args...)
	return n, translate(err)
}

func (r reader) MaxActionSeq(ctx context.Context, run ledger.RunID) (int64, error) {
	return r.count(ctx, maxActionSeqSQL, string(run))
}

func (r reader) ListActions(ctx context.Context, f ledger.ActionFilter) ([]*ledger.Action, error) {
	var w where
	if f.RunID != nil {
		w.eq("run_id", string(*f.RunID))
	}
	if f.Tenant != nil {
		w.eq("tenant", *f.Tenant)
	}
	if f.State != nil {
		w.eq("state", string(*f.State))
	}
	rows, err := r.c.query(ctx, &stmt{sql: w.query(`SELECT `+actionCols+` FROM actions`, "run_id, seq", f.Limit), index: -1}, w.args...)
	if err != nil {
		return nil, translate(err)
	}
	out, err := scanAll(rows, func(rows *sql.Rows) (*ledger.Action, error) {
		var a actionRow
		if err := scanAction(rows, &a); err != nil {
			return nil, err
		}
		return a.toAction(), nil
	})
	return out, translate(err)
}

func (r reader) CountActions(ctx context.Context, run ledger.RunID, state ledger.ActionState) (int64, error) {
	return r.count(ctx, countActionsSQL, string(run), string(state))
}

func (r reader) attempt(ctx context.Context, what string, st *stmt, args ...any) (*ledger.Attempt, error) {
	var row attemptRow
	if err := r.one(ctx, what, st, func(rows *sql.Rows) error { return scanAttempt(rows, &row) }, args...); err != nil {
		return nil, translate(err)
	}
	a, err := row.toAttempt()
	return a, translate(err)
}

func (r reader) GetAttempt(ctx context.Context, id ledger.AttemptID) (*ledger.Attempt, error) {
	return r.attempt(ctx, "attempt "+string(id), findAttemptSQL, string(id))
}

func (r reader) LastAttempt(ctx context.Context, action ledger.ActionID) (*ledger.Attempt, error) {
	return r.attempt(ctx, "attempt of action "+string(action), lastAttemptSQL, string(action))
}

func (r reader) ListAttempts(ctx context.Context, f ledger.AttemptFilter) ([]*ledger.Attempt, error) {
	var w where
	if f.ActionID != nil {
		w.eq("action_id", string(*f.ActionID))
	}
	if f.RunID != nil {
		w.eq("run_id", string(*f.RunID))
	}
	if f.Status != nil {
		w.eq("status", string(*f.Status))
	}
	rows, err := r.c.query(ctx, &stmt{sql: w.query(`SELECT `+attemptCols+` FROM attempts`, "action_id, attempt_no", f.Limit), index: -1}, w.args...)
	if err != nil {
		return nil, translate(err)
	}
	out, err := scanAll(rows, func(rows *sql.Rows) (*ledger.Attempt, error) {
		var a attemptRow
		if err := scanAttempt(rows, &a); err != nil {
			return nil, err
		}
		return a.toAttempt()
	})
	return out, translate(err)
}

// observationsQuery selects the observations f matches, in time order.
func observationsQuery(db *gorm.DB, f ledger.ObservationFilter) *gorm.DB {
	q := db.Model(&observationRow{})
	if f.RunID != nil {
		q = q.Where("run_id = ? AND action_id IN (SELECT id FROM actions WHERE run_id = ?)", *f.RunID, *f.RunID)
	}
	if f.ActionID != nil {
		q = q.Where("action_id = ?", *f.ActionID)
	}
	if f.AttemptID != nil {
		q = q.Where("attempt_id = ?", *f.AttemptID)
	}
	return q.Order("observed_at, id")
}

func (r reader) ListObservations(ctx context.Context, f ledger.ObservationFilter) ([]*ledger.Observation, error) {
	var rows []observationRow
	if err := observationsQuery(r.gorm(ctx), f).Find(&rows).Error; err != nil {
		return nil, translate(err)
	}
	out := make([]*ledger.Observation, len(rows))
	for i := range rows {
		out[i] = rows[i].toObservation()
	}
	return out, nil
}

func (r reader) approval(ctx context.Context, what string, st *stmt, args ...any) (*ledger.Approval, error) {
	var row approvalRow
	if err := r.one(ctx, what, st, func(rows *sql.Rows) error { return rows.Scan(row.targets()...) }, args...); err != nil {
		return nil, translate(err)
	}
	return row.toApproval(), nil
}

func (r reader) GetApproval(ctx context.Context, id ledger.ApprovalID) (*ledger.Approval, error) {
	return r.approval(ctx, "approval "+string(id), findApprovalSQL, string(id))
}

func (r reader) PendingApproval(ctx context.Context, action ledger.ActionID) (*ledger.Approval, error) {
	return r.approval(ctx, "pending approval of action "+string(action), pendingApprovalSQL, string(action))
}

func (r reader) approvals(q *gorm.DB) ([]*ledger.Approval, error) {
	var rows []approvalRow
	if err := q.Find(&rows).Error; err != nil {
		return nil, translate(err)
	}
	out := make([]*ledger.Approval, len(rows))
	for i := range rows {
		out[i] = rows[i].toApproval()
	}
	return out, nil
}

func (r reader) ListApprovals(ctx context.Context, f ledger.ApprovalFilter) ([]*ledger.Approval, error) {
	return r.approvals(approvalsQuery(r.gorm(ctx), f))
}

// approvalsQuery selects the approvals f matches, in id order.
func approvalsQuery(db *gorm.DB, f ledger.ApprovalFilter) *gorm.DB {
	q := db.Model(&approvalRow{})
	if f.Tenant != nil {
		q = q.Where("tenant = ?", *f.Tenant)
	}
	if f.State != nil {
		q = q.Where("state = ?", *f.State)
	}
	if f.ActionID != nil {
		q = q.Where("action_id = ?", *f.ActionID)
	}
	if f.RunID != nil {
		q = q.Where("run_id = ?", *f.RunID)
	}
	if f.AfterID != nil {
		q = q.Where("id > ?", *f.AfterID)
	}
	if f.Limit > 0 {
		q = q.Limit(f.Limit)
	}
	return q.Order("id")
}

func (r reader) CountPendingApprovals(ctx context.Context, run ledger.RunID) (int64, error) {
	return r.count(ctx, countPendingSQL, string(run))
}

func (r reader) ListDueApprovals(ctx context.Context, at time.Time) ([]*ledger.Approval, error) {
	return r.approvals(r.gorm(ctx).Where("state = ? AND expires_at IS NOT NULL AND expires_at <= ?",
		ledger.ApprovalPending, micros(at)).Order("id"))
}

func (r reader) GetCancellation(ctx context.Context, run ledger.RunID) (*ledger.Cancellation, error) {
	var row cancellationRow
	if err := r.one(ctx, "cancellation of run "+string(run), findCancelSQL, func(rows *sql.Rows) error {
		return rows.Scan(row.targets()...)
	}, string(run)); err != nil {
		return nil, translate(err)
	}
	return row.toCancellation(), nil
}

func (r reader) ListUnsettledCancellations(ctx context.Context) ([]*ledger.Cancellation, error) {
	var rows []cancellationRow
	if err := unsettledCancellations(r.gorm(ctx)).Find(&rows).Error; err != nil {
		return nil, translate(err)
	}
	out := make([]*ledger.Cancellation, len(rows))
	for i := range rows {
		out[i] = rows[i].toCancellation()
	}
	return out, nil
}

func (r reader) lease(q *gorm.DB, what string) (*ledger.AttemptLease, error) {
	var row leaseRow
	if err := q.Take(&row).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, ledger.Errorf(ledger.CodeNotFound, "%s has no lease", what)
		}
		return nil, translate(err)
	}
	return row.toLease(), nil
}

func (r reader) GetAttemptLease(ctx context.Context, attempt ledger.AttemptID) (*ledger.AttemptLease, error) {
	return r.lease(r.gorm(ctx).Where("attempt_id = ?", string(attempt)), "attempt "+string(attempt))
}

func (r reader) GetAttemptLeaseByKey(ctx context.Context, action ledger.ActionID, key string) (*ledger.AttemptLease, error) {
	return r.lease(r.gorm(ctx).Where("action_id = ? AND begin_key = ?", string(action), key), "begin key of action "+string(action))
}

func (r reader) ListLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*ledger.AttemptLease, error) {
	q := r.gorm(ctx).Where("outcome_digest IS NULL AND lease_until < ? AND attempt_id IN (SELECT id FROM attempts WHERE status = ?)",
		micros(before), string(ledger.AttemptStarted)).Order("lease_until, attempt_id")
	if limit > 0 {
		q = q.Limit(limit)
	}
	var rows []leaseRow
	if err := q.Find(&rows).Error; err != nil {
		return nil, translate(err)
	}
	out := make([]*ledger.AttemptLease, len(rows))
	for i := range rows {
		out[i] = rows[i].toLease()
	}
	return out, nil
}

func (r reader) GetAgentDecision(ctx context.Context, action ledger.ActionID) (*ledger.AgentDecision, error) {
	var row agentDecisionRow
	if err := r.gorm(ctx).Where("action_id = ?", string(action)).Take(&row).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, ledger.Errorf(ledger.CodeNotFound, "no decision was told about action %s", action)
		}
		return nil, translate(err)
	}
	return row.toDecision(), nil
}

// findChainEventsSQL reads a run's events in chain order. FindChain and
// FindEvents read every event of a run for each evidence export and
// timeline, so the rows are scanned by hand into one slab of Events rather
// than through GORM's reflection into rows that are then copied.
var findChainEventsSQL = declare(`SELECT id, run_id, seq, type, entity_type, entity_id, from_state, to_state,
	actor, data, created_at, prev_hash, hash, format, row_digests FROM events WHERE run_id = ? ORDER BY seq`)

// ListEvents reads run's events. The query runs without the caller's
// cancellation: for a cancellable context mattn/go-sqlite3 steps every row
// on a goroutine of its own and hands it back over a channel, which for a
// 10,000-event chain took as long as the rest of the read. The context is
// checked before the query and after the rows end.
func (r reader) ListEvents(ctx context.Context, run ledger.RunID, sizeHint int64) ([]*ledger.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, translate(err)
	}
	rows, err := r.c.query(context.WithoutCancel(ctx), findChainEventsSQL, string(run))
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	out, err := scanEvents(ctx, rows, sizeHint)
	return out, translate(err)
}

// scanEvents scans rows of findChainEventsSQL's columns; if ctx is done
// when they end or fail, its error is the result. The Events share one
// backing array; Data and Rows are nil for SQL NULL.
func scanEvents(ctx context.Context, rows *sql.Rows, want int64) ([]*ledger.Event, error) {
	slab := make([]ledger.Event, 0, max(0, min(want, 1<<20)))
	var created int64
	for rows.Next() {
		slab = append(slab, ledger.Event{})
		e := &slab[len(slab)-1]
		if err := rows.Scan((*string)(&e.ID), (*string)(&e.RunID), &e.Seq, &e.Type, &e.EntityType, &e.EntityID,
			&e.FromState, &e.ToState, &e.Actor, (*[]byte)(&e.Data), &created, &e.PrevHash, &e.Hash, &e.Format,
			(*[]byte)(&e.Rows)); err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr
			}
			return nil, fmt.Errorf("scan event %d: %w", len(slab), err)
		}
		e.CreatedAt = fromMicros(created)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]*ledger.Event, len(slab))
	for i := range slab {
		out[i] = &slab[i]
	}
	return out, nil
}

func (r reader) GetSignature(ctx context.Context, run ledger.RunID) (*ledger.HeadSignature, error) {
	var sig []signatureRow
	if err := r.gorm(ctx).Where("run_id = ?", string(run)).Limit(1).Find(&sig).Error; err != nil {
		return nil, translate(err)
	}
	if len(sig) == 0 {
		return nil, ledger.Errorf(ledger.CodeNotFound, "run %s has no signed head", run)
	}
	return sig[0].toSignature(), nil
}

// scanOne scans the first row of a query's answer (rows, err) with scan;
// no row is CodeNotFound, with what naming the object.
func scanOne(rows *sql.Rows, err error, what string, scan func(*sql.Rows) error) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return ledger.Errorf(ledger.CodeNotFound, "%s not found", what)
	}
	if err := scan(rows); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return rows.Close()
}

// scanAll scans every row with scan and closes rows.
func scanAll[T any](rows *sql.Rows, scan func(*sql.Rows) (T, error)) ([]T, error) {
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// unsettledCancellations selects the cancellations not yet stopped or too
// late. The partial index cancellations_unsettled holds only those, so
// this reads the few unsettled rows, not the table.
func unsettledCancellations(db *gorm.DB) *gorm.DB {
	return db.Model(&cancellationRow{}).Where("state IN ('requested', 'accepted', 'stopping')").Order("id")
}
