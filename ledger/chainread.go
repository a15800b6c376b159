package ledger

import (
	"context"
	"database/sql"
	"fmt"

	"gorm.io/gorm"
)

// findChainEventsSQL reads a run's events in chain order. FindChain and
// FindEvents read every event of a run for each evidence export and
// timeline, so the rows are scanned by hand into one slab of Events rather
// than through GORM's reflection into rows that are then copied.
const findChainEventsSQL = `SELECT id, run_id, seq, type, entity_type, entity_id, from_state, to_state,
	actor, data, created_at, prev_hash, hash FROM events WHERE run_id = ? ORDER BY seq`

// readChainEvents reads run's events on db (FindChain's read transaction,
// or the reader pool for FindEvents); want is how many the run's head says
// there are, to size the result (a tampered chain may hold more or fewer;
// 0 if unknown).
//
// The query runs without the caller's cancellation: for a cancellable
// context mattn/go-sqlite3 steps every row on a goroutine of its own and
// hands it back over a channel, which for a 10,000-event chain took as long
// as the rest of the read. The caller's context still ends the read:
// database/sql closes a transaction's rows, once, when the context the
// transaction began with is done, and the context is checked before the
// query.
func readChainEvents(db *gorm.DB, run RunID, want int64) ([]*Event, error) {
	ctx := db.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := db.WithContext(context.WithoutCancel(ctx)).Raw(findChainEventsSQL, string(run)).Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanEvents(ctx, rows, want)
}

// scanEvents scans rows of findChainEventsSQL's columns; if ctx is done
// when they end or fail, its error is the result (database/sql closes the
// rows for it). The Events share one backing array; Data is nil for SQL
// NULL.
func scanEvents(ctx context.Context, rows *sql.Rows, want int64) ([]*Event, error) {
	slab := make([]Event, 0, max(0, min(want, 1<<20)))
	var created int64
	for rows.Next() {
		slab = append(slab, Event{})
		e := &slab[len(slab)-1]
		if err := rows.Scan((*string)(&e.ID), (*string)(&e.RunID), &e.Seq, &e.Type, &e.EntityType, &e.EntityID,
			&e.FromState, &e.ToState, &e.Actor, (*[]byte)(&e.Data), &created, &e.PrevHash, &e.Hash); err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr // database/sql closed the rows for it, between Next and Scan
			}
			return nil, fmt.Errorf("scan event %d: %w", len(slab), err)
		}
		e.CreatedAt = fromMicros(created)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err // the rows may have been closed for it, which ends Next quietly
	}
	out := make([]*Event, len(slab))
	for i := range slab {
		out[i] = &slab[i]
	}
	return out, nil
}
