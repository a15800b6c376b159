package storetest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

func testCountByState(t *testing.T, h Harness) {
	ctx := context.Background()

	t.Run("Empty", func(t *testing.T) {
		b := openStore(t, h)
		c, err := b.Store.CountByState(ctx)
		require.NoError(t, err)
		require.Empty(t, c.Runs)
		require.Empty(t, c.Actions)
		require.Empty(t, c.Approvals)
		require.Empty(t, c.Attempts)
		require.Empty(t, c.Signatures)
	})

	// Signatures counts the runs whose head's newest signature is each
	// key's: what a process given no key (or another) learns at start.
	t.Run("Signatures", func(t *testing.T) {
		pubA, keyA, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		pubB, keyB, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		b := openWith(t, h, Options{SigningKey: keyA}, ledgertest.NewClock())
		b.SubmitRun(t, "a1", ledger.BudgetLimits{})
		moved := b.SubmitRun(t, "a2", ledger.BudgetLimits{})
		withB := b.reopen(t, Options{SigningKey: keyB})
		ledgertest.SubmitRun(t, withB, "b1", ledger.BudgetLimits{})
		_, err = withB.TransitionRun(ctx, ledger.RunTransition{ID: moved.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "engine"})
		require.NoError(t, err, "its head is signed by B now")
		unsigned := b.reopen(t, Options{})
		ledgertest.SubmitRun(t, unsigned, "none", ledger.BudgetLimits{})

		c, err := unsigned.CountByState(ctx)
		require.NoError(t, err)
		require.Equal(t, map[string]int64{ledger.SigningKeyID(pubA): 1, ledger.SigningKeyID(pubB): 2}, c.Signatures)
		require.Equal(t, int64(4), c.Runs[ledger.RunQueued]+c.Runs[ledger.RunRunning])
	})

	t.Run("OK", func(t *testing.T) {
		b := openStore(t, h)
		b.SubmitRun(t, "queued", ledger.BudgetLimits{})
		waiting := b.RunningRun(t, "waiting", ledger.BudgetLimits{})
		b.Action(t, waiting.ID, "step-1", ledger.ActionAwaitingApproval)
		running := b.RunningRun(t, "running", ledger.BudgetLimits{})
		a := b.Action(t, running.ID, "step-1", ledger.ActionApproved).Action
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.NoError(t, err)
		_, err = b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded,
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
		b := openStore(t, h)
		require.NoError(t, b.Store.Close())
		_, err := b.Store.CountByState(ctx)
		require.Error(t, err)
		require.Equal(t, ledger.CodeInternal, ledger.Code(err))
	})
}
