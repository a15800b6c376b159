package ledger

import (
	"database/sql"
	"fmt"

	"gorm.io/gorm"
)

// findChainEventsSQL reads a run's events in chain order. FindChain reads
// every event of a run for each evidence export and timeline, so the rows
// are scanned by hand into one slab of Events rather than through GORM's
// reflection into rows that are then copied.
const findChainEventsSQL = `SELECT id, run_id, seq, type, entity_type, entity_id, from_state, to_state,
	actor, data, created_at, prev_hash, hash FROM events WHERE run_id = ? ORDER BY seq`

// readChainEvents reads run's events on db, which FindChain has begun a
// read transaction on; want is how many the run's head says there are, to
// size the result (a tampered chain may hold more or fewer).
func readChainEvents(db *gorm.DB, run RunID, want int64) ([]*Event, error) {
	rows, err := db.Raw(findChainEventsSQL, string(run)).Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanEvents(rows, want)
}

// scanEvents scans rows of findChainEventsSQL's columns. The Events share
// one backing array; Data is nil for SQL NULL.
func scanEvents(rows *sql.Rows, want int64) ([]*Event, error) {
	slab := make([]Event, 0, max(0, min(want, 1<<20)))
	var created int64
	for rows.Next() {
		slab = append(slab, Event{})
		e := &slab[len(slab)-1]
		if err := rows.Scan((*string)(&e.ID), (*string)(&e.RunID), &e.Seq, &e.Type, &e.EntityType, &e.EntityID,
			&e.FromState, &e.ToState, &e.Actor, (*[]byte)(&e.Data), &created, &e.PrevHash, &e.Hash); err != nil {
			return nil, fmt.Errorf("scan event %d: %w", len(slab), err)
		}
		e.CreatedAt = fromMicros(created)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]*Event, len(slab))
	for i := range slab {
		out[i] = &slab[i]
	}
	return out, nil
}
