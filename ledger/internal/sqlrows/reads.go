package sqlrows

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/actionledger/ledger/ledger"
)

// Query runs a read on the driver's connection, transaction or snapshot
// and returns its rows.
type Query func(ctx context.Context, query string, args ...any) (*sql.Rows, error)

// ScanAll scans every row with scan and closes rows; no row is an empty
// slice.
func ScanAll[T any](rows *sql.Rows, scan func(*sql.Rows) (T, error)) ([]T, error) {
	defer func() { _ = rows.Close() }()
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

// ScanEvents scans rows of ListEventsSQL's columns (EventCols) into one
// slab of Events, sized by want; if ctx is done when they end or fail, its
// error is the result. Data and Rows are nil for SQL NULL. It does not
// close rows.
func ScanEvents(ctx context.Context, rows *sql.Rows, want int64) ([]*ledger.Event, error) {
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
		e.CreatedAt = FromMicros(created)
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

// recoveryFactsSelect reads, for each selected action, the action, its run
// and budget, its last attempt and its run's cancellation in one pass: one
// row per action. A WHERE clause (the selection) follows it.
var recoveryFactsSelect = `SELECT ` + Qualified("a", ActionCols) + `,
	` + RunBudgetCols + `,
	` + JoinedAttemptCols + `,
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
// cursor and the size, three times, then the size again. SQLite takes no
// parenthesised branch of a UNION and PostgreSQL no subquery without an
// alias, hence the SELECT * FROM (…) AS of each.
const recoveryRunsPage = ` AND a.run_id IN (SELECT run_id FROM (
	SELECT * FROM (SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'approved' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?) AS approved
	UNION SELECT * FROM (SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'running' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?) AS running
	UNION SELECT * FROM (SELECT DISTINCT a2.run_id FROM actions a2 JOIN runs r2 ON r2.id = a2.run_id
		WHERE a2.state = 'uncertain' AND a2.run_id > ? AND r2.state NOT IN ('completed', 'stopped', 'failed') ORDER BY a2.run_id LIMIT ?) AS uncertain
	) AS page ORDER BY run_id LIMIT ?)`

// recoveryUnknownObservations reads the query and cancel observations with
// an unknown effect about the selected actions. The selection's WHERE
// clause follows it.
var recoveryUnknownObservations = `SELECT ` + Qualified("o", ObservationCols) + `
FROM actions a
JOIN runs r ON r.id = a.run_id
JOIN observations o ON o.action_id = a.id
`

// ListRecoveryFacts is ledger.Reader's ListRecoveryFacts with q, whose
// reads must see one snapshot: the facts f selects, in (run, seq) order,
// and the unknown query and cancel observations about their attempts, in
// time order. noLimit is the dialect's LIMIT argument for no limit (-1 on
// SQLite, NULL on PostgreSQL).
func ListRecoveryFacts(ctx context.Context, q Query, f ledger.RecoveryFilter, noLimit any) ([]*ledger.RecoveryFacts, []*ledger.Observation, error) {
	var where string
	var args []any
	switch {
	case f.ActionID != nil:
		where, args = `WHERE a.id = ?`, []any{string(*f.ActionID)}
	case f.AfterRun != nil || f.Runs > 0:
		after, limit := "", noLimit
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
	rows, err := q(ctx, recoveryFactsSelect+where+` ORDER BY a.run_id, a.seq`, args...)
	if err != nil {
		return nil, nil, err
	}
	facts, err := ScanAll(rows, scanRecoveryFacts)
	if err != nil {
		return nil, nil, err
	}
	attempts := make(map[ledger.AttemptID]bool, len(facts))
	for _, rf := range facts {
		if rf.Attempt != nil {
			attempts[rf.Attempt.ID] = true
		}
	}
	obs := []*ledger.Observation{}
	if len(attempts) == 0 {
		return facts, obs, nil
	}
	rows, err = q(ctx, recoveryUnknownObservations+where+` AND o.source IN (?, ?) AND o.effect = ? ORDER BY o.observed_at, o.id`,
		append(args, string(ledger.ObservedQuery), string(ledger.ObservedCancel), string(ledger.EffectUnknown))...)
	if err != nil {
		return nil, nil, err
	}
	unknown, err := ScanAll(rows, ScanObservation)
	if err != nil {
		return nil, nil, err
	}
	for _, o := range unknown {
		if attempts[o.AttemptID] {
			obs = append(obs, o)
		}
	}
	return facts, obs, nil
}

func scanRecoveryFacts(rows *sql.Rows) (*ledger.RecoveryFacts, error) {
	var (
		a      Action
		r      Run
		b      Budget
		t      JoinedAttempt
		cancel sql.NullString
	)
	targets := append(append(append(a.Targets(), RunBudgetTargets(&r, &b)...), t.Targets()...), &cancel)
	if err := rows.Scan(targets...); err != nil {
		return nil, err
	}
	b.RunID = r.ID
	att, err := t.ToAttempt(a.ID, a.RunID)
	if err != nil {
		return nil, err
	}
	return &ledger.RecoveryFacts{Run: r.ToRun(&b), Action: a.ToAction(), Attempt: att,
		Cancellation: ledger.CancellationState(cancel.String)}, nil
}

// countQueries are the GROUP BY queries of CountByState; each reads an
// index on state (runs_state, actions_state, attempts_status) or, for
// approvals and signatures, scans a table that holds one row per gated
// action, or per signed run.
var countQueries = struct{ runs, actions, approvals, attempts, signatures string }{
	runs:       `SELECT state, COUNT(*) FROM runs GROUP BY state`,
	actions:    `SELECT state, COUNT(*) FROM actions GROUP BY state`,
	approvals:  `SELECT state, COUNT(*) FROM approvals GROUP BY state`,
	attempts:   `SELECT status, effect, COUNT(*) FROM attempts GROUP BY status, effect`,
	signatures: `SELECT key_id, COUNT(*) FROM chain_signatures GROUP BY key_id`,
}

// CountByState is ledger.Reader's CountByState with q, whose reads must
// see one snapshot.
func CountByState(ctx context.Context, q Query) (*ledger.Counts, error) {
	out := &ledger.Counts{Runs: map[ledger.RunState]int64{}, Actions: map[ledger.ActionState]int64{},
		Approvals: map[ledger.ApprovalState]int64{}, Attempts: map[ledger.AttemptCountKey]int64{}, Signatures: map[string]int64{}}
	for _, c := range []struct {
		q   string
		put func(string, int64)
	}{
		{countQueries.runs, func(s string, n int64) { out.Runs[ledger.RunState(s)] = n }},
		{countQueries.actions, func(s string, n int64) { out.Actions[ledger.ActionState(s)] = n }},
		{countQueries.approvals, func(s string, n int64) { out.Approvals[ledger.ApprovalState(s)] = n }},
		{countQueries.signatures, func(s string, n int64) { out.Signatures[s] = n }},
	} {
		rows, err := q(ctx, c.q)
		if err != nil {
			return nil, err
		}
		if _, err := ScanAll(rows, func(rows *sql.Rows) (struct{}, error) {
			var (
				s string
				n int64
			)
			err := rows.Scan(&s, &n)
			c.put(s, n)
			return struct{}{}, err
		}); err != nil {
			return nil, err
		}
	}
	rows, err := q(ctx, countQueries.attempts)
	if err != nil {
		return nil, err
	}
	if _, err := ScanAll(rows, func(rows *sql.Rows) (struct{}, error) {
		var (
			k ledger.AttemptCountKey
			n int64
		)
		err := rows.Scan((*string)(&k.Status), (*string)(&k.Effect), &n)
		out.Attempts[k] = n
		return struct{}{}, err
	}); err != nil {
		return nil, err
	}
	return out, nil
}
