package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// endRun fails a live run, whatever its state.
func endRun(t *testing.T, b *bundle, run ledger.RunID) {
	t.Helper()
	ctx := context.Background()
	r, err := b.Store.FindRunByID(ctx, run)
	require.NoError(t, err)
	_, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run, From: r.State, To: ledger.RunFailed,
		StopReason: ledger.StopInternalError, Actor: "engine"})
	require.NoError(t, err)
}

// cancelEventTypes lists a run's event types after the first n.
func cancelEventTypes(t *testing.T, b *bundle, run ledger.RunID, n int) []string {
	t.Helper()
	evs, err := b.Store.FindEvents(context.Background(), run)
	require.NoError(t, err)
	var out []string
	for _, e := range evs[n:] {
		out = append(out, e.Type)
	}
	return out
}

func chainOK(t *testing.T, b *bundle, run ledger.RunID) {
	t.Helper()
	rep, err := b.Store.VerifyChain(context.Background(), run)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep)
}

func testRequestCancel(t *testing.T, h Harness) {
	ctx := context.Background()

	t.Run("OK requested, accepted and the run stopping in one write", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		before, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		res, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice", Reason: "enough"})
		require.NoError(t, err)
		require.True(t, res.Created)
		require.Equal(t, ledger.CancelAccepted, res.Cancellation.State)
		require.NotNil(t, res.Cancellation.AcceptedAt)
		require.Equal(t, "enough", res.Cancellation.Reason)
		got, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunStopping, got.State)
		require.Equal(t, []string{"cancellation.requested", "cancellation.accepted", "run.stopping"},
			cancelEventTypes(t, b, run.ID, len(before)))
		chainOK(t, b, run.ID)
	})

	t.Run("OK a repeat is the same cancellation, also once stopped", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		first, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice"})
		require.NoError(t, err)
		for _, e := range [][2]ledger.CancellationState{{ledger.CancelAccepted, ledger.CancelStopping}, {ledger.CancelStopping, ledger.CancelStopped}} {
			_, err := b.Store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID, From: e[0], To: e[1]})
			require.NoError(t, err)
		}
		_, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunStopping, To: ledger.RunStopped,
			StopReason: ledger.StopUserCancelled})
		require.NoError(t, err)
		evs, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		again, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "root", Reason: "again"})
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, first.Cancellation.ID, again.Cancellation.ID)
		require.Equal(t, ledger.CancelStopped, again.Cancellation.State)
		require.Equal(t, "alice", again.Cancellation.RequestedBy, "the first request stands")
		require.Empty(t, cancelEventTypes(t, b, run.ID, len(evs)), "a repeat writes nothing")
	})

	t.Run("ErrConflict the run ended first: nothing written", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunCompleted,
			StopReason: ledger.StopCompleted})
		require.NoError(t, err)
		evs, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		_, err = b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice"})
		require.ErrorIs(t, err, ledger.ErrConflict)
		_, err = b.Store.FindCancellation(ctx, run.ID)
		require.ErrorIs(t, err, ledger.ErrNotFound)
		require.Empty(t, cancelEventTypes(t, b, run.ID, len(evs)))
	})

	t.Run("ErrNotFound unknown run", func(t *testing.T) {
		b := openStore(t, h)
		_, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: "run_nope", Principal: "alice"})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})

	t.Run("ErrInvalid no principal", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		_, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID})
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})

	t.Run("OK twenty at once make one cancellation", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		const n = 20
		var wg sync.WaitGroup
		res := make([]ledger.RequestCancelResult, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				res[i], errs[i] = b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice"})
			})
		}
		wg.Wait()
		created := 0
		for i := range n {
			require.NoError(t, errs[i])
			require.Equal(t, res[0].Cancellation.ID, res[i].Cancellation.ID)
			require.Equal(t, ledger.CancelAccepted, res[i].Cancellation.State)
			if res[i].Created {
				created++
			}
		}
		require.Equal(t, 1, created)
		chainOK(t, b, run.ID)
	})

	t.Run("OK racing the run's end: one of the two wins, whole", func(t *testing.T) {
		b := openStore(t, h)
		won := map[string]int{}
		for i := range 30 {
			run := b.RunningRun(t, fmt.Sprintf("race-%d", i), ledger.BudgetLimits{})
			var wg sync.WaitGroup
			var cancelErr, endErr error
			wg.Go(func() {
				_, cancelErr = b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice"})
			})
			wg.Go(func() {
				_, endErr = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning,
					To: ledger.RunCompleted, StopReason: ledger.StopCompleted})
			})
			wg.Wait()
			got, err := b.Store.FindRunByID(ctx, run.ID)
			require.NoError(t, err)
			c, cerr := b.Store.FindCancellation(ctx, run.ID)
			switch {
			case cancelErr == nil:
				require.ErrorIs(t, endErr, ledger.ErrConflict, "the run was stopping by then")
				require.NoError(t, cerr)
				require.Equal(t, ledger.CancelAccepted, c.State)
				require.Equal(t, ledger.RunStopping, got.State)
				won["cancel"]++
			default:
				require.ErrorIs(t, cancelErr, ledger.ErrConflict)
				require.NoError(t, endErr)
				require.ErrorIs(t, cerr, ledger.ErrNotFound, "nothing stored")
				require.Equal(t, ledger.RunCompleted, got.State)
				won["end"]++
			}
			chainOK(t, b, run.ID)
		}
		t.Logf("winners: %v", won)
	})

	t.Run("OK a repeat settles what an older build left", func(t *testing.T) {
		b := openStore(t, h)
		ended := b.RunningRun(t, "ended", ledger.BudgetLimits{})
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: ended.ID, From: ledger.RunRunning, To: ledger.RunCompleted,
			StopReason: ledger.StopCompleted})
		require.NoError(t, err)
		stuck := b.LegacyCancellation(t, ended.ID, ledger.CancelAccepted)
		res, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: ended.ID, Principal: "alice"})
		require.NoError(t, err)
		require.False(t, res.Created)
		require.Equal(t, stuck, res.Cancellation.ID)
		require.Equal(t, ledger.CancelTooLate, res.Cancellation.State)
		require.NotNil(t, res.Cancellation.TooLateAt)

		live := b.RunningRun(t, "live", ledger.BudgetLimits{})
		b.LegacyCancellation(t, live.ID, ledger.CancelRequested)
		res, err = b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: live.ID, Principal: "alice"})
		require.NoError(t, err)
		require.Equal(t, ledger.CancelAccepted, res.Cancellation.State)
		got, err := b.Store.FindRunByID(ctx, live.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunStopping, got.State)
		chainOK(t, b, ended.ID)
		chainOK(t, b, live.ID)
	})
}

func testSettleCancellations(t *testing.T, h Harness) {
	ctx := context.Background()
	b := openStore(t, h)
	complete := func(run *ledger.Run) {
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunCompleted,
			StopReason: ledger.StopCompleted})
		require.NoError(t, err)
	}
	// What the old three-write cancel left when the run completed between
	// its writes: accepted (or requested) on a completed run.
	completedAccepted := b.RunningRun(t, "completed-accepted", ledger.BudgetLimits{})
	complete(completedAccepted)
	b.LegacyCancellation(t, completedAccepted.ID, ledger.CancelAccepted)
	completedRequested := b.RunningRun(t, "completed-requested", ledger.BudgetLimits{})
	complete(completedRequested)
	b.LegacyCancellation(t, completedRequested.ID, ledger.CancelRequested)
	// A crash between its writes: requested, or accepted with the run not
	// yet stopping.
	liveRequested := b.RunningRun(t, "live-requested", ledger.BudgetLimits{})
	b.LegacyCancellation(t, liveRequested.ID, ledger.CancelRequested)
	liveAccepted := b.RunningRun(t, "live-accepted", ledger.BudgetLimits{})
	b.LegacyCancellation(t, liveAccepted.ID, ledger.CancelAccepted)
	// In line already: today's cancel, and a confirmed one.
	today := b.RunningRun(t, "today", ledger.BudgetLimits{})
	_, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: today.ID, Principal: "alice"})
	require.NoError(t, err)
	ok := b.RunningRun(t, "no-cancel", ledger.BudgetLimits{})

	settled, err := b.Store.SettleCancellations(ctx)
	require.NoError(t, err)
	got := map[ledger.RunID]ledger.CancellationState{}
	for _, c := range settled {
		got[c.RunID] = c.State
	}
	require.Equal(t, map[ledger.RunID]ledger.CancellationState{
		completedAccepted.ID:  ledger.CancelTooLate,
		completedRequested.ID: ledger.CancelTooLate,
		liveRequested.ID:      ledger.CancelAccepted,
		liveAccepted.ID:       ledger.CancelAccepted,
	}, got)

	t.Run("OK too late, with its event, the run untouched", func(t *testing.T) {
		for _, id := range []ledger.RunID{completedAccepted.ID, completedRequested.ID} {
			c, err := b.Store.FindCancellation(ctx, id)
			require.NoError(t, err)
			require.Equal(t, ledger.CancelTooLate, c.State)
			require.NotNil(t, c.TooLateAt)
			r, err := b.Store.FindRunByID(ctx, id)
			require.NoError(t, err)
			require.Equal(t, ledger.RunCompleted, r.State)
			evs, err := b.Store.FindEvents(ctx, id)
			require.NoError(t, err)
			last := evs[len(evs)-1]
			require.Equal(t, "cancellation.too_late", last.Type)
			require.Equal(t, "recovery", last.Actor)
			require.Contains(t, string(last.Data), "the run ended before the cancel took effect")
			chainOK(t, b, id)
		}
	})
	t.Run("OK live runs stopping", func(t *testing.T) {
		for _, id := range []ledger.RunID{liveRequested.ID, liveAccepted.ID, today.ID} {
			r, err := b.Store.FindRunByID(ctx, id)
			require.NoError(t, err)
			require.Equal(t, ledger.RunStopping, r.State)
			chainOK(t, b, id)
		}
		r, err := b.Store.FindRunByID(ctx, ok.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunRunning, r.State)
	})
	t.Run("OK again settles nothing", func(t *testing.T) {
		again, err := b.Store.SettleCancellations(ctx)
		require.NoError(t, err)
		require.Empty(t, again)
	})
}
