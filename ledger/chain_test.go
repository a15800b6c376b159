package ledger_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	_ "github.com/mattn/go-sqlite3" // the driver under gorm.io/driver/sqlite, for tampering by hand
	"github.com/stretchr/testify/require"
)

// chainFixture is a run with a few events, and a raw connection to the same
// file for doing what an attacker with database access would do.
func chainFixture(t *testing.T) (*ledgertest.Bundle, *ledger.Run, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	b := ledgertest.OpenStore(t)
	run := b.RunningRun(t, "k", ledger.BudgetLimits{})
	a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
	att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
	require.NoError(t, err)
	_, err = b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded,
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened}, ActionState: ledger.ActionSucceeded})
	require.NoError(t, err)
	rep, err := b.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.GreaterOrEqual(t, rep.Events, 8)

	db, err := sql.Open("sqlite3", "file:"+b.Path+"?_busy_timeout=5000")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return b, run, db
}

// readEvent reads event seq of run as stored, by hand.
func readEvent(t *testing.T, db *sql.DB, run ledger.RunID, seq int64) *ledger.Event {
	t.Helper()
	var e ledger.Event
	var data, rows sql.NullString
	var created int64
	require.NoError(t, db.QueryRow(`SELECT id, run_id, seq, type, entity_type, entity_id, from_state, to_state, actor, data,
		created_at, prev_hash, hash, format, row_digests FROM events WHERE run_id = ? AND seq = ?`, run, seq).Scan(&e.ID, &e.RunID,
		&e.Seq, &e.Type, &e.EntityType, &e.EntityID, &e.FromState, &e.ToState, &e.Actor, &data, &created, &e.PrevHash, &e.Hash,
		&e.Format, &rows))
	if data.Valid {
		e.Data = []byte(data.String)
	}
	if rows.Valid {
		e.Rows = []byte(rows.String)
	}
	e.CreatedAt = time.UnixMicro(created).UTC()
	return &e
}

func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	_, err := db.Exec(q, args...)
	require.NoError(t, err, q)
}

func TestEventsAppendOnly(t *testing.T) {
	_, run, db := chainFixture(t)
	_, err := db.Exec(`UPDATE events SET actor = 'mallory' WHERE run_id = ? AND seq = 2`, run.ID)
	require.ErrorContains(t, err, "append-only")
	_, err = db.Exec(`DELETE FROM events WHERE run_id = ?`, run.ID)
	require.ErrorContains(t, err, "append-only")
	_, err = db.Exec(`DELETE FROM observations`)
	require.ErrorContains(t, err, "append-only")
}

func TestVerifyChainDetectsTampering(t *testing.T) {
	ctx := context.Background()
	cases := map[string]struct {
		tamper    func(t *testing.T, db *sql.DB, run ledger.RunID)
		brokenSeq int64
		reason    string
	}{
		"edited data": {func(t *testing.T, db *sql.DB, run ledger.RunID) {
			exec(t, db, `UPDATE events SET data = '{"agent":"evil"}' WHERE run_id = ? AND seq = 1`, run)
		}, 1, "changed"},
		"edited actor": {func(t *testing.T, db *sql.DB, run ledger.RunID) {
			exec(t, db, `UPDATE events SET actor = 'mallory' WHERE run_id = ? AND seq = 4`, run)
		}, 4, "changed"},
		"edited state": {func(t *testing.T, db *sql.DB, run ledger.RunID) {
			exec(t, db, `UPDATE events SET to_state = 'failed' WHERE run_id = ? AND seq = 5`, run)
		}, 5, "changed"},
		"deleted from the middle": {func(t *testing.T, db *sql.DB, run ledger.RunID) {
			exec(t, db, `DELETE FROM events WHERE run_id = ? AND seq = 3`, run)
		}, 3, "missing"},
		"deleted and renumbered": {func(t *testing.T, db *sql.DB, run ledger.RunID) {
			exec(t, db, `DELETE FROM events WHERE run_id = ? AND seq = 3`, run)
			exec(t, db, `UPDATE events SET seq = seq - 1 WHERE run_id = ? AND seq > 3`, run)
		}, 3, "prev_hash"},
		"deleted from the end": {func(t *testing.T, db *sql.DB, run ledger.RunID) {
			exec(t, db, `DELETE FROM events WHERE run_id = ? AND seq = (SELECT MAX(seq) FROM events WHERE run_id = ?)`, run, run)
		}, 0, "removed from the end"},
		"reordered": {func(t *testing.T, db *sql.DB, run ledger.RunID) {
			exec(t, db, `UPDATE events SET seq = 1000 WHERE run_id = ? AND seq = 4`, run)
			exec(t, db, `UPDATE events SET seq = 4 WHERE run_id = ? AND seq = 5`, run)
			exec(t, db, `UPDATE events SET seq = 5 WHERE run_id = ? AND seq = 1000`, run)
		}, 4, ""},
		"rehashed edit still breaks the next link": {func(t *testing.T, db *sql.DB, run ledger.RunID) {
			// Recomputing the edited event's own hash is not enough: its
			// successor still points at the old one.
			e := readEvent(t, db, run, 2)
			e.Actor = "mallory"
			h, err := e.ComputeHash()
			require.NoError(t, err)
			exec(t, db, `UPDATE events SET actor = ?, hash = ? WHERE run_id = ? AND seq = 2`, e.Actor, h, run)
		}, 3, "prev_hash"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b, run, db := chainFixture(t)
			exec(t, db, `DROP TRIGGER events_no_update`)
			exec(t, db, `DROP TRIGGER events_no_delete`)
			tc.tamper(t, db, run.ID)
			rep, err := b.Store.VerifyChain(ctx, run.ID)
			require.NoError(t, err)
			require.False(t, rep.OK)
			if tc.brokenSeq == 0 {
				after, err := b.Store.FindRunByID(ctx, run.ID)
				require.NoError(t, err)
				tc.brokenSeq = after.EventSeq
			}
			require.Equal(t, tc.brokenSeq, rep.BrokenSeq, rep.Reason)
			require.Contains(t, rep.Reason, tc.reason)
		})
	}
	t.Run("ErrNotFound", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		_, err := b.Store.VerifyChain(ctx, "run_nope")
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

// TestFindChainEvents: FindChain's hand-scanned events are the events as
// written, field for field, the same as FindEvents returns, with and
// without data.
func TestFindChainEvents(t *testing.T) {
	ctx := context.Background()
	b, run, _ := chainFixture(t)
	chain, err := b.Store.FindChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, chain.Report.OK, chain.Report.Reason)
	events, err := b.Store.FindEvents(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, events, chain.Events)

	withData, without := 0, 0
	for i, e := range chain.Events {
		require.Equal(t, int64(i+1), e.Seq)
		require.Equal(t, run.ID, e.RunID)
		require.Equal(t, time.UTC, e.CreatedAt.Location())
		if e.Data == nil {
			without++
		} else {
			withData++
		}
	}
	require.Positive(t, withData)
	require.Positive(t, without)

	t.Run("ErrNotFound", func(t *testing.T) {
		_, err := b.Store.FindChain(ctx, "run_nope")
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}
