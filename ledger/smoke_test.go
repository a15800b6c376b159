package ledger_test

import (
	"context"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/stretchr/testify/require"
)

func TestSmoke(t *testing.T) {
	b := ledgertest.OpenStore(t)
	ctx := context.Background()
	run := b.RunningRun(t, "k1", ledger.BudgetLimits{})
	res := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval)
	require.NotNil(t, res.Approval)
	d, err := b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: res.Action.ID, ActionDigest: res.Action.ActionDigest, Decision: ledger.DecisionGrant, Principal: "bob"})
	require.NoError(t, err)
	require.Equal(t, ledger.ActionApproved, d.Action.State)
	att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: res.Action.ID})
	require.NoError(t, err)
	f, err := b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded,
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened}, ActionState: ledger.ActionSucceeded})
	require.NoError(t, err)
	require.Equal(t, ledger.EffectHappened, f.Attempt.Effect)
	rep, err := b.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	evs, _ := b.Store.FindEvents(ctx, run.ID)
	for _, e := range evs {
		t.Log(e.Seq, e.Type, e.EntityID, string(e.Data))
	}
}
