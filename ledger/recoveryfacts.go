package ledger

import (
	"context"
	"database/sql"
	"encoding/json"

	"gorm.io/gorm"
)

// RecoveryFilter selects what FindRecoveryFacts returns. The zero value
// selects every action recovery has to decide.
type RecoveryFilter struct {
	// ActionID, if set, selects that one action whatever its state and its
	// run's (a caller recovering one action it already chose); the other
	// fields are ignored then.
	ActionID *ActionID
	// AfterRun and Runs page through the scan by run, so that its memory
	// does not grow with the ledger: only runs whose id is greater than
	// AfterRun, and at most Runs of them (0: no limit). A page never splits
	// a run's actions.
	AfterRun *RunID
	Runs     int
}

// RecoveryFacts is what the ledger knows of one action recovery has to
// decide, read in one snapshot: the action, its run with the run's budget,
// its last attempt, how many queries about that attempt failed, and the
// run's cancellation.
type RecoveryFacts struct {
	Run    *Run
	Action *Action
	// Attempt is the action's last attempt (highest number); nil if it has
	// none.
	Attempt *Attempt
	// FailedQueries counts the failed queries recorded about Attempt:
	// observations from a query (source tool_query) with an unknown effect
	// whose detail is a JSON object with a non-empty string "error" — what
	// recovery records when a query fails, as opposed to a tool answering
	// "unknown".
	FailedQueries int
	// UnknownQueries counts every query about Attempt that did not
	// establish its effect (failed, or answered unknown); UnknownCancels
	// every cancel about it that was not confirmed. An agent that answers
	// for its tool (the agent protocol) is asked again only while these
	// say it has not answered yet.
	UnknownQueries, UnknownCancels int
	// Cancellation is the state of the run's cancellation; "" if none was
	// requested.
	Cancellation CancellationState
}

// recoveryFactsSelect reads, for each selected action, the action, its run and
// budget, its last attempt and its run's cancellation in one pass: one row
// per action, hand-scanned. A WHERE clause (the selection) follows it.
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
func (s *GormStore) FindRecoveryFacts(ctx context.Context, f RecoveryFilter) ([]*RecoveryFacts, error) {
	var where string
	var args []any
	switch {
	case f.ActionID != nil:
		where, args = `WHERE a.id = ?`, []any{string(*f.ActionID)}
	case f.Runs < 0:
		return nil, Errorf(CodeInvalid, "find recovery facts: runs cannot be negative")
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
	var out []*RecoveryFacts
	// One read transaction: the facts and the failure counts come from
	// the same snapshot.
	err := s.r.WithContext(ctx).Transaction(func(db *gorm.DB) error {
		var err error
		if out, err = scanRecoveryFacts(db, recoveryFactsSelect+where+` ORDER BY a.run_id, a.seq`, args); err != nil {
			return err
		}
		if len(out) == 0 {
			return nil
		}
		byAttempt := make(map[AttemptID]*RecoveryFacts, len(out))
		for _, rf := range out {
			if rf.Attempt != nil {
				byAttempt[rf.Attempt.ID] = rf
			}
		}
		if len(byAttempt) == 0 {
			return nil
		}
		rows, err := db.Raw(recoveryUnknownQueries+where+` AND o.source IN (?, ?) AND o.effect = ?`,
			append(args, string(ObservedQuery), string(ObservedCancel), string(EffectUnknown))...).Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var att, detail, source sql.NullString
			if err := rows.Scan(&att, &detail, &source); err != nil {
				return err
			}
			rf := byAttempt[AttemptID(att.String)]
			switch {
			case rf == nil:
			case source.String == string(ObservedCancel):
				rf.UnknownCancels++
			default:
				rf.UnknownQueries++
				if isFailedQuery(detail.String) {
					rf.FailedQueries++
				}
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, wrapErr("find recovery facts", err)
	}
	if f.ActionID != nil && len(out) == 0 {
		return nil, Errorf(CodeNotFound, "find recovery facts: action %s not found", *f.ActionID)
	}
	return out, nil
}

// isFailedQuery reports whether an observation's detail records a failed
// query: a JSON object whose "error" is a non-empty string (what recovery
// writes for a query that returned an error).
func isFailedQuery(detail string) bool {
	if detail == "" {
		return false
	}
	var d struct {
		Error string `json:"error"`
	}
	return json.Unmarshal([]byte(detail), &d) == nil && d.Error != ""
}

func scanRecoveryFacts(db *gorm.DB, query string, args []any) ([]*RecoveryFacts, error) {
	rows, err := db.Raw(query, args...).Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*RecoveryFacts
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
		rf := &RecoveryFacts{Run: r.toRun(&b), Action: a.toAction(), Cancellation: CancellationState(cancel.String)}
		if t.ID.Valid {
			if rf.Attempt, err = t.toAttempt(ActionID(a.ID), RunID(a.RunID)); err != nil {
				return nil, err
			}
		}
		out = append(out, rf)
	}
	return out, rows.Err()
}
