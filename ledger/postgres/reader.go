package postgres

import (
	"context"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

var _ ledger.Reader = (*reader)(nil)

// The statements of the Reader are sqlrows': SQLite's too.

// runs

// getRun is a Get of a run with its budget.
func (r *reader) getRun(ctx context.Context, op, what, q string, args ...any) (*ledger.Run, error) {
	var (
		rr sqlrows.Run
		b  sqlrows.Budget
	)
	if err := r.get(ctx, what, q, args, sqlrows.RunBudgetTargets(&rr, &b)...); err != nil {
		return nil, wrapErr(op, err)
	}
	b.RunID = rr.ID
	return rr.ToRun(&b), nil
}

// GetRun implements ledger.Reader.
func (r *reader) GetRun(ctx context.Context, id ledger.RunID) (*ledger.Run, error) {
	return r.getRun(ctx, "get run", "run "+string(id), sqlrows.GetRunSQL, string(id))
}

// GetRunByRequest implements ledger.Reader.
func (r *reader) GetRunByRequest(ctx context.Context, tenant, principal, key string) (*ledger.Run, error) {
	return r.getRun(ctx, "get run by request", "run of request "+key, sqlrows.GetRunByRequestSQL, tenant, principal, key)
}

// ListRuns implements ledger.Reader.
func (r *reader) ListRuns(ctx context.Context, f ledger.RunFilter) ([]*ledger.Run, error) {
	var w sqlrows.Where
	if f.Tenant != nil {
		w.Add("r.tenant = ?", *f.Tenant)
	}
	if f.SubmittedBy != nil {
		w.Add("r.submitted_by = ?", *f.SubmittedBy)
	}
	if f.State != nil {
		w.Add("r.state = ?", string(*f.State))
	}
	if f.AfterID != nil {
		w.Add("r.id > ?", string(*f.AfterID))
	}
	if len(f.NotAgents) > 0 {
		w.Add("r.agent NOT IN ?", f.NotAgents)
	}
	out, err := all(ctx, r, w.Query(sqlrows.ListRunsBase, "r.id", f.Limit), w.Args, sqlrows.ScanRun)
	return out, wrapErr("list runs", err)
}

// CountWaiting implements ledger.Reader; as on SQLite, a negative limit
// is no limit.
func (r *reader) CountWaiting(ctx context.Context, tenant string, limit int) (int, error) {
	var lim *int // NULL: no limit
	if limit >= 0 {
		lim = &limit
	}
	var n int
	_, err := r.one(ctx, sqlrows.CountWaitingSQL, []any{tenant, lim, tenant, lim}, &n)
	return n, wrapErr("count waiting", err)
}

// ChainHead implements ledger.Reader.
func (r *reader) ChainHead(ctx context.Context, run ledger.RunID) (int64, string, error) {
	var (
		seq  int64
		hash string
	)
	err := r.get(ctx, "run "+string(run), sqlrows.ChainHeadSQL, []any{string(run)}, &seq, &hash)
	return seq, hash, wrapErr("chain head", err)
}

// actions

func (r *reader) getAction(ctx context.Context, op, what, q string, args ...any) (*ledger.Action, error) {
	var a sqlrows.Action
	if err := r.get(ctx, what, q, args, a.Targets()...); err != nil {
		return nil, wrapErr(op, err)
	}
	return a.ToAction(), nil
}

// GetAction implements ledger.Reader.
func (r *reader) GetAction(ctx context.Context, id ledger.ActionID) (*ledger.Action, error) {
	return r.getAction(ctx, "get action", "action "+string(id), sqlrows.GetActionSQL, string(id))
}

// GetActionByKey implements ledger.Reader.
func (r *reader) GetActionByKey(ctx context.Context, run ledger.RunID, key string) (*ledger.Action, error) {
	return r.getAction(ctx, "get action by key", "action "+key+" of run "+string(run), sqlrows.GetActionByKeySQL, string(run), key)
}

// MaxActionSeq implements ledger.Reader.
func (r *reader) MaxActionSeq(ctx context.Context, run ledger.RunID) (int64, error) {
	var n int64
	_, err := r.one(ctx, sqlrows.MaxActionSeqSQL, []any{string(run)}, &n)
	return n, wrapErr("max action seq", err)
}

// ListActions implements ledger.Reader.
func (r *reader) ListActions(ctx context.Context, f ledger.ActionFilter) ([]*ledger.Action, error) {
	q, args := sqlrows.ListActions(f)
	out, err := all(ctx, r, q, args, sqlrows.ScanAction)
	return out, wrapErr("list actions", err)
}

// CountActions implements ledger.Reader.
func (r *reader) CountActions(ctx context.Context, run ledger.RunID, state ledger.ActionState) (int64, error) {
	var n int64
	_, err := r.one(ctx, sqlrows.CountActionsSQL, []any{string(run), string(state)}, &n)
	return n, wrapErr("count actions", err)
}

// attempts and observations

func (r *reader) getAttempt(ctx context.Context, op, what, q string, args ...any) (*ledger.Attempt, error) {
	var a sqlrows.Attempt
	if err := r.get(ctx, what, q, args, a.Targets()...); err != nil {
		return nil, wrapErr(op, err)
	}
	att, err := a.ToAttempt()
	return att, wrapErr(op, err)
}

// GetAttempt implements ledger.Reader.
func (r *reader) GetAttempt(ctx context.Context, id ledger.AttemptID) (*ledger.Attempt, error) {
	return r.getAttempt(ctx, "get attempt", "attempt "+string(id), sqlrows.GetAttemptSQL, string(id))
}

// LastAttempt implements ledger.Reader.
func (r *reader) LastAttempt(ctx context.Context, action ledger.ActionID) (*ledger.Attempt, error) {
	return r.getAttempt(ctx, "last attempt", "attempt of action "+string(action), sqlrows.LastAttemptSQL, string(action))
}

// ListAttempts implements ledger.Reader.
func (r *reader) ListAttempts(ctx context.Context, f ledger.AttemptFilter) ([]*ledger.Attempt, error) {
	q, args := sqlrows.ListAttempts(f)
	out, err := all(ctx, r, q, args, sqlrows.ScanAttempt)
	return out, wrapErr("list attempts", err)
}

// ListObservations implements ledger.Reader.
func (r *reader) ListObservations(ctx context.Context, f ledger.ObservationFilter) ([]*ledger.Observation, error) {
	var w sqlrows.Where
	if f.RunID != nil {
		// Through the run's actions, so that observations_action serves
		// the read instead of a scan of every observation.
		w.Add("run_id = ? AND action_id IN (SELECT id FROM actions WHERE run_id = ?)", string(*f.RunID), string(*f.RunID))
	}
	if f.ActionID != nil {
		w.Add("action_id = ?", string(*f.ActionID))
	}
	if f.AttemptID != nil {
		w.Add("attempt_id = ?", string(*f.AttemptID))
	}
	out, err := all(ctx, r, w.Query(`SELECT `+sqlrows.ObservationCols+` FROM observations`, "observed_at, id", 0), w.Args,
		sqlrows.ScanObservation)
	return out, wrapErr("list observations", err)
}

// approvals

func (r *reader) getApproval(ctx context.Context, op, what, q string, args ...any) (*ledger.Approval, error) {
	var a sqlrows.Approval
	if err := r.get(ctx, what, q, args, a.Targets()...); err != nil {
		return nil, wrapErr(op, err)
	}
	return a.ToApproval(), nil
}

// GetApproval implements ledger.Reader.
func (r *reader) GetApproval(ctx context.Context, id ledger.ApprovalID) (*ledger.Approval, error) {
	return r.getApproval(ctx, "get approval", "approval "+string(id), sqlrows.GetApprovalSQL, string(id))
}

// PendingApproval implements ledger.Reader.
func (r *reader) PendingApproval(ctx context.Context, action ledger.ActionID) (*ledger.Approval, error) {
	return r.getApproval(ctx, "pending approval", "pending approval of action "+string(action), sqlrows.PendingApprovalSQL,
		string(action))
}

// GrantedApproval implements ledger.Reader.
func (r *reader) GrantedApproval(ctx context.Context, action ledger.ActionID) (*ledger.Approval, error) {
	return r.getApproval(ctx, "granted approval", "granted approval of action "+string(action), sqlrows.GrantedApprovalSQL,
		string(action))
}

// ListApprovals implements ledger.Reader.
func (r *reader) ListApprovals(ctx context.Context, f ledger.ApprovalFilter) ([]*ledger.Approval, error) {
	var w sqlrows.Where
	if f.Tenant != nil {
		w.Add("tenant = ?", *f.Tenant)
	}
	if f.State != nil {
		w.Add("state = ?", string(*f.State))
	}
	if f.ActionID != nil {
		w.Add("action_id = ?", string(*f.ActionID))
	}
	if f.RunID != nil {
		w.Add("run_id = ?", string(*f.RunID))
	}
	if f.AfterID != nil {
		w.Add("id > ?", string(*f.AfterID))
	}
	out, err := all(ctx, r, w.Query(`SELECT `+sqlrows.ApprovalCols+` FROM approvals`, "id", f.Limit), w.Args, sqlrows.ScanApproval)
	return out, wrapErr("list approvals", err)
}

// CountPendingApprovals implements ledger.Reader.
func (r *reader) CountPendingApprovals(ctx context.Context, run ledger.RunID) (int64, error) {
	var n int64
	_, err := r.one(ctx, sqlrows.CountPendingSQL, []any{string(run)}, &n)
	return n, wrapErr("count pending approvals", err)
}

// ListDueApprovals implements ledger.Reader.
func (r *reader) ListDueApprovals(ctx context.Context, at time.Time) ([]*ledger.Approval, error) {
	out, err := all(ctx, r, `SELECT `+sqlrows.ApprovalCols+` FROM approvals
		WHERE state = ? AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY id`,
		[]any{string(ledger.ApprovalPending), sqlrows.Micros(at)}, sqlrows.ScanApproval)
	return out, wrapErr("list due approvals", err)
}

// cancellations

// GetCancellation implements ledger.Reader.
func (r *reader) GetCancellation(ctx context.Context, run ledger.RunID) (*ledger.Cancellation, error) {
	var c sqlrows.Cancellation
	if err := r.get(ctx, "cancellation of run "+string(run), sqlrows.GetCancellationSQL, []any{string(run)}, c.Targets()...); err != nil {
		return nil, wrapErr("get cancellation", err)
	}
	return c.ToCancellation(), nil
}

// ListUnsettledCancellations implements ledger.Reader. The partial index
// cancellations_unsettled holds only these rows.
func (r *reader) ListUnsettledCancellations(ctx context.Context) ([]*ledger.Cancellation, error) {
	out, err := all(ctx, r, `SELECT `+sqlrows.CancellationCols+` FROM cancellations WHERE `+sqlrows.UnsettledCancellation+` ORDER BY id`,
		nil, sqlrows.ScanCancellation)
	return out, wrapErr("list unsettled cancellations", err)
}

// leases and agent decisions

func (r *reader) getLease(ctx context.Context, op, what, q string, args ...any) (*ledger.AttemptLease, error) {
	var l sqlrows.Lease
	if err := r.get(ctx, what, q, args, l.Targets()...); err != nil {
		return nil, wrapErr(op, err)
	}
	return l.ToLease(), nil
}

// GetAttemptLease implements ledger.Reader.
func (r *reader) GetAttemptLease(ctx context.Context, attempt ledger.AttemptID) (*ledger.AttemptLease, error) {
	return r.getLease(ctx, "get attempt lease", "lease of attempt "+string(attempt),
		`SELECT `+sqlrows.LeaseCols+` FROM attempt_leases WHERE attempt_id = ?`, string(attempt))
}

// GetAttemptLeaseByKey implements ledger.Reader.
func (r *reader) GetAttemptLeaseByKey(ctx context.Context, action ledger.ActionID, key string) (*ledger.AttemptLease, error) {
	return r.getLease(ctx, "get attempt lease by key", "lease of begin key "+key+" of action "+string(action),
		`SELECT `+sqlrows.LeaseCols+` FROM attempt_leases WHERE action_id = ? AND begin_key = ?`, string(action), key)
}

// ListLapsedLeases implements ledger.Reader.
func (r *reader) ListLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*ledger.AttemptLease, error) {
	w := sqlrows.LapsedLeasesWhere(before)
	out, err := all(ctx, r, w.Query(`SELECT `+sqlrows.LeaseCols+` FROM attempt_leases`, "lease_until, attempt_id", limit), w.Args,
		sqlrows.ScanLease)
	return out, wrapErr("list lapsed leases", err)
}

// ListAgentDecisions implements ledger.Reader.
func (r *reader) ListAgentDecisions(ctx context.Context, f ledger.AgentDecisionFilter) ([]*ledger.AgentDecision, error) {
	q, args := sqlrows.ListAgentDecisions(f)
	out, err := all(ctx, r, q, args, sqlrows.ScanDecision)
	return out, wrapErr("list agent decisions", err)
}

// GetAgentDecision implements ledger.Reader.
func (r *reader) GetAgentDecision(ctx context.Context, action ledger.ActionID) (*ledger.AgentDecision, error) {
	var d sqlrows.Decision
	if err := r.get(ctx, "decision about action "+string(action), `SELECT `+sqlrows.DecisionCols+` FROM agent_decisions WHERE action_id = ?`,
		[]any{string(action)}, d.Targets()...); err != nil {
		return nil, wrapErr("get agent decision", err)
	}
	return d.ToDecision(), nil
}

// events and signatures

// ListEvents implements ledger.Reader. The rows are scanned into one slab
// of Events, sized by sizeHint.
func (r *reader) ListEvents(ctx context.Context, run ledger.RunID, sizeHint int64) ([]*ledger.Event, error) {
	var out []*ledger.Event
	err := r.read(ctx, func() error {
		rows, err := r.query(ctx, sqlrows.ListEventsSQL, string(run))
		if err != nil {
			return err
		}
		defer func() { _ = rows.Close() }()
		out, err = sqlrows.ScanEvents(ctx, rows, sizeHint)
		return r.fail(err)
	})
	if err != nil {
		return nil, wrapErr("list events", err)
	}
	return out, nil
}

// ListEventsAfter implements ledger.Reader.
func (r *reader) ListEventsAfter(ctx context.Context, f ledger.EventFilter) ([]*ledger.Event, error) {
	limit := noLimit // NULL: no limit
	if f.Limit > 0 {
		limit = &f.Limit
	}
	rows, err := r.query(ctx, sqlrows.ListEventsAfterSQL, string(f.RunID), f.AfterSeq, limit)
	if err != nil {
		return nil, wrapErr("list events after", err)
	}
	defer func() { _ = rows.Close() }()
	out, err := sqlrows.ScanEvents(ctx, rows, 0)
	if err != nil {
		return nil, wrapErr("list events after", r.fail(err))
	}
	return out, nil
}

// GetSignature implements ledger.Reader.
func (r *reader) GetSignature(ctx context.Context, run ledger.RunID) (*ledger.HeadSignature, error) {
	var s sqlrows.Signature
	if err := r.get(ctx, "signature of run "+string(run), sqlrows.GetSignatureSQL, []any{string(run)}, s.Targets()...); err != nil {
		return nil, wrapErr("get signature", err)
	}
	return s.ToSignature(), nil
}

// recovery facts and counts

// noLimit is PostgreSQL's LIMIT for none.
var noLimit *int

// ListRecoveryFacts implements ledger.Reader, from one snapshot.
func (r *reader) ListRecoveryFacts(ctx context.Context, f ledger.RecoveryFilter) ([]*ledger.RecoveryFacts, []*ledger.Observation, error) {
	if f.ActionID == nil && f.Runs < 0 {
		return nil, nil, ledger.Errorf(ledger.CodeInvalid, "list recovery facts: runs cannot be negative")
	}
	var (
		facts []*ledger.RecoveryFacts
		obs   []*ledger.Observation
	)
	err := r.consistent(ctx, func(r *reader) (err error) {
		facts, obs, err = sqlrows.ListRecoveryFacts(ctx, r.query, f, noLimit)
		return r.fail(err)
	})
	if err != nil {
		return nil, nil, wrapErr("list recovery facts", err)
	}
	return facts, obs, nil
}

// CountByState implements ledger.Reader, from one snapshot.
func (r *reader) CountByState(ctx context.Context) (*ledger.Counts, error) {
	var out *ledger.Counts
	err := r.consistent(ctx, func(r *reader) (err error) {
		out, err = sqlrows.CountByState(ctx, r.query)
		return r.fail(err)
	})
	if err != nil {
		return nil, wrapErr("count by state", err)
	}
	return out, nil
}

// GetRuleSet implements ledger.Reader.
func (r *reader) GetRuleSet(ctx context.Context, digest ledger.Digest) (*ledger.RuleSet, error) {
	var row sqlrows.RuleSet
	if err := r.get(ctx, "rule set "+string(digest), sqlrows.GetRuleSetSQL, []any{string(digest)}, row.Targets()...); err != nil {
		return nil, wrapErr("get rule set", err)
	}
	return row.ToRuleSet(), nil
}

// ListRuleSets implements ledger.Reader.
func (r *reader) ListRuleSets(ctx context.Context, limit int) ([]*ledger.RuleSet, error) {
	q, args := sqlrows.ListRuleSetsSQL, []any(nil)
	if limit > 0 {
		q, args = sqlrows.ListRuleSetsLimitSQL, []any{limit}
	}
	out, err := all(ctx, r, q, args, sqlrows.ScanRuleSet)
	return out, wrapErr("list rule sets", err)
}
