package postgres

import (
	"context"
	"encoding/base64"
	"math"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
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

const insertRunSQL = `INSERT INTO runs (` + runCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

const insertBudgetSQL = `INSERT INTO budgets (` + budgetCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertRun implements ledger.Tx: the run, then its budget (version 1).
func (t *tx) InsertRun(ctx context.Context, r *ledger.Run) error {
	if _, err := t.exec(ctx, insertRunSQL, string(r.ID), r.Tenant, r.IdempotencyKey, string(r.RequestDigest),
		r.SubmittedBy, r.Agent, string(r.Input), string(r.State), strPtr(string(r.StopReason)), r.Version,
		r.EventSeq, r.EventHash, micros(r.CreatedAt), micros(r.UpdatedAt)); err != nil {
		return wrapErr("insert run", err)
	}
	// Nobody else sees the run before this write commits, and nobody can
	// insert another with its id: the write holds it as if locked.
	t.st.hold(r.ID, &chainHead{seq: r.EventSeq, hash: r.EventHash}, 0, "")
	b := budgetRowOf(r.ID, r.Budget)
	_, err := t.exec(ctx, insertBudgetSQL, b.RunID, b.MaxAttemptsPerAction, b.MaxAttemptsPerRun, b.MaxExecutionUs,
		b.MaxSteps, b.MaxTokens, b.DeadlineAt, b.AttemptsUsed, b.ExecutionUsedUs, b.StepsUsed, b.TokensUsed,
		b.TokensUnavailable, 1)
	return wrapErr("insert budget", err)
}

const moveRunSQL = `UPDATE runs SET state = ?, stop_reason = ?, version = version + 1, updated_at = ?
	WHERE id = ? AND state = ? RETURNING ` + runCols

// MoveRun implements ledger.Tx.
func (t *tx) MoveRun(ctx context.Context, id ledger.RunID, from, to ledger.RunState, reason ledger.StopReason, at time.Time) (*ledger.Run, bool, error) {
	if err := t.lockRun(ctx, id); err != nil {
		return nil, false, err
	}
	var r runRow
	moved, err := t.one(ctx, moveRunSQL, []any{string(to), strPtr(string(reason)), micros(at), string(id), string(from)}, r.targets()...)
	if err != nil || !moved {
		return nil, false, wrapErr("move run", err)
	}
	return runOf(&r, nil), true, nil
}

// budgetReturning hands back the budget after an UPDATE of budgets b
// joined to its run r, with the run's creation time for the deadline.
var budgetReturning = ` RETURNING ` + qualified("b", budgetCols) + `, r.created_at`

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
		b       budgetRow
		created int64
	)
	added, err := t.one(ctx, addUsageSQL, []any{u.Steps, u.Tokens, exec, u.TokensUnavailable, string(run),
		math.MaxInt64 - u.Steps, math.MaxInt64 - u.Tokens, math.MaxInt64 - exec}, append(b.targets(), &created)...)
	if err != nil || !added {
		return nil, false, wrapErr("add usage", err)
	}
	budget := budgetOf(&b, created)
	return &budget, true, nil
}

// CountAttempt implements ledger.Tx; CodeNotFound if the run has no budget.
func (t *tx) CountAttempt(ctx context.Context, run ledger.RunID) error {
	if err := t.lockRun(ctx, run); err != nil {
		return err
	}
	n, err := t.exec(ctx, `UPDATE budgets SET attempts_used = attempts_used + 1, version = version + 1 WHERE run_id = ?`, string(run))
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
		b       budgetRow
		created int64
	)
	err := t.get(ctx, "budget of run "+string(run), spendExecutionSQL, []any{d.Microseconds(), string(run)},
		append(b.targets(), &created)...)
	if err != nil {
		return nil, wrapErr("spend execution", err)
	}
	budget := budgetOf(&b, created)
	return &budget, nil
}

// actions

const insertActionSQL = `INSERT INTO actions (` + actionCols + `)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertAction implements ledger.Tx.
func (t *tx) InsertAction(ctx context.Context, a *ledger.Action) error {
	if err := t.lockRun(ctx, a.RunID); err != nil {
		return err
	}
	r := actionRowOf(a)
	_, err := t.exec(ctx, insertActionSQL, r.ID, r.RunID, r.Tenant, r.Seq, r.IdempotencyKey, r.Tool, r.ToolVersion,
		r.Effect, r.Arguments, r.ActionDigest, r.DedupKey, r.Supersedes, r.State, r.AttemptCount, r.Version,
		r.CreatedAt, r.UpdatedAt, r.GateDecision, r.GateRule, r.GateReason, r.RulesDigest)
	if err == nil {
		t.st.hold(a.RunID, nil, entityAction, string(a.ID))
	}
	return wrapErr("insert action", err)
}

const moveActionSQL = `UPDATE actions SET state = ?, version = version + 1, updated_at = ?,
	attempt_count = GREATEST(attempt_count, ?) WHERE id = ? AND state = ? RETURNING ` + actionCols

// MoveAction implements ledger.Tx.
func (t *tx) MoveAction(ctx context.Context, id ledger.ActionID, from, to ledger.ActionState, attemptCount int64, at time.Time) (*ledger.Action, bool, error) {
	if err := t.lockEntity(ctx, entityAction, string(id)); err != nil {
		return nil, false, err
	}
	var r actionRow
	moved, err := t.one(ctx, moveActionSQL, []any{string(to), micros(at), attemptCount, string(id), string(from)}, r.targets()...)
	if err != nil || !moved {
		return nil, false, wrapErr("move action", err)
	}
	return r.action(), true, nil
}

// attempts and observations

const insertAttemptSQL = `INSERT INTO attempts (` + attemptCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertAttempt implements ledger.Tx.
func (t *tx) InsertAttempt(ctx context.Context, a *ledger.Attempt) error {
	if err := t.lockRun(ctx, a.RunID); err != nil {
		return err
	}
	r, err := attemptRowOf(a)
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

const finishAttemptSQL = `UPDATE attempts SET status = ?, result = ?, error = ?, finished_at = ?, version = version + 1
	WHERE id = ? AND status = ?`

// FinishAttempt implements ledger.Tx.
func (t *tx) FinishAttempt(ctx context.Context, a *ledger.Attempt) (bool, error) {
	if err := t.lockEntity(ctx, entityAttempt, string(a.ID)); err != nil {
		return false, err
	}
	errText, err := attemptErrorText(a.Error)
	if err != nil {
		return false, wrapErr("finish attempt", err)
	}
	n, err := t.exec(ctx, finishAttemptSQL, string(a.Status), rawPtr(a.Result), errText, microsPtr(a.FinishedAt),
		string(a.ID), string(ledger.AttemptStarted))
	return n > 0, wrapErr("finish attempt", err)
}

const setEffectSQL = `UPDATE attempts SET effect = ?, effect_observation_id = ?, version = version + 1
	WHERE id = ? AND effect = ?`

// SetAttemptEffect implements ledger.Tx.
func (t *tx) SetAttemptEffect(ctx context.Context, id ledger.AttemptID, effect ledger.EffectFact, by ledger.ObservationID) (bool, error) {
	if err := t.lockEntity(ctx, entityAttempt, string(id)); err != nil {
		return false, err
	}
	n, err := t.exec(ctx, setEffectSQL, string(effect), string(by), string(id), string(ledger.EffectUnknown))
	return n > 0, wrapErr("set attempt effect", err)
}

const insertObservationSQL = `INSERT INTO observations (` + observationCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`

// InsertObservation implements ledger.Tx.
func (t *tx) InsertObservation(ctx context.Context, o *ledger.Observation) error {
	if err := t.lockRun(ctx, o.RunID); err != nil {
		return err
	}
	r := observationRowOf(o)
	_, err := t.exec(ctx, insertObservationSQL, r.ID, r.RunID, r.ActionID, r.AttemptID, r.Source, r.Effect, r.Detail, r.ObservedAt)
	return wrapErr("insert observation", err)
}

// approvals

const insertApprovalSQL = `INSERT INTO approvals (` + approvalCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertApproval implements ledger.Tx.
func (t *tx) InsertApproval(ctx context.Context, a *ledger.Approval) error {
	if err := t.lockRun(ctx, a.RunID); err != nil {
		return err
	}
	r := approvalRowOf(a)
	_, err := t.exec(ctx, insertApprovalSQL, r.ID, r.ActionID, r.RunID, r.Tenant, r.ActionDigest, r.State, r.DecidedBy,
		r.Reason, r.Version, r.RequestedAt, r.ExpiresAt, r.DecidedAt)
	if err == nil {
		t.st.hold(a.RunID, nil, entityApproval, string(a.ID))
	}
	return wrapErr("insert approval", err)
}

// moveApprovalSQL settles an approval (decided_by only when given) and
// hands back its row.
const moveApprovalSQL = `UPDATE approvals SET state = ?, version = version + 1, decided_at = ?, reason = ?,
	decided_by = COALESCE(?, decided_by) WHERE id = ? AND state = ? RETURNING ` + approvalCols

// MoveApproval implements ledger.Tx.
func (t *tx) MoveApproval(ctx context.Context, id ledger.ApprovalID, from, to ledger.ApprovalState, at time.Time, reason, decidedBy string) (*ledger.Approval, bool, error) {
	if err := t.lockEntity(ctx, entityApproval, string(id)); err != nil {
		return nil, false, err
	}
	var r approvalRow
	moved, err := t.one(ctx, moveApprovalSQL, []any{string(to), micros(at), strPtr(reason), strPtr(decidedBy), string(id), string(from)},
		r.targets()...)
	if err != nil || !moved {
		return nil, false, wrapErr("move approval", err)
	}
	return r.approval(), true, nil
}

// cancellations

const insertCancellationSQL = `INSERT INTO cancellations (` + cancellationCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertCancellation implements ledger.Tx.
func (t *tx) InsertCancellation(ctx context.Context, c *ledger.Cancellation) error {
	if err := t.lockRun(ctx, c.RunID); err != nil {
		return err
	}
	r := cancellationRowOf(c)
	_, err := t.exec(ctx, insertCancellationSQL, r.ID, r.RunID, r.Tenant, r.State, r.RequestedBy, r.Reason, r.Version,
		r.RequestedAt, r.AcceptedAt, r.StoppingAt, r.StoppedAt, r.TooLateAt)
	return wrapErr("insert cancellation", err)
}

// moveCancellationSQL is the guarded move of a cancellation into each
// state after requested, which also records when it got there.
var moveCancellationSQL = map[ledger.CancellationState]string{
	ledger.CancelAccepted: moveCancellationTo("accepted_at"),
	ledger.CancelStopping: moveCancellationTo("stopping_at"),
	ledger.CancelStopped:  moveCancellationTo("stopped_at"),
	ledger.CancelTooLate:  moveCancellationTo("too_late_at"),
}

func moveCancellationTo(timeColumn string) string {
	return `UPDATE cancellations SET state = ?, ` + timeColumn + ` = ?, version = version + 1 WHERE run_id = ? AND state = ?`
}

// MoveCancellation implements ledger.Tx.
func (t *tx) MoveCancellation(ctx context.Context, run ledger.RunID, from, to ledger.CancellationState, at time.Time) (bool, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return false, err
	}
	q, ok := moveCancellationSQL[to]
	if !ok {
		return false, ledger.Errorf(ledger.CodeInvalid, "move cancellation: a cancellation cannot move to %q", to)
	}
	n, err := t.exec(ctx, q, string(to), micros(at), string(run), string(from))
	return n > 0, wrapErr("move cancellation", err)
}

// leases and agent decisions

const insertLeaseSQL = `INSERT INTO attempt_leases (` + leaseCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// InsertAttemptLease implements ledger.Tx.
func (t *tx) InsertAttemptLease(ctx context.Context, l *ledger.AttemptLease) error {
	if err := t.lockRun(ctx, l.RunID); err != nil {
		return err
	}
	r := leaseRowOf(l)
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
	r := leaseRowOf(l)
	n, err := t.exec(ctx, updateLeaseSQL, r.LeaseUntil, r.Heartbeats, r.Progress, r.OutcomeDigest, r.Outcome, r.AttemptID)
	if err == nil && n == 0 {
		err = notFound("lease of attempt %s not found", l.AttemptID)
	}
	return wrapErr("update attempt lease", err)
}

const putDecisionSQL = `INSERT INTO agent_decisions (` + decisionCols + `) VALUES (?, ?, ?, ?, ?)
	ON CONFLICT (action_id) DO UPDATE SET decision_id = excluded.decision_id, kind = excluded.kind,
	answered = excluded.answered, decided_at = excluded.decided_at`

// PutAgentDecision implements ledger.Tx.
func (t *tx) PutAgentDecision(ctx context.Context, d *ledger.AgentDecision) error {
	if err := t.lockEntity(ctx, entityAction, string(d.ActionID)); err != nil {
		return err
	}
	_, err := t.exec(ctx, putDecisionSQL, string(d.ActionID), d.DecisionID, d.Kind, d.Answered, micros(d.DecidedAt))
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

const insertEventsSQL = `INSERT INTO events (` + eventCols + `) VALUES `

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
				e.FromState, e.ToState, e.Actor, rawPtr(e.Data), micros(e.CreatedAt), e.PrevHash, e.Hash, e.Format, rawPtr(e.Rows))
		}
		if _, err := t.exec(ctx, q.String(), args...); err != nil {
			return wrapErr("insert event", err)
		}
		t.st.events = t.st.events[len(batch):]
	}
	t.st.events = nil
	return nil
}

// MoveChainHead implements ledger.Tx.
func (t *tx) MoveChainHead(ctx context.Context, run ledger.RunID, fromSeq, seq int64, hash string) (bool, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return false, err
	}
	n, err := t.exec(ctx, `UPDATE runs SET event_seq = ?, event_hash = ? WHERE id = ? AND event_seq = ?`,
		seq, hash, string(run), fromSeq)
	if n > 0 {
		t.st.movedHead(run, seq, hash)
	}
	return n > 0, wrapErr("move chain head", err)
}

const putSignatureSQL = `INSERT INTO chain_signatures (` + signatureCols + `) VALUES (?, ?, ?, ?, ?, ?)
	ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, signed_at = excluded.signed_at,
	key_id = excluded.key_id, signature = excluded.signature`

// PutSignature implements ledger.Tx; the signature is stored as base64.
func (t *tx) PutSignature(ctx context.Context, h *ledger.HeadSignature) error {
	if err := t.lockRun(ctx, h.RunID); err != nil {
		return err
	}
	_, err := t.exec(ctx, putSignatureSQL, string(h.RunID), h.Seq, h.Hash, micros(h.SignedAt), h.KeyID,
		base64.StdEncoding.EncodeToString(h.Signature))
	return wrapErr("put signature", err)
}
