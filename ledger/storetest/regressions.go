package storetest

import (
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// Cases found by probing the Store with odd input; each failed once.
func testRegressions(t *testing.T, h Harness) {
	ctx := context.Background()

	t.Run("updated_at is the transaction's time, not unix seconds", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k1", ledger.BudgetLimits{})
		require.Equal(t, b.Clock.Now(), run.UpdatedAt)
		require.Equal(t, run.CreatedAt, run.UpdatedAt)
	})

	t.Run("negative budget limits are invalid, not internal", func(t *testing.T) {
		b := openStore(t, h)
		p := submitParams("k1", "t")
		p.Budgets.MaxAttemptsPerRun = -1
		_, err := b.Store.SubmitRun(ctx, p)
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})

	t.Run("control characters in names are invalid, not internal", func(t *testing.T) {
		b := openStore(t, h)
		p := submitParams("k1", "t")
		p.Tenant = "\x00acme"
		_, err := b.Store.SubmitRun(ctx, p)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		run := b.RunningRun(t, "k2", ledger.BudgetLimits{})
		_, err = b.Store.CreateAction(ctx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: "\x00step-1",
			Tool: "cards.write", ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{}`)})
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})

	t.Run("usage that would overflow is refused and changes nothing", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k1", ledger.BudgetLimits{})
		_, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Tokens: math.MaxInt64})
		require.NoError(t, err)
		_, err = b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Tokens: 1})
		require.ErrorIs(t, err, ledger.ErrInvalid)
		got, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, int64(math.MaxInt64), got.Budget.Used.Tokens)
	})

	t.Run("no confirmed cancellation while an attempt is in flight", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k1", ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.NoError(t, err)
		_, err = b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "carol"})
		require.NoError(t, err)
		_, err = b.Store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID, From: ledger.CancelAccepted, To: ledger.CancelStopping})
		require.NoError(t, err)
		confirm := ledger.CancellationTransition{RunID: run.ID, From: ledger.CancelStopping, To: ledger.CancelStopped}
		_, err = b.Store.TransitionCancellation(ctx, confirm)
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), string(att.ID))
		// Once a query establishes the effect, the cancellation can be confirmed.
		_, _, err = b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: att.ID, Source: ledger.ObservedQuery, Effect: ledger.EffectNotHappened})
		require.NoError(t, err)
		c, err := b.Store.TransitionCancellation(ctx, confirm)
		require.NoError(t, err)
		require.Equal(t, ledger.CancelStopped, c.State)
	})

	t.Run("an invalidated approval also resumes the waiting run", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k1", ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval).Action
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunAwaitingApproval})
		require.NoError(t, err)
		_, err = b.Store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: ledger.ActionAwaitingApproval, To: ledger.ActionCancelled})
		require.NoError(t, err)
		got, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunRunning, got.State)
	})
}

// testSettleReviewIsOneTransaction: a verdict that cannot be applied leaves
// no trace, not even its observation.
func testSettleReviewIsOneTransaction(t *testing.T, h Harness) {
	ctx := context.Background()
	b := openStore(t, h)
	run := b.RunningRun(t, "k1", ledger.BudgetLimits{})
	a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
	att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
	require.NoError(t, err)
	_, err = b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptUncertain})
	require.NoError(t, err)
	_, err = b.Store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: ledger.ActionUncertain, To: ledger.ActionNeedsReview})
	require.NoError(t, err)
	_, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunNeedsReview})
	require.NoError(t, err)

	_, err = b.Store.SettleReview(ctx, ledger.SettleReviewParams{ActionID: a.ID, To: ledger.ActionApproved, Effect: ledger.EffectHappened, Actor: "bob"})
	require.ErrorIs(t, err, ledger.ErrInvalid, "needs_review → approved is not an edge")
	obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{ActionID: &a.ID})
	require.NoError(t, err)
	require.Empty(t, obs, "the refused verdict left no observation")

	got, err := b.Store.SettleReview(ctx, ledger.SettleReviewParams{ActionID: a.ID, To: ledger.ActionSucceeded, Effect: ledger.EffectHappened, Actor: "bob"})
	require.NoError(t, err)
	require.Equal(t, ledger.ActionSucceeded, got.State)
	r, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.RunRunning, r.State)
	_, err = b.Store.SettleReview(ctx, ledger.SettleReviewParams{ActionID: a.ID, To: ledger.ActionSucceeded, Effect: ledger.EffectHappened, Actor: "bob"})
	require.ErrorIs(t, err, ledger.ErrConflict)
}
