package storetest

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

func submitAs(principal, key string) ledger.SubmitRunParams {
	return ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: key, Principal: principal, Agent: "practice-cards",
		Input: json.RawMessage(`{"title":"t","markdown":"# a"}`)}
}

func testSubmitRequestIdentity(t *testing.T, h Harness) {
	ctx := context.Background()
	b := openStore(t, h)
	alice, err := b.Store.SubmitRun(ctx, submitAs("alice", "k"))
	require.NoError(t, err)
	amy, err := b.Store.SubmitRun(ctx, submitAs("amy", "k"))
	require.NoError(t, err)
	require.False(t, amy.Replayed, "another principal's key is another identity")
	require.NotEqual(t, alice.Run.ID, amy.Run.ID)
	again, err := b.Store.SubmitRun(ctx, submitAs("amy", "k"))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, amy.Run.ID, again.Run.ID)
	other := submitAs("alice", "k")
	other.Input = json.RawMessage(`{"title":"other"}`)
	_, err = b.Store.SubmitRun(ctx, other)
	require.ErrorIs(t, err, ledger.ErrConflict)
}

func testSubmitPendingApprovalsCap(t *testing.T, h Harness) {
	ctx := context.Background()

	t.Run("OK concurrent submits stop at the cap", func(t *testing.T) {
		b := openStore(t, h)
		const capN, n = 5, 20
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				p := submitAs("alice", "k"+strconv.Itoa(i))
				p.MaxPendingApprovals = capN
				_, errs[i] = b.Store.SubmitRun(ctx, p)
			})
		}
		wg.Wait()
		created := 0
		for _, err := range errs {
			if err == nil {
				created++
				continue
			}
			require.ErrorIs(t, err, ledger.ErrBudgetExceeded)
		}
		require.Equal(t, capN, created, "exactly the cap, whatever the interleaving")
	})
	t.Run("OK pending approvals, queued and running runs count; settled ones do not", func(t *testing.T) {
		b := openStore(t, h)
		p := func(key string) ledger.SubmitRunParams {
			p := submitAs("alice", key)
			p.MaxPendingApprovals = 2
			return p
		}
		waiting := b.RunningRun(t, "waiting", ledger.BudgetLimits{})
		a := b.Action(t, waiting.ID, "step-1", ledger.ActionAwaitingApproval).Action
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: waiting.ID, From: ledger.RunRunning, To: ledger.RunAwaitingApproval})
		require.NoError(t, err)
		_, err = b.Store.SubmitRun(ctx, p("second")) // 1 pending approval: room for one
		require.NoError(t, err)
		_, err = b.Store.SubmitRun(ctx, p("third"))
		require.ErrorIs(t, err, ledger.ErrBudgetExceeded, "1 pending + 1 queued")
		replay, err := b.Store.SubmitRun(ctx, p("second"))
		require.NoError(t, err, "a replay is not a new run")
		require.True(t, replay.Replayed)
		other := p("third")
		other.Tenant = "globex"
		_, err = b.Store.SubmitRun(ctx, other)
		require.NoError(t, err, "the cap is per tenant")

		_, err = b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a.ID, ActionDigest: a.ActionDigest,
			Decision: ledger.DecisionDeny, Principal: "bob"})
		require.NoError(t, err)
		_, err = b.Store.SubmitRun(ctx, p("third"))
		require.ErrorIs(t, err, ledger.ErrBudgetExceeded, "denied, but its run is running again")
		_, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: waiting.ID, From: ledger.RunRunning, To: ledger.RunStopped,
			StopReason: ledger.StopApprovalDenied})
		require.NoError(t, err)
		_, err = b.Store.SubmitRun(ctx, p("third"))
		require.NoError(t, err)
	})
	t.Run("ErrInvalid negative cap", func(t *testing.T) {
		b := openStore(t, h)
		p := submitAs("alice", "k")
		p.MaxPendingApprovals = -1
		_, err := b.Store.SubmitRun(ctx, p)
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})
}
