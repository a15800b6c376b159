package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

func (b *bundle) cancel(t *testing.T, run ledger.RunID) *ledger.Cancellation {
	t.Helper()
	res, err := b.engine.Cancel(context.Background(), engine.CancelParams{RunID: run, Principal: "alice", Reason: "changed my mind"})
	require.NoError(t, err)
	return res.Cancellation
}

// requireCancelled checks the four facts of a confirmed cancellation and
// the run's end.
func (b *bundle) requireCancelled(t *testing.T, run ledger.RunID) *ledger.Run {
	t.Helper()
	ctx := context.Background()
	c, err := b.Store.FindCancellation(ctx, run)
	require.NoError(t, err)
	require.Equal(t, ledger.CancelStopped, c.State)
	require.Equal(t, "alice", c.RequestedBy)
	require.NotNil(t, c.AcceptedAt, "accepted")
	require.NotNil(t, c.StoppingAt, "stopping")
	require.NotNil(t, c.StoppedAt, "stopped (confirmed)")
	r, err := b.Store.FindRunByID(ctx, run)
	require.NoError(t, err)
	require.Equal(t, ledger.RunStopped, r.State)
	require.Equal(t, ledger.StopUserCancelled, r.StopReason)
	b.chainOK(t, run)
	return r
}

func TestCancel(t *testing.T) {
	ctx := context.Background()

	t.Run("before the run starts", func(t *testing.T) {
		b := setup(t, simulator.Config{})
		run := b.submit(t, "practice-cards", "k1")
		c := b.cancel(t, run.ID)
		require.Equal(t, ledger.CancelAccepted, c.State, "accepted, and the run is stopping")
		got, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunStopping, got.State, "in the same write")
		b.advance(t, run.ID)
		b.requireCancelled(t, run.ID)
		actions, err := b.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Empty(t, actions, "the model was never asked")
		require.Equal(t, 0, b.effectCount(t))
	})

	t.Run("while awaiting approval", func(t *testing.T) {
		b := setup(t, simulator.Config{})
		run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
		require.Equal(t, ledger.RunAwaitingApproval, run.State)
		a := b.pendingAction(t, run.ID)
		b.cancel(t, run.ID)
		b.advance(t, run.ID)
		b.requireCancelled(t, run.ID)
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionCancelled, got.State)
		aprs, err := b.Store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.ApprovalInvalidated, aprs[0].State)
		require.ErrorIs(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant), ledger.ErrConflict, "too late to approve")
		require.Equal(t, 0, b.effectCount(t))
	})

	inFlight := func(t *testing.T, g contracts.Guarantees) (*bundle, *ledger.Run, *ledger.Action) {
		b := setup(t, simulator.Config{Tools: map[string]simulator.ToolConfig{"cards.write": {Guarantees: &g,
			Faults: []simulator.Fault{{Kind: simulator.FaultSlow, Delay: time.Minute}}}}})
		run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
		a := b.pendingAction(t, run.ID)
		require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
		done := make(chan error, 1)
		go func() { done <- b.engine.Advance(ctx, run.ID) }()
		require.Eventually(t, func() bool {
			atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
			return err == nil && len(atts) == 1
		}, 10*time.Second, 2*time.Millisecond, "the attempt starts")
		c := b.cancel(t, run.ID)
		require.Equal(t, ledger.CancelAccepted, c.State, "accepted while the call is in flight")
		require.NoError(t, <-done)
		b.advance(t, run.ID)
		return b, b.requireCancelled(t, run.ID), a
	}

	t.Run("during an in-flight attempt of a cancel-capable tool", func(t *testing.T) {
		b, _, a := inFlight(t, contracts.Guarantees{Cancel: true})
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, atts, 1)
		require.Equal(t, ledger.AttemptCancelled, atts[0].Status, "status: the call was cut short")
		require.Equal(t, ledger.EffectNotHappened, atts[0].Effect, "effect: the tool confirmed the cancel")
		obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{AttemptID: &atts[0].ID})
		require.NoError(t, err)
		require.Equal(t, ledger.ObservedCancel, obs[len(obs)-1].Source)
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionCancelled, got.State)
		require.Equal(t, 0, b.effectCount(t))
	})

	t.Run("during an in-flight attempt of a tool that can only be queried", func(t *testing.T) {
		b, _, a := inFlight(t, contracts.Guarantees{Query: true})
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.AttemptCancelled, atts[0].Status)
		require.Equal(t, ledger.EffectNotHappened, atts[0].Effect, "effect: established by query")
		require.Equal(t, 0, b.effectCount(t))
	})

	t.Run("during an in-flight attempt of a tool that guarantees nothing", func(t *testing.T) {
		b, _, a := inFlight(t, contracts.Guarantees{})
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.AttemptCancelled, atts[0].Status)
		require.Equal(t, ledger.EffectUnknown, atts[0].Effect, "cancel stopped the run, not the uncertainty")
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionNeedsReview, got.State, "handed to a person")
	})

	t.Run("after completion", func(t *testing.T) {
		b := setup(t, simulator.Config{})
		run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
		a := b.pendingAction(t, run.ID)
		require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
		run = b.advance(t, run.ID)
		require.Equal(t, ledger.RunCompleted, run.State)
		_, err := b.engine.Cancel(ctx, engine.CancelParams{RunID: run.ID, Principal: "alice"})
		require.ErrorIs(t, err, ledger.ErrConflict)
		_, err = b.Store.FindCancellation(ctx, run.ID)
		require.ErrorIs(t, err, ledger.ErrNotFound, "no cancellation is recorded")
		require.Equal(t, 1, b.effectCount(t), "the effect stands")
	})

	t.Run("a crash between confirming and stopping the run", func(t *testing.T) {
		b := setup(t, simulator.Config{})
		run := b.submit(t, "practice-cards", "k1")
		b.cancel(t, run.ID)
		for _, e := range [][2]ledger.CancellationState{{ledger.CancelAccepted, ledger.CancelStopping}, {ledger.CancelStopping, ledger.CancelStopped}} {
			_, err := b.Store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID, From: e[0], To: e[1], Actor: "engine"})
			require.NoError(t, err)
		}
		// The process died here: confirmed, the run still stopping.
		b.advance(t, run.ID)
		b.requireCancelled(t, run.ID)
	})

	t.Run("twice is the same cancellation", func(t *testing.T) {
		b := setup(t, simulator.Config{})
		run := b.submit(t, "practice-cards", "k1")
		first := b.cancel(t, run.ID)
		second := b.cancel(t, run.ID)
		require.Equal(t, first.ID, second.ID)
	})
}
