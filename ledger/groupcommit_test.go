package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
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
