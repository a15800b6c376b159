package ledger_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
)

func TestCountByState(t *testing.T) {
	ctx := context.Background()

	t.Run("Empty", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		c, err := b.Store.CountByState(ctx)
		require.NoError(t, err)
		require.Empty(t, c.Runs)
		require.Empty(t, c.Actions)
		require.Empty(t, c.Approvals)
		require.Empty(t, c.Attempts)
	})

	t.Run("OK", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		b.SubmitRun(t, "queued", ledger.BudgetLimits{})
		waiting := b.RunningRun(t, "waiting", ledger.BudgetLimits{})
		b.Action(t, waiting.ID, "step-1", ledger.ActionAwaitingApproval)
		running := b.RunningRun(t, "running", ledger.BudgetLimits{})
		a := b.Action(t, running.ID, "step-1", ledger.ActionApproved).Action
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.NoError(t, err)
		_, err = b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded,
			ActionState: ledger.ActionSucceeded,
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened}})
		require.NoError(t, err)
		second := b.Action(t, running.ID, "step-2", ledger.ActionApproved).Action
		_, err = b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: second.ID})
		require.NoError(t, err)

		c, err := b.Store.CountByState(ctx)
		require.NoError(t, err)
		require.Equal(t, map[ledger.RunState]int64{ledger.RunQueued: 1, ledger.RunRunning: 2}, c.Runs)
		require.Equal(t, map[ledger.ActionState]int64{ledger.ActionAwaitingApproval: 1, ledger.ActionSucceeded: 1,
			ledger.ActionRunning: 1}, c.Actions)
		require.Equal(t, map[ledger.ApprovalState]int64{ledger.ApprovalPending: 1}, c.Approvals)
		require.Equal(t, map[ledger.AttemptCountKey]int64{
			{Status: ledger.AttemptSucceeded, Effect: ledger.EffectHappened}: 1,
			{Status: ledger.AttemptStarted, Effect: ledger.EffectUnknown}:    1,
		}, c.Attempts)

		// The counts agree with what the listing methods return.
		for st, n := range c.Runs {
			runs, err := b.Store.FindRuns(ctx, ledger.RunFilter{State: &st})
			require.NoError(t, err)
			require.Len(t, runs, int(n), st)
		}
	})

	t.Run("ErrClosed", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		require.NoError(t, b.Store.Close())
		_, err := b.Store.CountByState(ctx)
		require.Error(t, err)
		require.Equal(t, ledger.CodeInternal, ledger.Code(err))
	})
}

// TestOnCommit: the hook sees every group commit with its size and a
// duration on the store's clock, and the writes of a batch add up to the
// writes made.
func TestOnCommit(t *testing.T) {
	ctx := context.Background()
	clock := ledgertest.NewClock()
	var (
		mu    sync.Mutex
		stats []ledger.CommitStats
	)
	s, err := sqlite.OpenStore(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "ledger.db"), Now: func() time.Time {
		// Each reading of the clock moves it on, so a commit's duration
		// is the number of readings between its start and its end.
		clock.Advance(time.Millisecond)
		return clock.Now()
	}, OnCommit: func(c ledger.CommitStats) {
		mu.Lock()
		stats = append(stats, c)
		mu.Unlock()
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	res, err := s.SubmitRun(ctx, submitParams("k", "t"))
	require.NoError(t, err)
	mu.Lock()
	require.Len(t, stats, 1)
	require.Equal(t, 1, stats[0].Writes)
	require.NoError(t, stats[0].Err)
	require.Positive(t, stats[0].Duration)
	stats = nil
	mu.Unlock()

	const n = 50
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = s.AddUsage(ctx, ledger.AddUsageParams{RunID: res.Run.ID, Steps: 1})
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, c := range stats {
		require.NoError(t, c.Err)
		require.GreaterOrEqual(t, c.Writes, 1)
		require.LessOrEqual(t, c.Writes, 64, "a batch holds at most maxBatch writes")
		total += c.Writes
	}
	require.Equal(t, n, total, "every write is in exactly one reported commit")
}
