package postgres

import (
	"context"
	"database/sql"
	"time"

	"github.com/actionledger/ledger/ledger"
)

var _ ledger.Reader = (*reader)(nil)

// runs

const runBudgetFrom = ` FROM runs r JOIN budgets b ON b.run_id = r.id`

var (
	getRunSQL          = `SELECT ` + runBudgetCols + runBudgetFrom + ` WHERE r.id = ?`
	getRunByRequestSQL = `SELECT ` + runBudgetCols + runBudgetFrom +
		` WHERE r.tenant = ? AND r.submitted_by = ? AND r.idempotency_key = ?`
)

// getRun is a Get of a run with its budget.
func (r *reader) getRun(ctx context.Context, op, what, q string, args ...any) (*ledger.Run, error) {
	var (
		rr runRow
		b  budgetRow
	)
	if err := r.get(ctx, what, q, args, runBudgetTargets(&rr, &b)...); err != nil {
		return nil, wrapErr(op, err)
	}
	return runOf(&rr, &b), nil
}

// GetRun implements ledger.Reader.
func (r *reader) GetRun(ctx context.Context, id ledger.RunID) (*ledger.Run, error) {
	return r.getRun(ctx, "get run", "run "+string(id), getRunSQL, string(id))
}

// GetRunByRequest implements ledger.Reader.
func (r *reader) GetRunByRequest(ctx context.Context, tenant, principal, key string) (*ledger.Run, error) {
	return r.getRun(ctx, "get run by request", "run of request "+key, getRunByRequestSQL, tenant, principal, key)
}

// ListRuns implements ledger.Reader.
func (r *reader) ListRuns(ctx context.Context, f ledger.RunFilter) ([]*ledger.Run, error) {
	var w where
	if f.Tenant != nil {
		w.add("r.tenant = ?", *f.Tenant)
	}
	if f.SubmittedBy != nil {
		w.add("r.submitted_by = ?", *f.SubmittedBy)
	}
	if f.State != nil {
		w.add("r.state = ?", string(*f.State))
	}
	if f.AfterID != nil {
		w.add("r.id > ?", string(*f.AfterID))
	}
	if len(f.NotAgents) > 0 {
		w.add("r.agent NOT IN ?", f.NotAgents)
	}
	q := w.query(`SELECT `+runBudgetCols+runBudgetFrom, "r.id", f.Limit)
	out, err := all(ctx, r, q, w.args, func(rows *sql.Rows) (*ledger.Run, error) {
		var (
			rr runRow
			b  budgetRow
		)
		if err := rows.Scan(runBudgetTargets(&rr, &b)...); err != nil {
			return nil, err
		}
		return runOf(&rr, &b), nil
	})
	return out, wrapErr("list runs", err)
}

// countWaitingSQL counts each part no further than its limit, so a flood
// costs the limit at most, on the tenant's (tenant, state, id) indexes.
const countWaitingSQL = `SELECT
	(SELECT COUNT(*) FROM (SELECT 1 FROM approvals WHERE tenant = ? AND state = ? LIMIT ?) AS p) +
	(SELECT COUNT(*) FROM (SELECT 1 FROM runs WHERE tenant = ? AND state IN (?, ?) LIMIT ?) AS q)`

// CountWaiting implements ledger.Reader; as on SQLite, a negative limit
// is no limit.
func (r *reader) CountWaiting(ctx context.Context, tenant string, limit int) (int, error) {
	var lim *int // NULL: no limit
	if limit >= 0 {
		lim = &limit
	}
	var n int
	_, err := r.one(ctx, countWaitingSQL, []any{tenant, string(ledger.ApprovalPending), lim,
		tenant, string(ledger.RunQueued), string(ledger.RunRunning), lim}, &n)
	return n, wrapErr("count waiting", err)
}

// ChainHead implements ledger.Reader.
func (r *reader) ChainHead(ctx context.Context, run ledger.RunID) (int64, string, error) {
	var (
		seq  int64
		hash string
	)
	err := r.get(ctx, "run "+string(run), `SELECT event_seq, event_hash FROM runs WHERE id = ?`, []any{string(run)}, &seq, &hash)
	return seq, hash, wrapErr("chain head", err)
}

// actions

var (
	getActionSQL      = `SELECT ` + actionCols + ` FROM actions WHERE id = ?`
	getActionByKeySQL = `SELECT ` + actionCols + ` FROM actions WHERE run_id = ? AND idempotency_key = ?`
)

func (r *reader) getAction(ctx context.Context, op, what, q string, args ...any) (*ledger.Action, error) {
	var a actionRow
	if err := r.get(ctx, what, q, args, a.targets()...); err != nil {
		return nil, wrapErr(op, err)
	}
	return a.action(), nil
}

// GetAction implements ledger.Reader.
func (r *reader) GetAction(ctx context.Context, id ledger.ActionID) (*ledger.Action, error) {
	return r.getAction(ctx, "get action", "action "+string(id), getActionSQL, string(id))
}

// GetActionByKey implements ledger.Reader.
func (r *reader) GetActionByKey(ctx context.Context, run ledger.RunID, key string) (*ledger.Action, error) {
	return r.getAction(ctx, "get action by key", "action "+key+" of run "+string(run), getActionByKeySQL, string(run), key)
}

// MaxActionSeq implements ledger.Reader.
func (r *reader) MaxActionSeq(ctx context.Context, run ledger.RunID) (int64, error) {
	var n int64
	_, err := r.one(ctx, `SELECT COALESCE(MAX(seq), 0) FROM actions WHERE run_id = ?`, []any{string(run)}, &n)
	return n, wrapErr("max action seq", err)
}

func scanAction(rows *sql.Rows) (*ledger.Action, error) {
	var a actionRow
	if err := rows.Scan(a.targets()...); err != nil {
		return nil, err
	}
	return a.action(), nil
}

// ListActions implements ledger.Reader.
func (r *reader) ListActions(ctx context.Context, f ledger.ActionFilter) ([]*ledger.Action, error) {
	var w where
	if f.RunID != nil {
		w.add("run_id = ?", string(*f.RunID))
	}
	if f.Tenant != nil {
		w.add("tenant = ?", *f.Tenant)
	}
	if f.State != nil {
		w.add("state = ?", string(*f.State))
	}
	out, err := all(ctx, r, w.query(`SELECT `+actionCols+` FROM actions`, "run_id, seq", f.Limit), w.args, scanAction)
	return out, wrapErr("list actions", err)
}

// CountActions implements ledger.Reader.
func (r *reader) CountActions(ctx context.Context, run ledger.RunID, state ledger.ActionState) (int64, error) {
	var n int64
	_, err := r.one(ctx, `SELECT COUNT(*) FROM actions WHERE run_id = ? AND state = ?`, []any{string(run), string(state)}, &n)
	return n, wrapErr("count actions", err)
}

// attempts and observations

func (r *reader) getAttempt(ctx context.Context, op, what, q string, args ...any) (*ledger.Attempt, error) {
	var a attemptRow
	if err := r.get(ctx, what, q, args, a.targets()...); err != nil {
		return nil, wrapErr(op, err)
	}
	att, err := a.attempt()
	return att, wrapErr(op, err)
}

// GetAttempt implements ledger.Reader.
func (r *reader) GetAttempt(ctx context.Context, id ledger.AttemptID) (*ledger.Attempt, error) {
	return r.getAttempt(ctx, "get attempt", "attempt "+string(id), `SELECT `+attemptCols+` FROM attempts WHERE id = ?`, string(id))
}

// LastAttempt implements ledger.Reader.
func (r *reader) LastAttempt(ctx context.Context, action ledger.ActionID) (*ledger.Attempt, error) {
	return r.getAttempt(ctx, "last attempt", "attempt of action "+string(action),
		`SELECT `+attemptCols+` FROM attempts WHERE action_id = ? ORDER BY attempt_no DESC LIMIT 1`, string(action))
}

func scanAttempt(rows *sql.Rows) (*ledger.Attempt, error) {
	var a attemptRow
	if err := rows.Scan(a.targets()...); err != nil {
		return nil, err
	}
	return a.attempt()
}

// ListAttempts implements ledger.Reader.
func (r *reader) ListAttempts(ctx context.Context, f ledger.AttemptFilter) ([]*ledger.Attempt, error) {
	var w where
	if f.ActionID != nil {
		w.add("action_id = ?", string(*f.ActionID))
	}
	if f.RunID != nil {
		w.add("run_id = ?", string(*f.RunID))
	}
	if f.Status != nil {
		w.add("status = ?", string(*f.Status))
	}
	out, err := all(ctx, r, w.query(`SELECT `+attemptCols+` FROM attempts`, "action_id, attempt_no", f.Limit), w.args, scanAttempt)
	return out, wrapErr("list attempts", err)
}

func scanObservation(rows *sql.Rows) (*ledger.Observation, error) {
	var o observationRow
	if err := rows.Scan(o.targets()...); err != nil {
		return nil, err
	}
	return o.observation(), nil
}

// ListObservations implements ledger.Reader.
func (r *reader) ListObservations(ctx context.Context, f ledger.ObservationFilter) ([]*ledger.Observation, error) {
	var w where
	if f.RunID != nil {
		// Through the run's actions, so that observations_action serves
		// the read instead of a scan of every observation.
		w.add("run_id = ? AND action_id IN (SELECT id FROM actions WHERE run_id = ?)", string(*f.RunID), string(*f.RunID))
	}
	if f.ActionID != nil {
		w.add("action_id = ?", string(*f.ActionID))
	}
	if f.AttemptID != nil {
		w.add("attempt_id = ?", string(*f.AttemptID))
	}
	out, err := all(ctx, r, w.query(`SELECT `+observationCols+` FROM observations`, "observed_at, id", 0), w.args, scanObservation)
	return out, wrapErr("list observations", err)
}

// approvals

func (r *reader) getApproval(ctx context.Context, op, what, q string, args ...any) (*ledger.Approval, error) {
	var a approvalRow
	if err := r.get(ctx, what, q, args, a.targets()...); err != nil {
		return nil, wrapErr(op, err)
	}
	return a.approval(), nil
}

// GetApproval implements ledger.Reader.
func (r *reader) GetApproval(ctx context.Context, id ledger.ApprovalID) (*ledger.Approval, error) {
	return r.getApproval(ctx, "get approval", "approval "+string(id), `SELECT `+approvalCols+` FROM approvals WHERE id = ?`, string(id))
}

// PendingApproval implements ledger.Reader.
func (r *reader) PendingApproval(ctx context.Context, action ledger.ActionID) (*ledger.Approval, error) {
	return r.getApproval(ctx, "pending approval", "pending approval of action "+string(action),
		`SELECT `+approvalCols+` FROM approvals WHERE action_id = ? AND state = ?`, string(action), string(ledger.ApprovalPending))
}

func scanApproval(rows *sql.Rows) (*ledger.Approval, error) {
	var a approvalRow
	if err := rows.Scan(a.targets()...); err != nil {
		return nil, err
	}
	return a.approval(), nil
}

// ListApprovals implements ledger.Reader.
func (r *reader) ListApprovals(ctx context.Context, f ledger.ApprovalFilter) ([]*ledger.Approval, error) {
	var w where
	if f.Tenant != nil {
		w.add("tenant = ?", *f.Tenant)
	}
	if f.State != nil {
		w.add("state = ?", string(*f.State))
	}
	if f.ActionID != nil {
		w.add("action_id = ?", string(*f.ActionID))
	}
	if f.RunID != nil {
		w.add("run_id = ?", string(*f.RunID))
	}
	if f.AfterID != nil {
		w.add("id > ?", string(*f.AfterID))
	}
	out, err := all(ctx, r, w.query(`SELECT `+approvalCols+` FROM approvals`, "id", f.Limit), w.args, scanApproval)
	return out, wrapErr("list approvals", err)
}

// CountPendingApprovals implements ledger.Reader.
func (r *reader) CountPendingApprovals(ctx context.Context, run ledger.RunID) (int64, error) {
	var n int64
	_, err := r.one(ctx, `SELECT COUNT(*) FROM approvals WHERE run_id = ? AND state = ?`,
		[]any{string(run), string(ledger.ApprovalPending)}, &n)
	return n, wrapErr("count pending approvals", err)
}

// ListDueApprovals implements ledger.Reader.
func (r *reader) ListDueApprovals(ctx context.Context, at time.Time) ([]*ledger.Approval, error) {
	out, err := all(ctx, r, `SELECT `+approvalCols+` FROM approvals
		WHERE state = ? AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY id`,
		[]any{string(ledger.ApprovalPending), micros(at)}, scanApproval)
	return out, wrapErr("list due approvals", err)
}

// cancellations

// GetCancellation implements ledger.Reader.
func (r *reader) GetCancellation(ctx context.Context, run ledger.RunID) (*ledger.Cancellation, error) {
	var c cancellationRow
	if err := r.get(ctx, "cancellation of run "+string(run), `SELECT `+cancellationCols+` FROM cancellations WHERE run_id = ?`,
		[]any{string(run)}, c.targets()...); err != nil {
		return nil, wrapErr("get cancellation", err)
	}
	return c.cancellation(), nil
}

// ListUnsettledCancellations implements ledger.Reader. The partial index
// cancellations_unsettled holds only these rows.
func (r *reader) ListUnsettledCancellations(ctx context.Context) ([]*ledger.Cancellation, error) {
	out, err := all(ctx, r, `SELECT `+cancellationCols+` FROM cancellations
		WHERE state IN ('requested', 'accepted', 'stopping') ORDER BY id`, nil, scanCancellation)
	return out, wrapErr("list unsettled cancellations", err)
}

// leases and agent decisions

func (r *reader) getLease(ctx context.Context, op, what, q string, args ...any) (*ledger.AttemptLease, error) {
	var l leaseRow
	if err := r.get(ctx, what, q, args, l.targets()...); err != nil {
		return nil, wrapErr(op, err)
	}
	return l.lease(), nil
}

// GetAttemptLease implements ledger.Reader.
func (r *reader) GetAttemptLease(ctx context.Context, attempt ledger.AttemptID) (*ledger.AttemptLease, error) {
	return r.getLease(ctx, "get attempt lease", "lease of attempt "+string(attempt),
		`SELECT `+leaseCols+` FROM attempt_leases WHERE attempt_id = ?`, string(attempt))
}

// GetAttemptLeaseByKey implements ledger.Reader.
func (r *reader) GetAttemptLeaseByKey(ctx context.Context, action ledger.ActionID, key string) (*ledger.AttemptLease, error) {
	return r.getLease(ctx, "get attempt lease by key", "lease of begin key "+key+" of action "+string(action),
		`SELECT `+leaseCols+` FROM attempt_leases WHERE action_id = ? AND begin_key = ?`, string(action), key)
}

// ListLapsedLeases implements ledger.Reader.
func (r *reader) ListLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*ledger.AttemptLease, error) {
	var w where
	w.add("outcome_digest IS NULL AND lease_until < ? AND attempt_id IN (SELECT id FROM attempts WHERE status = ?)",
		micros(before), string(ledger.AttemptStarted))
	out, err := all(ctx, r, w.query(`SELECT `+leaseCols+` FROM attempt_leases`, "lease_until, attempt_id", limit), w.args,
		func(rows *sql.Rows) (*ledger.AttemptLease, error) {
			var l leaseRow
			if err := rows.Scan(l.targets()...); err != nil {
				return nil, err
			}
			return l.lease(), nil
		})
	return out, wrapErr("list lapsed leases", err)
}

// GetAgentDecision implements ledger.Reader.
func (r *reader) GetAgentDecision(ctx context.Context, action ledger.ActionID) (*ledger.AgentDecision, error) {
	var d decisionRow
	if err := r.get(ctx, "decision about action "+string(action), `SELECT `+decisionCols+` FROM agent_decisions WHERE action_id = ?`,
		[]any{string(action)}, d.targets()...); err != nil {
		return nil, wrapErr("get agent decision", err)
	}
	return d.decision(), nil
}

// events and signatures

// ListEvents implements ledger.Reader. The rows are scanned into one slab
// of Events, sized by sizeHint.
func (r *reader) ListEvents(ctx context.Context, run ledger.RunID, sizeHint int64) ([]*ledger.Event, error) {
	rows, err := r.query(ctx, `SELECT `+eventCols+` FROM events WHERE run_id = ? ORDER BY seq`, string(run))
	if err != nil {
		return nil, wrapErr("list events", err)
	}
	defer func() { _ = rows.Close() }()
	slab := make([]ledger.Event, 0, max(0, min(sizeHint, 1<<20)))
	var created int64
	for rows.Next() {
		slab = append(slab, ledger.Event{})
		e := &slab[len(slab)-1]
		if err := rows.Scan((*string)(&e.ID), (*string)(&e.RunID), &e.Seq, &e.Type, &e.EntityType, &e.EntityID,
			&e.FromState, &e.ToState, &e.Actor, (*[]byte)(&e.Data), &created, &e.PrevHash, &e.Hash, &e.Format,
			(*[]byte)(&e.Rows)); err != nil {
			return nil, wrapErr("list events", err)
		}
		e.CreatedAt = fromMicros(created)
	}
	if err := rows.Err(); err != nil {
		return nil, wrapErr("list events", r.fail(err))
	}
	out := make([]*ledger.Event, len(slab))
	for i := range slab {
		out[i] = &slab[i]
	}
	return out, nil
}

// GetSignature implements ledger.Reader.
func (r *reader) GetSignature(ctx context.Context, run ledger.RunID) (*ledger.HeadSignature, error) {
	var s signatureRow
	if err := r.get(ctx, "signature of run "+string(run), `SELECT `+signatureCols+` FROM chain_signatures WHERE run_id = ?`,
		[]any{string(run)}, s.targets()...); err != nil {
		return nil, wrapErr("get signature", err)
	}
	return s.signature(), nil
}

// recovery facts

// recoveryFactsSelect reads, for each selected action, the action, its run
// and budget, its last attempt and its run's cancellation in one pass: one
// row per action. A WHERE clause (the selection) follows it.
var recoveryFactsSelect = `SELECT ` + qualified("a", actionCols) + `,
	` + runBudgetCols + `,
	` + joinedAttemptCols + `,
	c.state
FROM actions a
JOIN runs r ON r.id = a.run_id
JOIN budgets b ON b.run_id = r.id
LEFT JOIN attempts t ON t.action_id = a.id
	AND t.attempt_no = (SELECT MAX(attempt_no) FROM attempts WHERE action_id = a.id)
LEFT JOIN cancellations c ON c.run_id = r.id
`

// recoveryUnsettled is the scan's selection: actions approved, running or
// uncertain of runs that are not terminal.
const recoveryUnsettled = `WHERE a.state IN ('approved', 'running', 'uncertain')
	AND r.state NOT IN ('completed', 'stopped', 'failed')`

// recoveryRunsPage narrows recoveryUnsettled to a page of runs: the first
// runs (by id) after a cursor. Each branch walks actions_state in run order
// for one state and stops at the page's size. Arguments: the cursor and
// the size (NULL: no limit), three times, then the size again.
const recoveryRunsPage = ` AND a.run_id IN (SELECT run_id FROM (
	(SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'approved' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?)
	UNION (SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'running' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?)
	UNION (SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'uncertain' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?)
	) AS page ORDER BY run_id LIMIT ?)`

// recoveryUnknownObservations reads the query and cancel observations with
// an unknown effect about the selected actions. The selection's WHERE
// clause follows it.
var recoveryUnknownObservations = `SELECT ` + qualified("o", observationCols) + `
FROM actions a
JOIN runs r ON r.id = a.run_id
JOIN observations o ON o.action_id = a.id
`

// ListRecoveryFacts implements ledger.Reader, from one snapshot.
func (r *reader) ListRecoveryFacts(ctx context.Context, f ledger.RecoveryFilter) ([]*ledger.RecoveryFacts, []*ledger.Observation, error) {
	var where string
	var args []any
	switch {
	case f.ActionID != nil:
		where, args = `WHERE a.id = ?`, []any{string(*f.ActionID)}
	case f.Runs < 0:
		return nil, nil, ledger.Errorf(ledger.CodeInvalid, "list recovery facts: runs cannot be negative")
	case f.AfterRun != nil || f.Runs > 0:
		after := ""
		var limit *int
		if f.AfterRun != nil {
			after = string(*f.AfterRun)
		}
		if f.Runs > 0 {
			limit = &f.Runs
		}
		where, args = recoveryUnsettled+recoveryRunsPage, []any{after, limit, after, limit, after, limit, limit}
	default:
		where = recoveryUnsettled
	}
	var (
		facts []*ledger.RecoveryFacts
		obs   []*ledger.Observation
	)
	err := r.consistent(ctx, func(r *reader) error {
		var err error
		facts, err = all(ctx, r, recoveryFactsSelect+where+` ORDER BY a.run_id, a.seq`, args, scanRecoveryFacts)
		if err != nil {
			return err
		}
		attempts := make(map[ledger.AttemptID]bool, len(facts))
		for _, rf := range facts {
			if rf.Attempt != nil {
				attempts[rf.Attempt.ID] = true
			}
		}
		obs = []*ledger.Observation{}
		if len(attempts) == 0 {
			return nil
		}
		unknown, err := all(ctx, r, recoveryUnknownObservations+where+` AND o.source IN (?, ?) AND o.effect = ? ORDER BY o.observed_at, o.id`,
			append(args, string(ledger.ObservedQuery), string(ledger.ObservedCancel), string(ledger.EffectUnknown)), scanObservation)
		if err != nil {
			return err
		}
		for _, o := range unknown {
			if attempts[o.AttemptID] {
				obs = append(obs, o)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, wrapErr("list recovery facts", err)
	}
	return facts, obs, nil
}

func scanRecoveryFacts(rows *sql.Rows) (*ledger.RecoveryFacts, error) {
	var (
		a      actionRow
		rr     runRow
		b      budgetRow
		t      nullableAttemptRow
		cancel sql.NullString
	)
	targets := append(append(append(a.targets(), runBudgetTargets(&rr, &b)...), t.targets()...), &cancel)
	if err := rows.Scan(targets...); err != nil {
		return nil, err
	}
	att, err := t.attempt(a.ID, a.RunID)
	if err != nil {
		return nil, err
	}
	return &ledger.RecoveryFacts{Run: runOf(&rr, &b), Action: a.action(), Attempt: att,
		Cancellation: ledger.CancellationState(cancel.String)}, nil
}

// counts

// countQueries are the GROUP BY queries of CountByState; each reads an
// index on state (runs_state, actions_state, attempts_status) or, for
// approvals, scans a table that holds one row per gated action.
var countQueries = struct{ runs, actions, approvals, attempts string }{
	runs:      `SELECT state, COUNT(*) FROM runs GROUP BY state`,
	actions:   `SELECT state, COUNT(*) FROM actions GROUP BY state`,
	approvals: `SELECT state, COUNT(*) FROM approvals GROUP BY state`,
	attempts:  `SELECT status, effect, COUNT(*) FROM attempts GROUP BY status, effect`,
}

// CountByState implements ledger.Reader, from one snapshot.
func (r *reader) CountByState(ctx context.Context) (*ledger.Counts, error) {
	out := &ledger.Counts{Runs: map[ledger.RunState]int64{}, Actions: map[ledger.ActionState]int64{},
		Approvals: map[ledger.ApprovalState]int64{}, Attempts: map[ledger.AttemptCountKey]int64{}}
	err := r.consistent(ctx, func(r *reader) error {
		for _, c := range []struct {
			q   string
			put func(string, int64)
		}{
			{countQueries.runs, func(s string, n int64) { out.Runs[ledger.RunState(s)] = n }},
			{countQueries.actions, func(s string, n int64) { out.Actions[ledger.ActionState(s)] = n }},
			{countQueries.approvals, func(s string, n int64) { out.Approvals[ledger.ApprovalState(s)] = n }},
		} {
			if _, err := all(ctx, r, c.q, nil, func(rows *sql.Rows) (struct{}, error) {
				var (
					s string
					n int64
				)
				err := rows.Scan(&s, &n)
				c.put(s, n)
				return struct{}{}, err
			}); err != nil {
				return err
			}
		}
		_, err := all(ctx, r, countQueries.attempts, nil, func(rows *sql.Rows) (struct{}, error) {
			var (
				k ledger.AttemptCountKey
				n int64
			)
			err := rows.Scan((*string)(&k.Status), (*string)(&k.Effect), &n)
			out.Attempts[k] = n
			return struct{}{}, err
		})
		return err
	})
	if err != nil {
		return nil, wrapErr("count by state", err)
	}
	return out, nil
}
