package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/recovery"
)

// TestRecoverSettlesStuckCancellations writes the row the old three-write
// cancel left when a run completed between its writes, then runs
// `ledger recover` on the file, as a restart's scan does.
func TestRecoverSettlesStuckCancellations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	b := ledgertest.OpenStoreAt(t, path, ledgertest.NewClock())
	run := b.RunningRun(t, "k", ledger.BudgetLimits{})
	_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunCompleted,
		StopReason: ledger.StopCompleted, Actor: "engine"})
	require.NoError(t, err)
	stuck := b.LegacyCancellation(t, run.ID, ledger.CancelAccepted)
	require.NoError(t, b.Store.Close())

	out, _, err := runCLI(t, nil, "recover", "--db", path)
	require.NoError(t, err)
	require.Contains(t, out, "cancellation "+string(stuck)+" of "+string(run.ID)+": too_late")

	out, _, err = runCLI(t, nil, "recover", "--db", path, "--json")
	require.NoError(t, err)
	var rep recovery.ScanReport
	require.NoError(t, json.NewDecoder(strings.NewReader(out)).Decode(&rep))
	require.Empty(t, rep.Cancellations, "settled once, by the first scan")

	again := ledgertest.OpenStoreAt(t, path, ledgertest.NewClock())
	c, err := again.Store.FindCancellation(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.CancelTooLate, c.State)
	chain, err := again.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, chain.OK, "%+v", chain)
}
