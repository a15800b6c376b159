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
	actor, data, created_at, prev_hash, hash, format, row_digests FROM events WHERE run_id = ? ORDER BY seq`

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
// rows for it). The Events share one backing array; Data and Rows are nil
// for SQL NULL.
func scanEvents(ctx context.Context, rows *sql.Rows, want int64) ([]*Event, error) {
	slab := make([]Event, 0, max(0, min(want, 1<<20)))
	var created int64
	for rows.Next() {
		slab = append(slab, Event{})
		e := &slab[len(slab)-1]
		if err := rows.Scan((*string)(&e.ID), (*string)(&e.RunID), &e.Seq, &e.Type, &e.EntityType, &e.EntityID,
			&e.FromState, &e.ToState, &e.Actor, (*[]byte)(&e.Data), &created, &e.PrevHash, &e.Hash, &e.Format,
			(*[]byte)(&e.Rows)); err != nil {
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

// readRecord reads on db (FindChain's read transaction) a run with its
// budget, actions, attempts, approvals, cancellation, observations and
// head signature into out; CodeNotFound if the run is unknown. Like
// readChainEvents, the statements run without the caller's cancellation,
// which is checked before each; a read that fails once the context is
// done (database/sql closes the transaction's rows for it) fails with the
// context's error.
func readRecord(db *gorm.DB, run RunID, out *Chain) (err error) {
	ctx := db.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	defer func() {
		if cerr := ctx.Err(); err != nil && cerr != nil {
			err = cerr
		}
	}()
	q := db.WithContext(context.WithoutCancel(ctx))
	rows := func(query string, args ...any) (*sql.Rows, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return q.Raw(query, args...).Rows()
	}
	r, err := rows(findRunSQL.sql, string(run))
	if out.Run, err = scanRun(r, err, run); err != nil {
		return err
	}
	r, err = rows(`SELECT `+actionCols+` FROM actions WHERE run_id = ? ORDER BY seq`, string(run))
	if err != nil {
		return err
	}
	out.Actions, err = scanAll(r, func(rows *sql.Rows) (*Action, error) {
		var a actionRow
		if err := scanAction(rows, &a); err != nil {
			return nil, err
		}
		return a.toAction(), nil
	})
	if err != nil {
		return fmt.Errorf("read actions: %w", err)
	}
	r, err = rows(`SELECT `+attemptCols+` FROM attempts WHERE run_id = ? ORDER BY action_id, attempt_no`, string(run))
	if err != nil {
		return err
	}
	out.Attempts, err = scanAll(r, func(rows *sql.Rows) (*Attempt, error) {
		var a attemptRow
		if err := scanAttempt(rows, &a); err != nil {
			return nil, err
		}
		return a.toAttempt()
	})
	if err != nil {
		return fmt.Errorf("read attempts: %w", err)
	}
	var approvals []approvalRow
	if err := approvalsQuery(q, ApprovalFilter{RunID: &run}).Find(&approvals).Error; err != nil {
		return fmt.Errorf("read approvals: %w", err)
	}
	out.Approvals = make([]*Approval, len(approvals))
	for i := range approvals {
		out.Approvals[i] = approvals[i].toApproval()
	}
	r, err = rows(findCancellationSQL.sql, string(run))
	out.Cancellation, err = scanCancellation(r, err, run)
	switch {
	case Code(err) == CodeNotFound:
		out.Cancellation = nil
	case err != nil:
		return err
	}
	var observations []observationRow
	if err := observationsQuery(q, ObservationFilter{RunID: &run}).Find(&observations).Error; err != nil {
		return fmt.Errorf("read observations: %w", err)
	}
	out.Observations = make([]*Observation, len(observations))
	for i := range observations {
		out.Observations[i] = observations[i].toObservation()
	}
	var sig []signatureRow
	if err := q.Where("run_id = ?", string(run)).Limit(1).Find(&sig).Error; err != nil {
		return fmt.Errorf("read head signature: %w", err)
	}
	if len(sig) == 1 {
		out.Signature = sig[0].toSignature()
	}
	return ctx.Err()
}

// scanAll scans every row with scan and closes rows.
func scanAll[T any](rows *sql.Rows, scan func(*sql.Rows) (T, error)) ([]T, error) {
	defer rows.Close()
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
