package postgres

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// tx is one write transaction (READ COMMITTED): its reads see its own
// writes. Every method that touches a run's rows first locks the run
// (locks.go). Every guarded move is one UPDATE … WHERE <state> = <from>,
// never a read then a write.
type tx struct {
	reader
}

var _ ledger.Tx = (*tx)(nil)

// runs

// InsertRun implements ledger.Tx: the run, then its budget (version 1).
func (t *tx) InsertRun(ctx context.Context, r *ledger.Run) error {
	row := sqlrows.RunOf(r)
	if _, err := t.exec(ctx, sqlrows.InsertRunSQL, row.ID, row.Tenant, row.IdempotencyKey, row.RequestDigest, row.SubmittedBy,
		row.Agent, row.Input, row.State, row.StopReason, row.Version, row.EventSeq, row.EventHash, row.CreatedAt,
		row.UpdatedAt); err != nil {
		return wrapErr("insert run", err)
	}
	// Nobody else sees the run before this write commits, and nobody can
	// insert another with its id: the write holds it as if locked.
	t.st.hold(r.ID, &chainHead{seq: r.EventSeq, hash: r.EventHash}, 0, "")
	b := sqlrows.BudgetOf(r.ID, r.Budget)
	_, err := t.exec(ctx, sqlrows.InsertBudgetSQL, b.RunID, b.MaxAttemptsPerAction, b.MaxAttemptsPerRun, b.MaxExecutionUs,
		b.MaxSteps, b.MaxTokens, b.DeadlineAt, b.AttemptsUsed, b.ExecutionUsedUs, b.StepsUsed, b.TokensUsed,
		b.TokensUnavailable, b.Version)
	return wrapErr("insert budget", err)
}

const moveRunSQL = `UPDATE runs SET state = ?, stop_reason = ?, version = version + 1, updated_at = ?
	WHERE id = ? AND state = ? RETURNING ` + sqlrows.RunCols

// MoveRun implements ledger.Tx.
func (t *tx) MoveRun(ctx context.Context, id ledger.RunID, from, to ledger.RunState, reason ledger.StopReason, at time.Time) (*ledger.Run, bool, error) {
	if err := t.lockRun(ctx, id); err != nil {
		return nil, false, err
	}
	var r sqlrows.Run
	moved, err := t.one(ctx, moveRunSQL, []any{string(to), sqlrows.StrPtr(string(reason)), sqlrows.Micros(at), string(id), string(from)}, r.Targets()...)
	if err != nil || !moved {
		return nil, false, wrapErr("move run", err)
	}
	return r.ToRun(nil), true, nil
}

// budgetReturning hands back the budget after an UPDATE of budgets b
// joined to its run r, with the run's creation time for the deadline.
var budgetReturning = ` RETURNING ` + sqlrows.Qualified("b", sqlrows.BudgetCols) + `, r.created_at`

var addUsageSQL = `UPDATE budgets b SET steps_used = b.steps_used + ?, tokens_used = b.tokens_used + ?,
	execution_used_us = b.execution_used_us + ?, tokens_unavailable = b.tokens_unavailable OR ?, version = b.version + 1
	FROM runs r WHERE b.run_id = ? AND r.id = b.run_id AND b.steps_used <= ? AND b.tokens_used <= ? AND b.execution_used_us <= ?` +
	budgetReturning

// AddUsage implements ledger.Tx. The guard keeps every sum inside int64,
// where PostgreSQL would fail the statement (and with it the transaction).
func (t *tx) AddUsage(ctx context.Context, run ledger.RunID, u ledger.BudgetUsage) (*ledger.Budget, bool, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return nil, false, err
	}
	exec := u.Execution.Microseconds()
	if u.Steps < 0 || u.Tokens < 0 || exec < 0 {
		return nil, false, ledger.Errorf(ledger.CodeInvalid, "add usage: usage cannot be negative")
	}
	var (
		b       sqlrows.Budget
		created int64
	)
	added, err := t.one(ctx, addUsageSQL, []any{u.Steps, u.Tokens, exec, u.TokensUnavailable, string(run),
		math.MaxInt64 - u.Steps, math.MaxInt64 - u.Tokens, math.MaxInt64 - exec}, append(b.Targets(), &created)...)
	if err != nil || !added {
		return nil, false, wrapErr("add usage", err)
	}
	budget := b.ToBudget(created)
	return &budget, true, nil
}

// CountAttempt implements ledger.Tx; CodeNotFound if the run has no budget.
func (t *tx) CountAttempt(ctx context.Context, run ledger.RunID) error {
	if err := t.lockRun(ctx, run); err != nil {
		return err
	}
	n, err := t.exec(ctx, sqlrows.CountAttemptSQL, string(run))
	if err == nil && n == 0 {
		err = notFound("budget of run %s not found", run)
	}
	return wrapErr("count attempt", err)
}

var spendExecutionSQL = `UPDATE budgets b SET execution_used_us = b.execution_used_us + ?, version = b.version + 1
	FROM runs r WHERE b.run_id = ? AND r.id = b.run_id` + budgetReturning

// SpendExecution implements ledger.Tx; CodeNotFound if the run has no
// budget.
func (t *tx) SpendExecution(ctx context.Context, run ledger.RunID, d time.Duration) (*ledger.Budget, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return nil, err
	}
	var (
		b       sqlrows.Budget
		created int64
	)
	err := t.get(ctx, "budget of run "+string(run), spendExecutionSQL, []any{d.Microseconds(), string(run)},
		append(b.Targets(), &created)...)
	if err != nil {
		return nil, wrapErr("spend execution", err)
	}
	budget := b.ToBudget(created)
	return &budget, nil
}

// actions

// InsertAction implements ledger.Tx.
func (t *tx) InsertAction(ctx context.Context, a *ledger.Action) error {
	if err := t.lockRun(ctx, a.RunID); err != nil {
		return err
	}
	r := sqlrows.ActionOf(a)
	_, err := t.exec(ctx, sqlrows.InsertActionSQL, r.ID, r.RunID, r.Tenant, r.Seq, r.IdempotencyKey, r.Tool, r.ToolVersion,
		r.Effect, r.Arguments, r.ActionDigest, r.DedupKey, r.Supersedes, r.State, r.AttemptCount, r.Version,
		r.CreatedAt, r.UpdatedAt, r.GateDecision, r.GateRule, r.GateReason, r.RulesDigest)
	if err == nil {
		t.st.hold(a.RunID, nil, entityAction, string(a.ID))
	}
	return wrapErr("insert action", err)
}

const moveActionSQL = `UPDATE actions SET state = ?, version = version + 1, updated_at = ?,
	attempt_count = GREATEST(attempt_count, ?) WHERE id = ? AND state = ? RETURNING ` + sqlrows.ActionCols

// MoveAction implements ledger.Tx.
func (t *tx) MoveAction(ctx context.Context, id ledger.ActionID, from, to ledger.ActionState, attemptCount int64, at time.Time) (*ledger.Action, bool, error) {
	if err := t.lockEntity(ctx, entityAction, string(id)); err != nil {
		return nil, false, err
	}
	var r sqlrows.Action
	moved, err := t.one(ctx, moveActionSQL, []any{string(to), sqlrows.Micros(at), attemptCount, string(id), string(from)}, r.Targets()...)
	if err != nil || !moved {
		return nil, false, wrapErr("move action", err)
	}
	return r.ToAction(), true, nil
}

// attempts and observations

const insertAttemptSQL = `INSERT INTO attempts (` + sqlrows.AttemptCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertAttempt implements ledger.Tx.
func (t *tx) InsertAttempt(ctx context.Context, a *ledger.Attempt) error {
	if err := t.lockRun(ctx, a.RunID); err != nil {
		return err
	}
	r, err := sqlrows.AttemptOf(a)
	if err != nil {
		return wrapErr("insert attempt", err)
	}
	_, err = t.exec(ctx, insertAttemptSQL, r.ID, r.ActionID, r.RunID, r.AttemptNo, r.Status, r.Effect,
		r.EffectObservationID, r.Result, r.Error, r.Version, r.StartedAt, r.FinishedAt)
	if err == nil {
		t.st.hold(a.RunID, nil, entityAttempt, string(a.ID))
	}
	return wrapErr("insert attempt", err)
}

// FinishAttempt implements ledger.Tx.
func (t *tx) FinishAttempt(ctx context.Context, a *ledger.Attempt) (bool, error) {
	if err := t.lockEntity(ctx, entityAttempt, string(a.ID)); err != nil {
		return false, err
	}
	errText, err := sqlrows.AttemptErrorText(a.Error)
	if err != nil {
		return false, wrapErr("finish attempt", err)
	}
	n, err := t.exec(ctx, sqlrows.FinishAttemptSQL, string(a.Status), sqlrows.RawPtr(a.Result), errText,
		sqlrows.MicrosPtr(a.FinishedAt), string(a.ID))
	return n > 0, wrapErr("finish attempt", err)
}

// SetAttemptEffect implements ledger.Tx.
func (t *tx) SetAttemptEffect(ctx context.Context, id ledger.AttemptID, effect ledger.EffectFact, by ledger.ObservationID) (bool, error) {
	if err := t.lockEntity(ctx, entityAttempt, string(id)); err != nil {
		return false, err
	}
	n, err := t.exec(ctx, sqlrows.SetAttemptEffectSQL, string(effect), string(by), string(id))
	return n > 0, wrapErr("set attempt effect", err)
}

// InsertObservation implements ledger.Tx.
func (t *tx) InsertObservation(ctx context.Context, o *ledger.Observation) error {
	if err := t.lockRun(ctx, o.RunID); err != nil {
		return err
	}
	r := sqlrows.ObservationOf(o)
	_, err := t.exec(ctx, sqlrows.InsertObservationSQL, r.ID, r.RunID, r.ActionID, r.AttemptID, r.Source, r.Effect, r.Detail, r.ObservedAt)
	return wrapErr("insert observation", err)
}

// approvals

// InsertApproval implements ledger.Tx.
func (t *tx) InsertApproval(ctx context.Context, a *ledger.Approval) error {
	if err := t.lockRun(ctx, a.RunID); err != nil {
		return err
	}
	r := sqlrows.ApprovalOf(a)
	_, err := t.exec(ctx, sqlrows.InsertApprovalSQL, r.ID, r.ActionID, r.RunID, r.Tenant, r.ActionDigest, r.State, r.DecidedBy,
		r.Reason, r.Version, r.RequestedAt, r.ExpiresAt, r.DecidedAt, r.ExecuteBy, r.StaleAt, r.StaleReason)
	if err == nil {
		t.st.hold(a.RunID, nil, entityApproval, string(a.ID))
	}
	return wrapErr("insert approval", err)
}

// MoveApproval implements ledger.Tx.
func (t *tx) MoveApproval(ctx context.Context, id ledger.ApprovalID, from, to ledger.ApprovalState, at time.Time, reason, decidedBy string, executeBy *time.Time) (*ledger.Approval, bool, error) {
	if err := t.lockEntity(ctx, entityApproval, string(id)); err != nil {
		return nil, false, err
	}
	var r sqlrows.Approval
	moved, err := t.one(ctx, sqlrows.MoveApprovalSQL, []any{string(to), sqlrows.Micros(at), sqlrows.StrPtr(reason), sqlrows.StrPtr(decidedBy),
		sqlrows.MicrosPtr(executeBy), string(id), string(from)}, r.Targets()...)
	if err != nil || !moved {
		return nil, false, wrapErr("move approval", err)
	}
	return r.ToApproval(), true, nil
}

// StaleApproval implements ledger.Tx.
func (t *tx) StaleApproval(ctx context.Context, id ledger.ApprovalID, at time.Time, reason string) (*ledger.Approval, bool, error) {
	if err := t.lockEntity(ctx, entityApproval, string(id)); err != nil {
		return nil, false, err
	}
	var r sqlrows.Approval
	moved, err := t.one(ctx, sqlrows.StaleApprovalSQL, []any{sqlrows.Micros(at), sqlrows.StrPtr(reason), string(id)}, r.Targets()...)
	if err != nil || !moved {
		return nil, false, wrapErr("stale approval", err)
	}
	return r.ToApproval(), true, nil
}

// cancellations

const insertCancellationSQL = `INSERT INTO cancellations (` + sqlrows.CancellationCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertCancellation implements ledger.Tx.
func (t *tx) InsertCancellation(ctx context.Context, c *ledger.Cancellation) error {
	if err := t.lockRun(ctx, c.RunID); err != nil {
		return err
	}
	r := sqlrows.CancellationOf(c)
	_, err := t.exec(ctx, insertCancellationSQL, r.ID, r.RunID, r.Tenant, r.State, r.RequestedBy, r.Reason, r.Version,
		r.RequestedAt, r.AcceptedAt, r.StoppingAt, r.StoppedAt, r.TooLateAt)
	return wrapErr("insert cancellation", err)
}

// moveCancellationSQL is the guarded move of a cancellation into each
// state after requested, which also records when it got there.
var moveCancellationSQL = func() map[ledger.CancellationState]string {
	m := make(map[ledger.CancellationState]string, len(sqlrows.CancellationTimeColumn))
	for to, col := range sqlrows.CancellationTimeColumn {
		m[to] = `UPDATE cancellations SET state = ?, ` + col + ` = ?, version = version + 1 WHERE run_id = ? AND state = ?`
	}
	return m
}()

// MoveCancellation implements ledger.Tx.
func (t *tx) MoveCancellation(ctx context.Context, run ledger.RunID, from, to ledger.CancellationState, at time.Time) (bool, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return false, err
	}
	q, ok := moveCancellationSQL[to]
	if !ok {
		return false, ledger.Errorf(ledger.CodeInvalid, "move cancellation: a cancellation cannot move to %q", to)
	}
	n, err := t.exec(ctx, q, string(to), sqlrows.Micros(at), string(run), string(from))
	return n > 0, wrapErr("move cancellation", err)
}

// leases and agent decisions

const insertLeaseSQL = `INSERT INTO attempt_leases (` + sqlrows.LeaseCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertAttemptLease implements ledger.Tx.
func (t *tx) InsertAttemptLease(ctx context.Context, l *ledger.AttemptLease) error {
	if err := t.lockRun(ctx, l.RunID); err != nil {
		return err
	}
	r := sqlrows.LeaseOf(l)
	_, err := t.exec(ctx, insertLeaseSQL, r.AttemptID, r.ActionID, r.RunID, r.BeginKey, r.TokenSHA256, r.LeaseUs,
		r.LeaseUntil, r.MaxUntil, r.Heartbeats, r.Progress, r.OutcomeDigest, r.Outcome)
	return wrapErr("insert attempt lease", err)
}

const updateLeaseSQL = `UPDATE attempt_leases SET lease_until = ?, heartbeats = ?, progress = ?, outcome_digest = ?,
	outcome = ? WHERE attempt_id = ?`

// UpdateAttemptLease implements ledger.Tx; CodeNotFound if the attempt
// has no lease.
func (t *tx) UpdateAttemptLease(ctx context.Context, l *ledger.AttemptLease) error {
	if err := t.lockEntity(ctx, entityAttempt, string(l.AttemptID)); err != nil {
		return err
	}
	r := sqlrows.LeaseOf(l)
	n, err := t.exec(ctx, updateLeaseSQL, r.LeaseUntil, r.Heartbeats, r.Progress, r.OutcomeDigest, r.Outcome, r.AttemptID)
	if err == nil && n == 0 {
		err = notFound("lease of attempt %s not found", l.AttemptID)
	}
	return wrapErr("update attempt lease", err)
}

const putDecisionSQL = `INSERT INTO agent_decisions (` + sqlrows.DecisionCols + `) VALUES (?, ?, ?, ?, ?)
	ON CONFLICT (action_id) DO UPDATE SET decision_id = excluded.decision_id, kind = excluded.kind,
	answered = excluded.answered, decided_at = excluded.decided_at`

// PutAgentDecision implements ledger.Tx.
func (t *tx) PutAgentDecision(ctx context.Context, d *ledger.AgentDecision) error {
	if err := t.lockEntity(ctx, entityAction, string(d.ActionID)); err != nil {
		return err
	}
	_, err := t.exec(ctx, putDecisionSQL, string(d.ActionID), d.DecisionID, d.Kind, d.Answered, sqlrows.Micros(d.DecidedAt))
	return wrapErr("put agent decision", err)
}

// AnswerAgentDecision implements ledger.Tx.
func (t *tx) AnswerAgentDecision(ctx context.Context, action ledger.ActionID, id string) (bool, error) {
	if err := t.lockEntity(ctx, entityAction, string(action)); err != nil {
		return false, err
	}
	n, err := t.exec(ctx, `UPDATE agent_decisions SET answered = TRUE WHERE action_id = ? AND decision_id = ? AND NOT answered`,
		string(action), id)
	return n > 0, wrapErr("answer agent decision", err)
}

// events and signatures

const insertEventsSQL = `INSERT INTO events (` + sqlrows.EventCols + `) VALUES `

// eventRowSQL is one row of insertEventsSQL's VALUES.
const eventRowSQL = `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// eventsPerInsert bounds one statement of flushEvents: 15 parameters a
// row, far below PostgreSQL's 65,535 a statement.
const eventsPerInsert = 500

// InsertEvent implements ledger.Tx. The event is kept, and inserted with
// the write's other events in one statement (flushEvents): an
// auto-approved action appends nine, and each statement is a round trip
// to the server. Its errors (a duplicate sequence number, a broken check)
// are those of the write's commit then, translated alike.
func (t *tx) InsertEvent(ctx context.Context, e *ledger.Event) error {
	if err := t.lockRun(ctx, e.RunID); err != nil {
		return err
	}
	if err := t.broken(); err != nil {
		return err
	}
	t.st.events = append(t.st.events, *e)
	return nil
}

// flushEvents inserts the events InsertEvent kept, in the order they were
// appended.
func (t *tx) flushEvents(ctx context.Context) error {
	for len(t.st.events) > 0 {
		batch := t.st.events[:min(len(t.st.events), eventsPerInsert)]
		var q strings.Builder
		q.WriteString(insertEventsSQL)
		args := make([]any, 0, 15*len(batch))
		for i := range batch {
			e := &batch[i]
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString(eventRowSQL)
			args = append(args, string(e.ID), string(e.RunID), e.Seq, e.Type, e.EntityType, e.EntityID,
				e.FromState, e.ToState, e.Actor, sqlrows.RawPtr(e.Data), sqlrows.Micros(e.CreatedAt), e.PrevHash, e.Hash, e.Format, sqlrows.RawPtr(e.Rows))
		}
		if _, err := t.exec(ctx, q.String(), args...); err != nil {
			return wrapErr("insert event", err)
		}
		t.st.events = t.st.events[len(batch):]
	}
	t.st.events = nil
	return nil
}

// Probe implements ledger.Tx.
func (t *tx) Probe(ctx context.Context) error {
	_, err := t.exec(ctx, sqlrows.ProbeSQL)
	return wrapErr("probe", err)
}

// MoveChainHead implements ledger.Tx.
func (t *tx) MoveChainHead(ctx context.Context, run ledger.RunID, fromSeq, seq int64, hash string) (bool, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return false, err
	}
	n, err := t.exec(ctx, sqlrows.MoveChainHeadSQL, seq, hash, string(run), fromSeq)
	if n > 0 {
		t.st.movedHead(run, seq, hash)
	}
	return n > 0, wrapErr("move chain head", err)
}

// InsertRuleSet implements ledger.Tx. A rule set belongs to no run: the
// primary key alone orders two writes of one digest.
func (t *tx) InsertRuleSet(ctx context.Context, r *ledger.RuleSet) (bool, error) {
	row := sqlrows.RuleSetOf(r)
	n, err := t.exec(ctx, sqlrows.InsertRuleSetSQL, row.Digest, row.Document, row.StoredAt)
	return n > 0, wrapErr("insert rule set", err)
}

// PutSignature implements ledger.Tx; the signature is stored as base64.
func (t *tx) PutSignature(ctx context.Context, h *ledger.HeadSignature) error {
	if err := t.lockRun(ctx, h.RunID); err != nil {
		return err
	}
	s := sqlrows.SignatureOf(h)
	_, err := t.exec(ctx, sqlrows.PutSignatureSQL, s.RunID, s.Seq, s.Hash, s.SignedAt, s.KeyID, s.Signature)
	return wrapErr("put signature", err)
}
