package ledger

import (
	"context"

	"gorm.io/gorm"
)

// Counts is how many runs, actions, approvals and attempts the ledger
// holds, by state (attempts by status and effect fact), across every
// tenant. A state with no rows is absent from its map.
type Counts struct {
	Runs      map[RunState]int64
	Actions   map[ActionState]int64
	Approvals map[ApprovalState]int64
	Attempts  map[AttemptCountKey]int64
}

// AttemptCountKey is the pair attempts are counted by.
type AttemptCountKey struct {
	Status AttemptStatus
	Effect EffectFact
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

// CountByState implements Store: four counting queries in one read
// transaction, so the counts come from one snapshot, without loading rows.
func (s *GormStore) CountByState(ctx context.Context) (*Counts, error) {
	out := &Counts{Runs: map[RunState]int64{}, Actions: map[ActionState]int64{},
		Approvals: map[ApprovalState]int64{}, Attempts: map[AttemptCountKey]int64{}}
	err := s.r.WithContext(ctx).Transaction(func(db *gorm.DB) error {
		if err := countBy(db, countQueries.runs, func(st string, n int64) { out.Runs[RunState(st)] = n }); err != nil {
			return err
		}
		if err := countBy(db, countQueries.actions, func(st string, n int64) { out.Actions[ActionState(st)] = n }); err != nil {
			return err
		}
		if err := countBy(db, countQueries.approvals, func(st string, n int64) { out.Approvals[ApprovalState(st)] = n }); err != nil {
			return err
		}
		rows, err := db.Raw(countQueries.attempts).Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				k AttemptCountKey
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
		return nil, wrapErr("count by state", err)
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
