package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
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
	findRunSQL          = declare(sqlrows.GetRunSQL)
	findRunByRequestSQL = declare(sqlrows.GetRunByRequestSQL)
	countWaitingSQL     = declare(sqlrows.CountWaitingSQL)
	selectHeadSQL       = declare(sqlrows.ChainHeadSQL)
	findActionSQL       = declare(sqlrows.GetActionSQL)
	findActionByKeySQL  = declare(sqlrows.GetActionByKeySQL)
	maxActionSeqSQL     = declare(sqlrows.MaxActionSeqSQL)
	countActionsSQL     = declare(sqlrows.CountActionsSQL)
	findAttemptSQL      = declare(sqlrows.GetAttemptSQL)
	lastAttemptSQL      = declare(sqlrows.LastAttemptSQL)
	findApprovalSQL     = declare(sqlrows.GetApprovalSQL)
	pendingApprovalSQL  = declare(sqlrows.PendingApprovalSQL)
	grantedApprovalSQL  = declare(sqlrows.GrantedApprovalSQL)
	countPendingSQL     = declare(sqlrows.CountPendingSQL)
	findCancelSQL       = declare(sqlrows.GetCancellationSQL)
)

func (r reader) GetRun(ctx context.Context, id ledger.RunID) (*ledger.Run, error) {
	var out *ledger.Run
	err := r.one(ctx, "run "+string(id), findRunSQL, func(rows *sql.Rows) (err error) { out, err = sqlrows.ScanRun(rows); return err }, string(id))
	return out, translate(err)
}

func (r reader) GetRunByRequest(ctx context.Context, tenant, principal, key string) (*ledger.Run, error) {
	var out *ledger.Run
	err := r.one(ctx, "run of key "+key, findRunByRequestSQL, func(rows *sql.Rows) (err error) { out, err = sqlrows.ScanRun(rows); return err },
		tenant, principal, key)
	return out, translate(err)
}

func (r reader) ListRuns(ctx context.Context, f ledger.RunFilter) ([]*ledger.Run, error) {
	q := r.gorm(ctx).Model(&sqlrows.Run{})
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
	var rows []sqlrows.Run
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
	var budgets []sqlrows.Budget
	if err := r.gorm(ctx).Where("run_id IN ?", ids).Find(&budgets).Error; err != nil {
		return nil, translate(err)
	}
	byRun := make(map[string]*sqlrows.Budget, len(budgets))
	for i := range budgets {
		byRun[budgets[i].RunID] = &budgets[i]
	}
	out := make([]*ledger.Run, len(rows))
	for i := range rows {
		out[i] = rows[i].ToRun(byRun[rows[i].ID])
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
	var row sqlrows.Action
	if err := r.one(ctx, what, st, func(rows *sql.Rows) error { return rows.Scan(row.Targets()...) }, args...); err != nil {
		return nil, translate(err)
	}
	return row.ToAction(), nil
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
	q, args := sqlrows.ListActions(f)
	rows, err := r.c.query(ctx, &stmt{sql: q, index: -1}, args...)
	if err != nil {
		return nil, translate(err)
	}
	out, err := sqlrows.ScanAll(rows, sqlrows.ScanAction)
	return out, translate(err)
}

func (r reader) CountActions(ctx context.Context, run ledger.RunID, state ledger.ActionState) (int64, error) {
	return r.count(ctx, countActionsSQL, string(run), string(state))
}

func (r reader) attempt(ctx context.Context, what string, st *stmt, args ...any) (*ledger.Attempt, error) {
	var row sqlrows.Attempt
	if err := r.one(ctx, what, st, func(rows *sql.Rows) error { return rows.Scan(row.Targets()...) }, args...); err != nil {
		return nil, translate(err)
	}
	a, err := row.ToAttempt()
	return a, translate(err)
}

func (r reader) GetAttempt(ctx context.Context, id ledger.AttemptID) (*ledger.Attempt, error) {
	return r.attempt(ctx, "attempt "+string(id), findAttemptSQL, string(id))
}

func (r reader) LastAttempt(ctx context.Context, action ledger.ActionID) (*ledger.Attempt, error) {
	return r.attempt(ctx, "attempt of action "+string(action), lastAttemptSQL, string(action))
}

func (r reader) ListAttempts(ctx context.Context, f ledger.AttemptFilter) ([]*ledger.Attempt, error) {
	q, args := sqlrows.ListAttempts(f)
	rows, err := r.c.query(ctx, &stmt{sql: q, index: -1}, args...)
	if err != nil {
		return nil, translate(err)
	}
	out, err := sqlrows.ScanAll(rows, sqlrows.ScanAttempt)
	return out, translate(err)
}

// observationsQuery selects the observations f matches, in time order.
func observationsQuery(db *gorm.DB, f ledger.ObservationFilter) *gorm.DB {
	q := db.Model(&sqlrows.Observation{})
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
	var rows []sqlrows.Observation
	if err := observationsQuery(r.gorm(ctx), f).Find(&rows).Error; err != nil {
		return nil, translate(err)
	}
	out := make([]*ledger.Observation, len(rows))
	for i := range rows {
		out[i] = rows[i].ToObservation()
	}
	return out, nil
}

func (r reader) approval(ctx context.Context, what string, st *stmt, args ...any) (*ledger.Approval, error) {
	var row sqlrows.Approval
	if err := r.one(ctx, what, st, func(rows *sql.Rows) error { return rows.Scan(row.Targets()...) }, args...); err != nil {
		return nil, translate(err)
	}
	return row.ToApproval(), nil
}

func (r reader) GetApproval(ctx context.Context, id ledger.ApprovalID) (*ledger.Approval, error) {
	return r.approval(ctx, "approval "+string(id), findApprovalSQL, string(id))
}

func (r reader) PendingApproval(ctx context.Context, action ledger.ActionID) (*ledger.Approval, error) {
	return r.approval(ctx, "pending approval of action "+string(action), pendingApprovalSQL, string(action))
}

func (r reader) GrantedApproval(ctx context.Context, action ledger.ActionID) (*ledger.Approval, error) {
	return r.approval(ctx, "granted approval of action "+string(action), grantedApprovalSQL, string(action))
}

func (r reader) approvals(q *gorm.DB) ([]*ledger.Approval, error) {
	var rows []sqlrows.Approval
	if err := q.Find(&rows).Error; err != nil {
		return nil, translate(err)
	}
	out := make([]*ledger.Approval, len(rows))
	for i := range rows {
		out[i] = rows[i].ToApproval()
	}
	return out, nil
}

func (r reader) ListApprovals(ctx context.Context, f ledger.ApprovalFilter) ([]*ledger.Approval, error) {
	return r.approvals(approvalsQuery(r.gorm(ctx), f))
}

// approvalsQuery selects the approvals f matches, in id order.
func approvalsQuery(db *gorm.DB, f ledger.ApprovalFilter) *gorm.DB {
	q := db.Model(&sqlrows.Approval{})
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
		ledger.ApprovalPending, sqlrows.Micros(at)).Order("id"))
}

func (r reader) GetCancellation(ctx context.Context, run ledger.RunID) (*ledger.Cancellation, error) {
	var row sqlrows.Cancellation
	if err := r.one(ctx, "cancellation of run "+string(run), findCancelSQL, func(rows *sql.Rows) error {
		return rows.Scan(row.Targets()...)
	}, string(run)); err != nil {
		return nil, translate(err)
	}
	return row.ToCancellation(), nil
}

func (r reader) ListUnsettledCancellations(ctx context.Context) ([]*ledger.Cancellation, error) {
	var rows []sqlrows.Cancellation
	if err := unsettledCancellations(r.gorm(ctx)).Find(&rows).Error; err != nil {
		return nil, translate(err)
	}
	out := make([]*ledger.Cancellation, len(rows))
	for i := range rows {
		out[i] = rows[i].ToCancellation()
	}
	return out, nil
}

func (r reader) lease(q *gorm.DB, what string) (*ledger.AttemptLease, error) {
	var row sqlrows.Lease
	if err := q.Take(&row).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, ledger.Errorf(ledger.CodeNotFound, "%s has no lease", what)
		}
		return nil, translate(err)
	}
	return row.ToLease(), nil
}

func (r reader) GetAttemptLease(ctx context.Context, attempt ledger.AttemptID) (*ledger.AttemptLease, error) {
	return r.lease(r.gorm(ctx).Where("attempt_id = ?", string(attempt)), "attempt "+string(attempt))
}

func (r reader) GetAttemptLeaseByKey(ctx context.Context, action ledger.ActionID, key string) (*ledger.AttemptLease, error) {
	return r.lease(r.gorm(ctx).Where("action_id = ? AND begin_key = ?", string(action), key), "begin key of action "+string(action))
}

func (r reader) ListLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*ledger.AttemptLease, error) {
	w := sqlrows.LapsedLeasesWhere(before)
	rows, err := r.c.query(ctx, &stmt{sql: w.Query(`SELECT `+sqlrows.LeaseCols+` FROM attempt_leases`, "lease_until, attempt_id", limit),
		index: -1}, w.Args...)
	if err != nil {
		return nil, translate(err)
	}
	out, err := sqlrows.ScanAll(rows, sqlrows.ScanLease)
	return out, translate(err)
}

func (r reader) ListAgentDecisions(ctx context.Context, f ledger.AgentDecisionFilter) ([]*ledger.AgentDecision, error) {
	q, args := sqlrows.ListAgentDecisions(f)
	rows, err := r.c.query(ctx, &stmt{sql: q, index: -1}, args...)
	if err != nil {
		return nil, translate(err)
	}
	out, err := sqlrows.ScanAll(rows, sqlrows.ScanDecision)
	return out, translate(err)
}

func (r reader) GetAgentDecision(ctx context.Context, action ledger.ActionID) (*ledger.AgentDecision, error) {
	var row sqlrows.Decision
	if err := r.gorm(ctx).Where("action_id = ?", string(action)).Take(&row).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, ledger.Errorf(ledger.CodeNotFound, "no decision was told about action %s", action)
		}
		return nil, translate(err)
	}
	return row.ToDecision(), nil
}

// findChainEventsSQL reads a run's events in chain order. FindChain and
// FindEvents read every event of a run for each evidence export and
// timeline, so the rows are scanned by hand into one slab of Events rather
// than through GORM's reflection into rows that are then copied.
var findChainEventsSQL = declare(sqlrows.ListEventsSQL)

// findEventsAfterSQL reads a page of a run's events after a seq: an event
// stream's poll.
var findEventsAfterSQL = declare(sqlrows.ListEventsAfterSQL)

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
	out, err := sqlrows.ScanEvents(ctx, rows, sizeHint)
	return out, translate(err)
}

// ListEventsAfter reads run's events after a seq, as ListEvents reads them
// all.
func (r reader) ListEventsAfter(ctx context.Context, f ledger.EventFilter) ([]*ledger.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, translate(err)
	}
	limit := noLimit
	if f.Limit > 0 {
		limit = f.Limit
	}
	rows, err := r.c.query(context.WithoutCancel(ctx), findEventsAfterSQL, string(f.RunID), f.AfterSeq, limit)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	out, err := sqlrows.ScanEvents(ctx, rows, 0)
	return out, translate(err)
}

func (r reader) GetSignature(ctx context.Context, run ledger.RunID) (*ledger.HeadSignature, error) {
	var sig []sqlrows.Signature
	if err := r.gorm(ctx).Where("run_id = ?", string(run)).Limit(1).Find(&sig).Error; err != nil {
		return nil, translate(err)
	}
	if len(sig) == 0 {
		return nil, ledger.Errorf(ledger.CodeNotFound, "run %s has no signed head", run)
	}
	return sig[0].ToSignature(), nil
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

// unsettledCancellations selects the cancellations not yet stopped or too
// late (sqlrows.UnsettledCancellation), in id order.
func unsettledCancellations(db *gorm.DB) *gorm.DB {
	return db.Model(&sqlrows.Cancellation{}).Where(sqlrows.UnsettledCancellation).Order("id")
}

var (
	getRuleSetSQL        = declare(sqlrows.GetRuleSetSQL)
	listRuleSetsSQL      = declare(sqlrows.ListRuleSetsSQL)
	listRuleSetsLimitSQL = declare(sqlrows.ListRuleSetsLimitSQL)
)

func (r reader) GetRuleSet(ctx context.Context, digest ledger.Digest) (*ledger.RuleSet, error) {
	var row sqlrows.RuleSet
	if err := r.one(ctx, "rule set "+string(digest), getRuleSetSQL, func(rows *sql.Rows) error {
		return rows.Scan(row.Targets()...)
	}, string(digest)); err != nil {
		return nil, translate(err)
	}
	return row.ToRuleSet(), nil
}

func (r reader) ListRuleSets(ctx context.Context, limit int) ([]*ledger.RuleSet, error) {
	st, args := listRuleSetsSQL, []any(nil)
	if limit > 0 {
		st, args = listRuleSetsLimitSQL, []any{limit}
	}
	rows, err := r.c.query(ctx, st, args...)
	if err != nil {
		return nil, translate(err)
	}
	out, err := sqlrows.ScanAll(rows, sqlrows.ScanRuleSet)
	return out, translate(err)
}
