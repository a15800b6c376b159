package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// chainFixture is a run with a few events, and a raw handle on the same
// database for doing what an attacker with database access would do.
func chainFixture(t *testing.T, h Harness) (*bundle, *ledger.Run, DB) {
	t.Helper()
	ctx := context.Background()
	b := openStore(t, h)
	run := b.RunningRun(t, "k", ledger.BudgetLimits{})
	a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
	att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
	require.NoError(t, err)
	_, err = b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded,
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened}})
	require.NoError(t, err)
	rep, err := b.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.GreaterOrEqual(t, rep.Events, 8)
	return b, run, b.DB
}

// readEvent returns event seq of run as the Store reads it (before any
// tampering, the event as written).
func readEvent(t *testing.T, s ledger.Store, run ledger.RunID, seq int64) *ledger.Event {
	t.Helper()
	events, err := s.FindEvents(context.Background(), run)
	require.NoError(t, err)
	for _, e := range events {
		if e.Seq == seq {
			return e
		}
	}
	t.Fatalf("run %s has no event %d", run, seq)
	return nil
}

// dropAppendOnly lets db's events and observations be edited.
func dropAppendOnly(t *testing.T, db DB) {
	t.Helper()
	require.NoError(t, db.DropAppendOnly(context.Background()))
}

func testEventsAppendOnly(t *testing.T, h Harness) {
	_, run, db := chainFixture(t, h)
	ctx := context.Background()
	err := db.Exec(ctx, `UPDATE events SET actor = 'mallory' WHERE run_id = ? AND seq = 2`, string(run.ID))
	require.ErrorContains(t, err, "append-only")
	err = db.Exec(ctx, `DELETE FROM events WHERE run_id = ?`, string(run.ID))
	require.ErrorContains(t, err, "append-only")
	err = db.Exec(ctx, `DELETE FROM observations`)
	require.ErrorContains(t, err, "append-only")
}

func testVerifyChainDetectsTampering(t *testing.T, h Harness) {
	ctx := context.Background()
	cases := map[string]struct {
		tamper    func(t *testing.T, db DB, s ledger.Store, run ledger.RunID)
		brokenSeq int64
		reason    string
	}{
		"edited data": {func(t *testing.T, db DB, s ledger.Store, run ledger.RunID) {
			exec(t, db, `UPDATE events SET data = '{"agent":"evil"}' WHERE run_id = ? AND seq = 1`, run)
		}, 1, "changed"},
		"edited actor": {func(t *testing.T, db DB, s ledger.Store, run ledger.RunID) {
			exec(t, db, `UPDATE events SET actor = 'mallory' WHERE run_id = ? AND seq = 4`, run)
		}, 4, "changed"},
		"edited state": {func(t *testing.T, db DB, s ledger.Store, run ledger.RunID) {
			exec(t, db, `UPDATE events SET to_state = 'failed' WHERE run_id = ? AND seq = 5`, run)
		}, 5, "changed"},
		"deleted from the middle": {func(t *testing.T, db DB, s ledger.Store, run ledger.RunID) {
			exec(t, db, `DELETE FROM events WHERE run_id = ? AND seq = 3`, run)
		}, 3, "missing"},
		"deleted and renumbered": {func(t *testing.T, db DB, s ledger.Store, run ledger.RunID) {
			exec(t, db, `DELETE FROM events WHERE run_id = ? AND seq = 3`, run)
			// One row at a time, in order: a single UPDATE of every seq
			// may pass through a duplicate (run_id, seq) on the way.
			r, err := s.FindRunByID(context.Background(), run)
			require.NoError(t, err)
			for seq := int64(4); seq <= r.EventSeq; seq++ {
				exec(t, db, `UPDATE events SET seq = ? WHERE run_id = ? AND seq = ?`, seq-1, run, seq)
			}
		}, 3, "prev_hash"},
		"deleted from the end": {func(t *testing.T, db DB, s ledger.Store, run ledger.RunID) {
			exec(t, db, `DELETE FROM events WHERE run_id = ? AND seq = (SELECT MAX(seq) FROM events WHERE run_id = ?)`, run, run)
		}, 0, "removed from the end"},
		"reordered": {func(t *testing.T, db DB, s ledger.Store, run ledger.RunID) {
			exec(t, db, `UPDATE events SET seq = 1000 WHERE run_id = ? AND seq = 4`, run)
			exec(t, db, `UPDATE events SET seq = 4 WHERE run_id = ? AND seq = 5`, run)
			exec(t, db, `UPDATE events SET seq = 5 WHERE run_id = ? AND seq = 1000`, run)
		}, 4, ""},
		"rehashed edit still breaks the next link": {func(t *testing.T, db DB, s ledger.Store, run ledger.RunID) {
			// Recomputing the edited event's own hash is not enough: its
			// successor still points at the old one.
			e := readEvent(t, s, run, 2)
			e.Actor = "mallory"
			h, err := e.ComputeHash()
			require.NoError(t, err)
			exec(t, db, `UPDATE events SET actor = ?, hash = ? WHERE run_id = ? AND seq = 2`, e.Actor, h, run)
		}, 3, "prev_hash"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b, run, db := chainFixture(t, h)
			dropAppendOnly(t, db)
			tc.tamper(t, db, b.Store, run.ID)
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
		b := openStore(t, h)
		_, err := b.Store.VerifyChain(ctx, "run_nope")
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

// testFindChainEvents: FindChain's hand-scanned events are the events as
// written, field for field, the same as FindEvents returns, with and
// without data.
func testFindChainEvents(t *testing.T, h Harness) {
	ctx := context.Background()
	b, run, _ := chainFixture(t, h)
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
