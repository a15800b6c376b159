package sqlrows

import (
	"database/sql"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// Statements whose text is the same in both dialects. Literal states in
// a WHERE clause let each planner match the partial indexes written for
// them.

const runBudgetFrom = ` FROM runs r JOIN budgets b ON b.run_id = r.id`

// Reads of one row, or of a count.
const (
	GetRunSQL          = `SELECT ` + RunBudgetCols + runBudgetFrom + ` WHERE r.id = ?`
	GetRunByRequestSQL = `SELECT ` + RunBudgetCols + runBudgetFrom +
		` WHERE r.tenant = ? AND r.submitted_by = ? AND r.idempotency_key = ?`
	ChainHeadSQL       = `SELECT event_seq, event_hash FROM runs WHERE id = ?`
	GetActionSQL       = `SELECT ` + ActionCols + ` FROM actions WHERE id = ?`
	GetActionByKeySQL  = `SELECT ` + ActionCols + ` FROM actions WHERE run_id = ? AND idempotency_key = ?`
	MaxActionSeqSQL    = `SELECT COALESCE(MAX(seq), 0) FROM actions WHERE run_id = ?`
	CountActionsSQL    = `SELECT COUNT(*) FROM actions WHERE run_id = ? AND state = ?`
	GetAttemptSQL      = `SELECT ` + AttemptCols + ` FROM attempts WHERE id = ?`
	LastAttemptSQL     = `SELECT ` + AttemptCols + ` FROM attempts WHERE action_id = ? ORDER BY attempt_no DESC LIMIT 1`
	GetApprovalSQL     = `SELECT ` + ApprovalCols + ` FROM approvals WHERE id = ?`
	PendingApprovalSQL = `SELECT ` + ApprovalCols + ` FROM approvals WHERE action_id = ? AND state = 'pending'`
	// GrantedApprovalSQL is an action's newest granted approval (the index
	// approvals_action).
	GrantedApprovalSQL = `SELECT ` + ApprovalCols + ` FROM approvals WHERE action_id = ? AND state = 'granted' ORDER BY id DESC LIMIT 1`
	CountPendingSQL    = `SELECT COUNT(*) FROM approvals WHERE run_id = ? AND state = 'pending'`
	GetCancellationSQL = `SELECT ` + CancellationCols + ` FROM cancellations WHERE run_id = ?`
	GetRunLeaseSQL     = `SELECT ` + RunLeaseCols + ` FROM runs WHERE id = ?`
	GetSignatureSQL    = `SELECT ` + SignatureCols + ` FROM chain_signatures WHERE run_id = ?`
	GetRuleSetSQL      = `SELECT ` + RuleSetCols + ` FROM rule_sets WHERE digest = ?`
	// ListRuleSetsSQL lists rule sets newest first; ListRuleSetsLimitSQL
	// at most so many.
	ListRuleSetsSQL      = `SELECT ` + RuleSetCols + ` FROM rule_sets ORDER BY stored_at DESC, digest`
	ListRuleSetsLimitSQL = ListRuleSetsSQL + ` LIMIT ?`
	// CountWaitingSQL counts each part no further than its limit, so a
	// flood costs the limit at most, on the tenant's (tenant, state, id)
	// indexes. Arguments: tenant, limit, tenant, limit, the limit being
	// the dialect's "no limit" (-1 on SQLite, NULL on PostgreSQL) for none.
	CountWaitingSQL = `SELECT
	(SELECT COUNT(*) FROM (SELECT 1 FROM approvals WHERE tenant = ? AND state = 'pending' LIMIT ?) AS p) +
	(SELECT COUNT(*) FROM (SELECT 1 FROM runs WHERE tenant = ? AND state IN ('queued', 'running') LIMIT ?) AS q)`
	// ListEventsSQL reads a run's events in chain order, for ScanEvents.
	ListEventsSQL = `SELECT ` + EventCols + ` FROM events WHERE run_id = ? ORDER BY seq`
	// ListEventsAfterSQL reads a run's events after a seq in chain order,
	// on the (run_id, seq) index: run, after, then the limit (the
	// dialect's "no limit" for none, as CountWaitingSQL).
	ListEventsAfterSQL = `SELECT ` + EventCols + ` FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?`
	// ListRunLeaseOwnersSQL reads the partial index runs_lease_owner alone.
	ListRunLeaseOwnersSQL = `SELECT DISTINCT lease_owner FROM runs WHERE lease_owner IS NOT NULL ORDER BY lease_owner`
)

// ListAgentDecisions is the query of the decisions f selects: told and
// unanswered, about an action recovery still decides (approved, running,
// uncertain), in (decided_at, action_id) order; and its arguments.
func ListAgentDecisions(f ledger.AgentDecisionFilter) (string, []any) {
	var w Where
	w.Add("NOT d.answered AND d.decided_at <= ?", Micros(f.DecidedBefore))
	w.Add("EXISTS (SELECT 1 FROM actions a WHERE a.id = d.action_id AND a.state IN ('approved', 'running', 'uncertain'))")
	if c := f.After; c != nil {
		w.Add("(d.decided_at > ? OR (d.decided_at = ? AND d.action_id > ?))", Micros(c.DecidedAt), Micros(c.DecidedAt), string(c.ActionID))
	}
	return w.Query(`SELECT d.action_id, d.decision_id, d.kind, d.answered, d.decided_at FROM agent_decisions d`,
		"d.decided_at, d.action_id", f.Limit), w.Args
}

// ScanDecision scans a row of DecisionCols.
func ScanDecision(rows *sql.Rows) (*ledger.AgentDecision, error) {
	var d Decision
	if err := rows.Scan(d.Targets()...); err != nil {
		return nil, err
	}
	return d.ToDecision(), nil
}

// LapsedLeasesWhere selects the leases with no outcome that lapsed before
// before, of attempts still started, leaving out those whose agent was
// told a decision since the lapse that it has not answered yet: they wait
// for the agent (or its decision timeout, ListAgentDecisions), and would
// otherwise fill every page of the sweep.
func LapsedLeasesWhere(before time.Time) Where {
	var w Where
	w.Add("outcome_digest IS NULL AND lease_until < ? AND attempt_id IN (SELECT id FROM attempts WHERE status = ?)",
		Micros(before), string(ledger.AttemptStarted))
	w.Add("NOT EXISTS (SELECT 1 FROM agent_decisions d WHERE d.action_id = attempt_leases.action_id AND NOT d.answered AND d.decided_at >= attempt_leases.lease_until)")
	return w
}

// ListRunsBase is the base of a list of runs with their budgets, for
// Where.Query.
const ListRunsBase = `SELECT ` + RunBudgetCols + runBudgetFrom

// ListActions is the query of the actions f selects, in (run, seq) order,
// and its arguments.
func ListActions(f ledger.ActionFilter) (string, []any) {
	var w Where
	if f.RunID != nil {
		w.Add("run_id = ?", string(*f.RunID))
	}
	if f.Tenant != nil {
		w.Add("tenant = ?", *f.Tenant)
	}
	if f.State != nil {
		w.Add("state = ?", string(*f.State))
	}
	return w.Query(`SELECT `+ActionCols+` FROM actions`, "run_id, seq", f.Limit), w.Args
}

// ListAttempts is the query of the attempts f selects, in (action,
// number) order, and its arguments.
func ListAttempts(f ledger.AttemptFilter) (string, []any) {
	var w Where
	if f.ActionID != nil {
		w.Add("action_id = ?", string(*f.ActionID))
	}
	if f.RunID != nil {
		w.Add("run_id = ?", string(*f.RunID))
	}
	if f.Status != nil {
		w.Add("status = ?", string(*f.Status))
	}
	return w.Query(`SELECT `+AttemptCols+` FROM attempts`, "action_id, attempt_no", f.Limit), w.Args
}

// UnsettledCancellation selects the cancellations not yet stopped or too
// late. The partial index cancellations_unsettled holds only those, so a
// read with it reads the few unsettled rows, not the table.
const UnsettledCancellation = `state IN ('requested', 'accepted', 'stopping')`

// Writes.
const (
	InsertRunSQL         = `INSERT INTO runs (` + RunCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	InsertBudgetSQL      = `INSERT INTO budgets (` + BudgetCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	InsertActionSQL      = `INSERT INTO actions (` + ActionCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	InsertObservationSQL = `INSERT INTO observations (` + ObservationCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	InsertApprovalSQL    = `INSERT INTO approvals (` + ApprovalCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	InsertEventSQL       = `INSERT INTO events (` + EventCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	CountAttemptSQL      = `UPDATE budgets SET attempts_used = attempts_used + 1, version = version + 1 WHERE run_id = ?`
	FinishAttemptSQL     = `UPDATE attempts SET status = ?, result = ?, error = ?, finished_at = ?, version = version + 1
	WHERE id = ? AND status = 'started'`
	SetAttemptEffectSQL = `UPDATE attempts SET effect = ?, effect_observation_id = ?, version = version + 1
	WHERE id = ? AND effect = 'unknown'`
	// MoveApprovalSQL settles an approval (decided_by and execute_by only
	// when given) and hands back its row.
	MoveApprovalSQL = `UPDATE approvals SET state = ?, version = version + 1, decided_at = ?, reason = ?,
	decided_by = COALESCE(?, decided_by), execute_by = COALESCE(?, execute_by) WHERE id = ? AND state = ? RETURNING ` + ApprovalCols
	// StaleApprovalSQL records why a granted approval no longer covers a
	// begin, once, and hands back its row.
	StaleApprovalSQL = `UPDATE approvals SET stale_at = ?, stale_reason = ?, version = version + 1
	WHERE id = ? AND state = 'granted' AND stale_at IS NULL RETURNING ` + ApprovalCols
	// InsertRuleSetSQL stores a rule set unless its digest is stored.
	InsertRuleSetSQL = `INSERT INTO rule_sets (` + RuleSetCols + `) VALUES (?, ?, ?) ON CONFLICT (digest) DO NOTHING`
	// ProbeSQL raises the store probe's counter (ledger.Tx.Probe).
	ProbeSQL               = `INSERT INTO store_probes (id, probes) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET probes = store_probes.probes + 1`
	MoveChainHeadSQL       = `UPDATE runs SET event_seq = ?, event_hash = ? WHERE id = ? AND event_seq = ?`
	MoveChainHeadFencedSQL = MoveChainHeadSQL + ` AND lease_token = ?`
	ReleaseRunLeaseSQL     = `UPDATE runs SET lease_owner = NULL, lease_until = 0 WHERE id = ? AND lease_owner = ? AND lease_token = ?`
	PutSignatureSQL        = `INSERT INTO chain_signatures (` + SignatureCols + `) VALUES (?, ?, ?, ?, ?, ?)
	ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, signed_at = excluded.signed_at,
	key_id = excluded.key_id, signature = excluded.signature`
)

// Writes guarded on a row's version (or, for a budget, on its usage as the
// rules read it): the recovery scan writes the rows it decided on as it
// decided them, in one UPDATE each, instead of a move per fact.
const (
	SetBudgetUsedSQL = `UPDATE budgets SET attempts_used = ?, execution_used_us = ?, steps_used = ?, tokens_used = ?,
	tokens_unavailable = ?, version = version + 1 WHERE run_id = ? AND attempts_used = ? AND execution_used_us = ?
	AND steps_used = ? AND tokens_used = ? AND tokens_unavailable = ?`
	SetActionSQL = `UPDATE actions SET state = ?, attempt_count = ?, version = ?, updated_at = ?
	WHERE id = ? AND version = ?`
	SetAttemptSQL = `UPDATE attempts SET status = ?, effect = ?, effect_observation_id = ?, result = ?, error = ?,
	finished_at = ?, version = ? WHERE id = ? AND version = ?`
)

// CancellationTimeColumn is the column that records when a cancellation
// reached each state after requested; a state missing here is not one a
// cancellation moves to.
var CancellationTimeColumn = map[ledger.CancellationState]string{
	ledger.CancelAccepted: "accepted_at",
	ledger.CancelStopping: "stopping_at",
	ledger.CancelStopped:  "stopped_at",
	ledger.CancelTooLate:  "too_late_at",
}

// Where is the WHERE clause of a list query with optional filters: the
// statement text depends only on which filters are set, so a handful of
// texts are prepared, whatever the values.
type Where struct {
	conds []string
	// Args are the arguments of the conditions, then the limit's.
	Args []any
}

// Add adds the condition cond with its arguments.
func (w *Where) Add(cond string, args ...any) {
	w.conds = append(w.conds, cond)
	w.Args = append(w.Args, args...)
}

// Query returns base with the WHERE clause, ORDER BY order and, if limit is
// positive, a LIMIT (as an argument, so it does not change the text).
func (w *Where) Query(base, order string, limit int) string {
	var b strings.Builder
	b.WriteString(base)
	for i, c := range w.conds {
		if i == 0 {
			b.WriteString(" WHERE ")
		} else {
			b.WriteString(" AND ")
		}
		b.WriteString(c)
	}
	b.WriteString(" ORDER BY ")
	b.WriteString(order)
	if limit > 0 {
		b.WriteString(" LIMIT ?")
		w.Args = append(w.Args, limit)
	}
	return b.String()
}

// Qualified is the column list cols with every column qualified by alias.
func Qualified(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
