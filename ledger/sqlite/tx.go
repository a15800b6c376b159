package sqlite

import (
	"context"
	"database/sql"
	"math"
	"time"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// tx implements ledger.Tx on one write of a group commit: its statements
// run on the writer's connection, in the batch's transaction, inside the
// write's savepoint.
type tx struct {
	reader
	conn  *sql.Conn
	stmts []*sql.Stmt     // prepared on conn
	ctx   context.Context // the write's own, without cancellation (groupcommit.go)
}

var _ ledger.Tx = (*tx)(nil)

// newTx is the write's tx on the writer's connection wc, in a
// transaction; db is GORM on that connection.
func newTx(ctx context.Context, db *gorm.DB, wc *sql.Conn, stmts []*sql.Stmt) *tx {
	t := &tx{conn: wc, stmts: stmts, ctx: ctx}
	t.reader = reader{c: conn{
		db:    db.WithContext(ctx),
		query: func(_ context.Context, st *stmt, args ...any) (*sql.Rows, error) { return t.queryRows(st, args...) },
		snap:  func(_ context.Context, fn func(*gorm.DB) error) error { return fn(db.WithContext(ctx)) },
	}}
	return t
}

// queryRows and exec run st in the transaction, prepared at Open; a
// statement built at run time (index -1) is run by its text.
func (t *tx) queryRows(st *stmt, args ...any) (*sql.Rows, error) {
	if st.index < 0 {
		return t.conn.QueryContext(t.ctx, st.sql, args...)
	}
	return t.stmts[st.index].QueryContext(t.ctx, args...)
}

func (t *tx) exec(st *stmt, args ...any) (sql.Result, error) {
	if st.index < 0 {
		return t.conn.ExecContext(t.ctx, st.sql, args...)
	}
	return t.stmts[st.index].ExecContext(t.ctx, args...)
}

// execOne runs a guarded statement and reports whether it changed a row.
func (t *tx) execOne(st *stmt, args ...any) (bool, error) {
	res, err := t.exec(st, args...)
	if err != nil {
		return false, translate(err)
	}
	n, err := res.RowsAffected()
	return n > 0, translate(err)
}

// moved scans the RETURNING row of a guarded UPDATE; false if none.
func (t *tx) moved(st *stmt, scan func(*sql.Rows) error, args ...any) (bool, error) {
	rows, err := t.queryRows(st, args...)
	err = scanOne(rows, err, "row", scan)
	switch {
	case ledger.Code(err) == ledger.CodeNotFound:
		return false, nil
	case err != nil:
		return false, translate(err)
	}
	return true, nil
}

var (
	insertRunSQL    = declare(sqlrows.InsertRunSQL)
	insertBudgetSQL = declare(sqlrows.InsertBudgetSQL)
	// A run's move hands back its content alone (RunContent): what the
	// ledger reads of it.
	moveRunSQL = declare(`UPDATE runs SET state = ?, stop_reason = ?, version = version + 1, updated_at = ?
	WHERE id = ? AND state = ? RETURNING ` + sqlrows.RunContentCols)
	addUsageSQL = declare(`UPDATE budgets SET steps_used = steps_used + ?, tokens_used = tokens_used + ?,
	execution_used_us = execution_used_us + ?, tokens_unavailable = tokens_unavailable OR ?, version = version + 1
	WHERE run_id = ? AND steps_used <= ? AND tokens_used <= ? AND execution_used_us <= ?
	RETURNING ` + sqlrows.BudgetCols)
	countAttemptSQL   = declare(sqlrows.CountAttemptSQL)
	spendExecutionSQL = declare(`UPDATE budgets SET execution_used_us = execution_used_us + ?, version = version + 1
	WHERE run_id = ? RETURNING ` + sqlrows.BudgetCols)
	insertActionSQL = declare(sqlrows.InsertActionSQL)
	moveActionSQL   = declare(`UPDATE actions SET state = ?, version = version + 1, updated_at = ?,
	attempt_count = max(attempt_count, ?) WHERE id = ? AND state = ? RETURNING ` + sqlrows.ActionCols)
	// An attempt is inserted as it starts: the columns it has then.
	insertAttemptSQL = declare(`INSERT INTO attempts (id, action_id, run_id, attempt_no, status, effect, version, started_at)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?)`)
	finishAttemptSQL     = declare(sqlrows.FinishAttemptSQL)
	setEffectSQL         = declare(sqlrows.SetAttemptEffectSQL)
	setAttemptSQL        = declare(sqlrows.SetAttemptSQL)
	setActionSQL         = declare(sqlrows.SetActionSQL)
	setBudgetUsedSQL     = declare(sqlrows.SetBudgetUsedSQL)
	insertObservationSQL = declare(sqlrows.InsertObservationSQL)
	insertApprovalSQL    = declare(sqlrows.InsertApprovalSQL)
	moveApprovalSQL      = declare(sqlrows.MoveApprovalSQL)
	staleApprovalSQL     = declare(sqlrows.StaleApprovalSQL)
	insertEventSQL       = declare(sqlrows.InsertEventSQL)
	moveHeadSQL          = declare(sqlrows.MoveChainHeadSQL)
	upsertSignatureSQL   = declare(sqlrows.PutSignatureSQL)
	probeSQL             = declare(sqlrows.ProbeSQL)
	insertRuleSetSQL     = declare(sqlrows.InsertRuleSetSQL)
)

func (t *tx) InsertRun(_ context.Context, r *ledger.Run) error {
	row, b := sqlrows.RunOf(r), sqlrows.BudgetOf(r.ID, r.Budget)
	if _, err := t.exec(insertRunSQL, row.ID, row.Tenant, row.IdempotencyKey, row.RequestDigest, row.SubmittedBy, row.Agent,
		row.Input, row.State, row.StopReason, row.Version, row.EventSeq, row.EventHash, row.CreatedAt, row.UpdatedAt); err != nil {
		return translate(err)
	}
	_, err := t.exec(insertBudgetSQL, b.RunID, b.MaxAttemptsPerAction, b.MaxAttemptsPerRun, b.MaxExecutionUs, b.MaxSteps,
		b.MaxTokens, b.DeadlineAt, b.AttemptsUsed, b.ExecutionUsedUs, b.StepsUsed, b.TokensUsed, b.TokensUnavailable, b.Version)
	return translate(err)
}

func (t *tx) MoveRun(_ context.Context, id ledger.RunID, from, to ledger.RunState, reason ledger.StopReason, at time.Time) (*ledger.Run, bool, error) {
	var row sqlrows.Run
	ok, err := t.moved(moveRunSQL, func(rows *sql.Rows) error { return rows.Scan(row.ContentTargets()...) },
		string(to), sqlrows.StrPtr(string(reason)), sqlrows.Micros(at), string(id), string(from))
	if !ok || err != nil {
		return nil, false, err
	}
	return row.ToRun(nil), true, nil
}

func (t *tx) budget(st *stmt, args ...any) (*ledger.Budget, bool, error) {
	var b sqlrows.Budget
	ok, err := t.moved(st, func(rows *sql.Rows) error { return rows.Scan(b.Targets()...) }, args...)
	if !ok || err != nil {
		return nil, false, err
	}
	out := b.ToBudget(0)
	return &out, true, nil
}

func (t *tx) AddUsage(_ context.Context, run ledger.RunID, u ledger.BudgetUsage) (*ledger.Budget, bool, error) {
	// The guard keeps the sums inside int64: SQLite would silently turn an
	// overflowing INTEGER into a REAL.
	exec := u.Execution.Microseconds()
	return t.budget(addUsageSQL, u.Steps, u.Tokens, exec, u.TokensUnavailable,
		string(run), math.MaxInt64-u.Steps, math.MaxInt64-u.Tokens, math.MaxInt64-exec)
}

func (t *tx) CountAttempt(_ context.Context, run ledger.RunID) error {
	ok, err := t.execOne(countAttemptSQL, string(run))
	if err == nil && !ok {
		err = ledger.Errorf(ledger.CodeNotFound, "budget of run %s not found", run)
	}
	return err
}

func (t *tx) SpendExecution(_ context.Context, run ledger.RunID, d time.Duration) (*ledger.Budget, error) {
	b, ok, err := t.budget(spendExecutionSQL, d.Microseconds(), string(run))
	if err == nil && !ok {
		err = ledger.Errorf(ledger.CodeNotFound, "budget of run %s not found", run)
	}
	return b, err
}

func (t *tx) SetBudgetUsed(_ context.Context, run ledger.RunID, from, to ledger.BudgetUsage) (bool, error) {
	return t.execOne(setBudgetUsedSQL, to.Attempts, to.Execution.Microseconds(), to.Steps, to.Tokens, to.TokensUnavailable,
		string(run), from.Attempts, from.Execution.Microseconds(), from.Steps, from.Tokens, from.TokensUnavailable)
}

func (t *tx) InsertAction(_ context.Context, a *ledger.Action) error {
	row := sqlrows.ActionOf(a)
	_, err := t.exec(insertActionSQL, row.ID, row.RunID, row.Tenant, row.Seq, row.IdempotencyKey, row.Tool,
		row.ToolVersion, row.Effect, row.Arguments, row.ActionDigest, row.DedupKey, row.Supersedes, row.State,
		row.AttemptCount, row.Version, row.CreatedAt, row.UpdatedAt, row.GateDecision, row.GateRule, row.GateReason,
		row.RulesDigest)
	return translate(err)
}

func (t *tx) MoveAction(_ context.Context, id ledger.ActionID, from, to ledger.ActionState, attemptCount int64, at time.Time) (*ledger.Action, bool, error) {
	var row sqlrows.Action
	ok, err := t.moved(moveActionSQL, func(rows *sql.Rows) error { return rows.Scan(row.Targets()...) },
		string(to), sqlrows.Micros(at), attemptCount, string(id), string(from))
	if !ok || err != nil {
		return nil, false, err
	}
	return row.ToAction(), true, nil
}

func (t *tx) SetAction(_ context.Context, a *ledger.Action, from int64) (bool, error) {
	return t.execOne(setActionSQL, string(a.State), a.AttemptCount, a.Version, sqlrows.Micros(a.UpdatedAt), string(a.ID), from)
}

func (t *tx) InsertAttempt(_ context.Context, a *ledger.Attempt) error {
	_, err := t.exec(insertAttemptSQL, string(a.ID), string(a.ActionID), string(a.RunID), a.No, string(a.Status),
		string(a.Effect), a.Version, sqlrows.Micros(a.StartedAt))
	return translate(err)
}

func (t *tx) FinishAttempt(_ context.Context, a *ledger.Attempt) (bool, error) {
	errJSON, err := sqlrows.AttemptErrorText(a.Error)
	if err != nil {
		return false, err
	}
	return t.execOne(finishAttemptSQL, string(a.Status), sqlrows.RawPtr(a.Result), errJSON, sqlrows.MicrosPtr(a.FinishedAt), string(a.ID))
}

func (t *tx) SetAttempt(_ context.Context, a *ledger.Attempt, from int64) (bool, error) {
	errJSON, err := sqlrows.AttemptErrorText(a.Error)
	if err != nil {
		return false, err
	}
	return t.execOne(setAttemptSQL, string(a.Status), string(a.Effect), sqlrows.StrPtr(string(a.EffectObservation)), sqlrows.RawPtr(a.Result),
		errJSON, sqlrows.MicrosPtr(a.FinishedAt), a.Version, string(a.ID), from)
}

func (t *tx) SetAttemptEffect(_ context.Context, id ledger.AttemptID, effect ledger.EffectFact, by ledger.ObservationID) (bool, error) {
	return t.execOne(setEffectSQL, string(effect), string(by), string(id))
}

func (t *tx) InsertObservation(_ context.Context, o *ledger.Observation) error {
	_, err := t.exec(insertObservationSQL, string(o.ID), string(o.RunID), string(o.ActionID), sqlrows.StrPtr(string(o.AttemptID)),
		string(o.Source), string(o.Effect), sqlrows.RawPtr(o.Detail), sqlrows.Micros(o.ObservedAt))
	return translate(err)
}

func (t *tx) InsertApproval(_ context.Context, a *ledger.Approval) error {
	r := sqlrows.ApprovalOf(a)
	_, err := t.exec(insertApprovalSQL, r.ID, r.ActionID, r.RunID, r.Tenant, r.ActionDigest, r.State, r.DecidedBy, r.Reason,
		r.Version, r.RequestedAt, r.ExpiresAt, r.DecidedAt, r.ExecuteBy, r.StaleAt, r.StaleReason)
	return translate(err)
}

func (t *tx) MoveApproval(_ context.Context, id ledger.ApprovalID, from, to ledger.ApprovalState, at time.Time, reason, decidedBy string, executeBy *time.Time) (*ledger.Approval, bool, error) {
	var row sqlrows.Approval
	ok, err := t.moved(moveApprovalSQL, func(rows *sql.Rows) error { return rows.Scan(row.Targets()...) },
		string(to), sqlrows.Micros(at), sqlrows.StrPtr(reason), sqlrows.StrPtr(decidedBy), sqlrows.MicrosPtr(executeBy), string(id), string(from))
	if !ok || err != nil {
		return nil, false, err
	}
	return row.ToApproval(), true, nil
}

func (t *tx) StaleApproval(_ context.Context, id ledger.ApprovalID, at time.Time, reason string) (*ledger.Approval, bool, error) {
	var row sqlrows.Approval
	ok, err := t.moved(staleApprovalSQL, func(rows *sql.Rows) error { return rows.Scan(row.Targets()...) },
		sqlrows.Micros(at), sqlrows.StrPtr(reason), string(id))
	if !ok || err != nil {
		return nil, false, err
	}
	return row.ToApproval(), true, nil
}

func (t *tx) InsertCancellation(_ context.Context, c *ledger.Cancellation) error {
	row := sqlrows.CancellationOf(c)
	return translate(t.c.db.Create(&row).Error)
}

func (t *tx) MoveCancellation(_ context.Context, run ledger.RunID, from, to ledger.CancellationState, at time.Time) (bool, error) {
	col, ok := sqlrows.CancellationTimeColumn[to]
	if !ok {
		return false, ledger.Errorf(ledger.CodeInvalid, "a cancellation does not move to %s", to)
	}
	res := t.c.db.Model(&sqlrows.Cancellation{}).Where("run_id = ? AND state = ?", string(run), string(from)).
		Updates(map[string]any{"state": string(to), col: sqlrows.Micros(at), "version": gorm.Expr("version + 1")})
	if res.Error != nil {
		return false, translate(res.Error)
	}
	return res.RowsAffected > 0, nil
}

func (t *tx) InsertAttemptLease(_ context.Context, l *ledger.AttemptLease) error {
	row := sqlrows.LeaseOf(l)
	return translate(t.c.db.Create(&row).Error)
}

func (t *tx) UpdateAttemptLease(_ context.Context, l *ledger.AttemptLease) error {
	row := sqlrows.LeaseOf(l)
	res := t.c.db.Model(&sqlrows.Lease{}).Where("attempt_id = ?", row.AttemptID).
		Updates(map[string]any{"lease_until": row.LeaseUntil, "heartbeats": row.Heartbeats, "progress": row.Progress,
			"outcome_digest": row.OutcomeDigest, "outcome": row.Outcome})
	switch {
	case res.Error != nil:
		return translate(res.Error)
	case res.RowsAffected == 0:
		return ledger.Errorf(ledger.CodeNotFound, "attempt %s has no lease", l.AttemptID)
	}
	return nil
}

func (t *tx) PutAgentDecision(_ context.Context, d *ledger.AgentDecision) error {
	row := sqlrows.DecisionOf(d)
	return translate(t.c.db.Save(&row).Error)
}

func (t *tx) AnswerAgentDecision(_ context.Context, action ledger.ActionID, id string) (bool, error) {
	res := t.c.db.Model(&sqlrows.Decision{}).Where("action_id = ? AND decision_id = ? AND answered = ?", string(action), id, false).
		Update("answered", true)
	if res.Error != nil {
		return false, translate(res.Error)
	}
	return res.RowsAffected == 1, nil
}

func (t *tx) InsertEvent(_ context.Context, e *ledger.Event) error {
	_, err := t.exec(insertEventSQL, string(e.ID), string(e.RunID), e.Seq, e.Type, e.EntityType, e.EntityID,
		e.FromState, e.ToState, e.Actor, sqlrows.RawPtr(e.Data), sqlrows.Micros(e.CreatedAt), e.PrevHash, e.Hash, e.Format, sqlrows.RawPtr(e.Rows))
	return translate(err)
}

func (t *tx) MoveChainHead(_ context.Context, run ledger.RunID, fromSeq, seq int64, hash string) (bool, error) {
	return t.execOne(moveHeadSQL, seq, hash, string(run), fromSeq)
}

// Probe implements ledger.Tx.
func (t *tx) Probe(context.Context) error {
	_, err := t.exec(probeSQL)
	return translate(err)
}

// InsertRuleSet implements ledger.Tx.
func (t *tx) InsertRuleSet(_ context.Context, r *ledger.RuleSet) (bool, error) {
	row := sqlrows.RuleSetOf(r)
	return t.execOne(insertRuleSetSQL, row.Digest, row.Document, row.StoredAt)
}

// PutSignature implements ledger.Tx.
func (t *tx) PutSignature(_ context.Context, h *ledger.HeadSignature) error {
	s := sqlrows.SignatureOf(h)
	_, err := t.exec(upsertSignatureSQL, s.RunID, s.Seq, s.Hash, s.SignedAt, s.KeyID, s.Signature)
	return translate(err)
}
