package storetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// testProbeWrite: the probe write commits a change every time (its
// counter, read here beside the Store), and nothing the ledger reads
// changes: a run's row, its chain, the counts.
func testProbeWrite(t *testing.T, h Harness) {
	ctx := context.Background()
	b := openStore(t, h)
	run := b.RunningRun(t, "probed", ledger.BudgetLimits{})
	b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval)
	run, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	before, err := b.Store.CountByState(ctx)
	require.NoError(t, err)

	probes := func() int64 {
		rows, err := b.DB.Query(ctx, `SELECT probes FROM store_probes WHERE id = 1`)
		require.NoError(t, err)
		defer rows.Close()
		var n int64
		if rows.Next() {
			require.NoError(t, rows.Scan(&n))
		}
		require.NoError(t, rows.Err())
		return n
	}
	require.Zero(t, probes(), "nothing probed yet")
	for i := int64(1); i <= 3; i++ {
		require.NoError(t, b.Store.ProbeWrite(ctx))
		require.Equal(t, i, probes(), "each probe changes the row, so its write reaches the disk")
	}

	got, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, run.Version, got.Version)
	require.Equal(t, run.EventSeq, got.EventSeq, "no event")
	after, err := b.Store.CountByState(ctx)
	require.NoError(t, err)
	require.Equal(t, before, after)
	report, err := b.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, report.OK)
}
