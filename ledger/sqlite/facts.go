package sqlite

import (
	"context"
	"database/sql"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
)

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
// uncertain of runs that are not terminal. The actions_state index finds
// them without reading settled actions.
const recoveryUnsettled = `WHERE a.state IN ('approved', 'running', 'uncertain')
	AND r.state NOT IN ('completed', 'stopped', 'failed')`

// recoveryRunsPage narrows recoveryUnsettled to a page of runs: the first
// runs (by id) after a cursor. Each branch walks actions_state in run order
// for one state and stops at the page's size, so a page costs its size,
// not the number of unsettled actions after the cursor. Arguments: the
// cursor and the size (-1: no limit), three times, then the size again.
const recoveryRunsPage = ` AND a.run_id IN (SELECT run_id FROM (
	SELECT * FROM (SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'approved' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?)
	UNION SELECT * FROM (SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'running' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?)
	UNION SELECT * FROM (SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'uncertain' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?)
	) ORDER BY run_id LIMIT ?)`

// recoveryUnknownQueries reads the detail of every query observation with
// an unknown effect about the selected actions; whether one is a failed
// query is decided in Go (isFailedQuery). The selection's WHERE clause
// follows it.
const recoveryUnknownQueries = `SELECT o.attempt_id, o.detail, o.source
FROM actions a
JOIN runs r ON r.id = a.run_id
JOIN observations o ON o.action_id = a.id
`

// FindRecoveryFacts implements Store.
// ListRecoveryFacts reads the facts and the unknown query and cancel
// observations about their attempts from one snapshot.
func (r reader) ListRecoveryFacts(ctx context.Context, f ledger.RecoveryFilter) ([]*ledger.RecoveryFacts, []*ledger.Observation, error) {
	var where string
	var args []any
	switch {
	case f.ActionID != nil:
		where, args = `WHERE a.id = ?`, []any{string(*f.ActionID)}
	case f.AfterRun != nil || f.Runs > 0:
		after, limit := "", -1
		if f.AfterRun != nil {
			after = string(*f.AfterRun)
		}
		if f.Runs > 0 {
			limit = f.Runs
		}
		where, args = recoveryUnsettled+recoveryRunsPage, []any{after, limit, after, limit, after, limit, limit}
	default:
		where = recoveryUnsettled
	}
	var (
		facts []*ledger.RecoveryFacts
		obs   []*ledger.Observation
	)
	err := r.snapshot(ctx, func(db *gorm.DB) error {
		var err error
		if facts, err = scanRecoveryFacts(db, recoveryFactsSelect+where+` ORDER BY a.run_id, a.seq`, args); err != nil || len(facts) == 0 {
			return err
		}
		rows, err := db.Raw(recoveryUnknownQueries+where+` AND o.source IN (?, ?) AND o.effect = ?`,
			append(args, string(ledger.ObservedQuery), string(ledger.ObservedCancel), string(ledger.EffectUnknown))...).Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var att, detail, source sql.NullString
			if err := rows.Scan(&att, &detail, &source); err != nil {
				return err
			}
			o := &ledger.Observation{AttemptID: ledger.AttemptID(att.String), Source: ledger.ObservationSource(source.String),
				Effect: ledger.EffectUnknown}
			if detail.Valid {
				o.Detail = []byte(detail.String)
			}
			obs = append(obs, o)
		}
		return rows.Err()
	})
	return facts, obs, translate(err)
}

func scanRecoveryFacts(db *gorm.DB, query string, args []any) ([]*ledger.RecoveryFacts, error) {
	rows, err := db.Raw(query, args...).Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*ledger.RecoveryFacts
	for rows.Next() {
		var (
			a      actionRow
			r      runRow
			b      budgetRow
			t      nullableAttemptRow
			cancel sql.NullString
		)
		targets := append(append(append(a.targets(), runBudgetTargets(&r, &b)...), t.targets()...), &cancel)
		if err := rows.Scan(targets...); err != nil {
			return nil, err
		}
		b.RunID = r.ID
		rf := &ledger.RecoveryFacts{Run: r.toRun(&b), Action: a.toAction(), Cancellation: ledger.CancellationState(cancel.String)}
		if t.ID.Valid {
			if rf.Attempt, err = t.toAttempt(ledger.ActionID(a.ID), ledger.RunID(a.RunID)); err != nil {
				return nil, err
			}
		}
		out = append(out, rf)
	}
	return out, rows.Err()
}

// countQueries are the GROUP BY queries of CountByState; each reads an
// index on state (runs_state, actions_state, attempts_status) or, for
// approvals, scans a table that holds one row per gated action.
var countQueries = struct{ runs, actions, approvals, attempts string }{
	runs:      `SELECT state, COUNT(*) FROM runs GROUP BY state`,
	actions:   `SELECT state, COUNT(*) FROM actions GROUP BY state`,
	approvals: `SELECT state, COUNT(*) FROM approvals GROUP BY state`,
	attempts:  `SELECT status, effect, COUNT(*) FROM attempts GROUP BY status, effect`,
}

// CountByState counts from one snapshot.
func (r reader) CountByState(ctx context.Context) (*ledger.Counts, error) {
	out := &ledger.Counts{Runs: map[ledger.RunState]int64{}, Actions: map[ledger.ActionState]int64{},
		Approvals: map[ledger.ApprovalState]int64{}, Attempts: map[ledger.AttemptCountKey]int64{}}
	err := r.snapshot(ctx, func(db *gorm.DB) error {
		if err := countBy(db, countQueries.runs, func(st string, n int64) { out.Runs[ledger.RunState(st)] = n }); err != nil {
			return err
		}
		if err := countBy(db, countQueries.actions, func(st string, n int64) { out.Actions[ledger.ActionState(st)] = n }); err != nil {
			return err
		}
		if err := countBy(db, countQueries.approvals, func(st string, n int64) { out.Approvals[ledger.ApprovalState(st)] = n }); err != nil {
			return err
		}
		rows, err := db.Raw(countQueries.attempts).Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				k ledger.AttemptCountKey
				n int64
			)
			if err := rows.Scan((*string)(&k.Status), (*string)(&k.Effect), &n); err != nil {
				return err
			}
			out.Attempts[k] = n
		}
		return rows.Err()
	})
	if err != nil {
		return nil, translate(err)
	}
	return out, nil
}

// countBy runs a (state, count) query and hands each row to put.
func countBy(db *gorm.DB, query string, put func(state string, n int64)) error {
	rows, err := db.Raw(query).Rows()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			st string
			n  int64
		)
		if err := rows.Scan(&st, &n); err != nil {
			return err
		}
		put(st, n)
	}
	return rows.Err()
}
