package sqlite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/stretchr/testify/require"
)

// TestGroupCommitIsolatesFailures runs many writes at once, half of which
// fail inside their transaction; with group commit they share commits, and
// a failed write must roll back alone: every good write lands, no bad one
// leaves a trace, and every chain stays whole.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	b := ledgertest.OpenStore(t)
	ctx := context.Background()
	const n = 40
	runs := make([]*ledger.Run, n)
	for i := range n {
		runs[i] = b.SubmitRun(t, fmt.Sprintf("k%d", i), ledger.BudgetLimits{})
	}
	var wg sync.WaitGroup
	errs := make([]error, 2*n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[2*i] = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: runs[i].ID, From: ledger.RunQueued, To: ledger.RunRunning})
		})
		wg.Go(func() {
			<-start
			// Fails inside the transaction, after its guarded UPDATE found
			// the wrong state (or, if it ran first, the right one: then the
			// other write fails instead).
			_, errs[2*i+1] = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: runs[i].ID, From: ledger.RunQueued, To: ledger.RunRunning})
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		ok := 0
		for _, err := range errs[2*i : 2*i+2] {
			if err == nil {
				ok++
			} else {
				require.ErrorIs(t, err, ledger.ErrConflict)
			}
		}
		require.Equal(t, 1, ok, "run %d: exactly one of two racing transitions wins", i)
		got, err := b.Store.FindRunByID(ctx, runs[i].ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunRunning, got.State)
		require.Equal(t, int64(2), got.Version)
		require.Equal(t, int64(2), got.EventSeq, "the losing write left no event")
		rep, err := b.Store.VerifyChain(ctx, runs[i].ID)
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
	}
}

// TestClosedStoreRefusesWrites: a write after Close is an error, not a hang.
func TestClosedStoreRefusesWrites(t *testing.T) {
	b := ledgertest.OpenStore(t)
	require.NoError(t, b.Store.Close())
	_, err := b.Store.SubmitRun(context.Background(), submitParams("k", "t"))
	require.Error(t, err)
}

// TestGroupCommitMoreWritersThanABatch queues several batches' worth of
// writes on one run at once: every one lands exactly once (a writer whose
// write was not in the leader's batch leads the next), and the run's chain
// holds all their events in one unbroken sequence.
func TestGroupCommitMoreWritersThanABatch(t *testing.T) {
	b := ledgertest.OpenStore(t)
	ctx := context.Background()
	run := b.RunningRun(t, "k", ledger.BudgetLimits{})
	const n = 300 // more than four batches of 64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, Tokens: int64(i)})
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "write %d", i)
	}
	got, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, int64(n), got.Budget.Used.Steps)
	require.Equal(t, int64(n*(n-1)/2), got.Budget.Used.Tokens, "each write counted once")
	require.Equal(t, run.EventSeq+n, got.EventSeq)
	rep, err := b.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
}

// TestCloseWhileWriting closes the store while writes are queued and
// running: every writer gets an answer (none hangs), and every write that
// was answered with success is in the file when it is opened again.
func TestCloseWhileWriting(t *testing.T) {
	b := ledgertest.OpenStore(t)
	ctx := context.Background()
	run := b.RunningRun(t, "k", ledger.BudgetLimits{})
	const n = 200
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		ok int64
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			if _, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1}); err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		})
	}
	close(start)
	require.NoError(t, b.Store.Close())
	wg.Wait()
	again := ledgertest.OpenStoreAt(t, b.Path, b.Clock)
	got, err := again.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ok, got.Budget.Used.Steps, "exactly the writes answered with success are durable")
	rep, err := again.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
}

// TestCancelledWriteWritesNothing: a write whose context has ended before
// it runs is refused and leaves no trace.
func TestCancelledWriteWritesNothing(t *testing.T) {
	b := ledgertest.OpenStore(t)
	run := b.RunningRun(t, "k", ledger.BudgetLimits{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1})
	require.ErrorIs(t, err, context.Canceled)
	got, err := b.Store.FindRunByID(context.Background(), run.ID)
	require.NoError(t, err)
	require.Equal(t, int64(0), got.Budget.Used.Steps)
	require.Equal(t, run.EventSeq, got.EventSeq)
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

func submitParams(key, title string) ledger.SubmitRunParams {
	return ledger.SubmitRunParams{
		Tenant: "acme", IdempotencyKey: key, Principal: "alice", Agent: "practice-cards",
		Input: json.RawMessage(fmt.Sprintf(`{"title": %q, "markdown": "# a"}`, title)),
	}
}
