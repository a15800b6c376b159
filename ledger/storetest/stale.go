package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// testStaleApproval: a granted approval carries execute_by; an attempt
// begun at or after it is refused as stale, and ReaskApproval asks again
// in one write: the old approval records why, the action is back in
// awaiting_approval with a new pending approval bound to the same digest,
// which a person grants as any other. The chain binds every row.
func testStaleApproval(t *testing.T, h Harness) {
	ctx := context.Background()
	const within = 15 * time.Minute
	setup := func(t *testing.T) (*bundle, *ledger.Run, *ledger.Action, *ledger.Approval) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval).Action
		res, err := b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a.ID, ActionDigest: a.ActionDigest,
			Decision: ledger.DecisionGrant, Principal: "bob", Reason: "fine", ExecuteWithin: within})
		require.NoError(t, err)
		return b, run, res.Action, res.Approval
	}
	grant := func(b *bundle, a *ledger.Action, d ledger.Digest) (ledger.DecideApprovalResult, error) {
		return b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a.ID, ActionDigest: d,
			Decision: ledger.DecisionGrant, Principal: "carol", ExecuteWithin: within})
	}

	t.Run("OK begun before execute_by", func(t *testing.T) {
		b, _, a, apr := setup(t)
		require.NotNil(t, apr.ExecuteBy)
		require.Equal(t, apr.DecidedAt.Add(within), *apr.ExecuteBy)
		b.Clock.Advance(within - time.Microsecond)
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID, Actor: "engine"})
		require.NoError(t, err)
		require.Equal(t, int64(1), att.No)
	})

	t.Run("OK no execute_by, no limit", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval).Action
		res, err := b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a.ID, ActionDigest: a.ActionDigest,
			Decision: ledger.DecisionGrant, Principal: "bob"})
		require.NoError(t, err)
		require.Nil(t, res.Approval.ExecuteBy)
		b.Clock.Advance(240 * time.Hour)
		_, err = b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID, Actor: "engine"})
		require.NoError(t, err)
	})

	t.Run("ErrApprovalStale at execute_by, then asked again", func(t *testing.T) {
		b, run, a, apr := setup(t)
		b.Clock.Advance(within)
		before, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		_, err = b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID, Actor: "engine"})
		require.ErrorIs(t, err, ledger.ErrApprovalStale)
		require.Contains(t, err.Error(), "execute_by")
		_, err = b.Store.BeginAttempt(ctx, ledger.BeginAttemptParams{ActionID: a.ID, Key: "b1", TokenSHA256: strings.Repeat("ab", 32),
			Lease: time.Minute, MaxDuration: time.Hour, Actor: "agent"})
		require.ErrorIs(t, err, ledger.ErrApprovalStale, "the protocol's begin is refused the same")
		after, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, before.EventSeq, after.EventSeq, "a refused attempt writes nothing")

		// Approving it again before it is asked again: nothing is pending,
		// and the refusal says why.
		_, err = grant(b, a, a.ActionDigest)
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), "passed its execute_by")

		res, err := b.Store.ReaskApproval(ctx, ledger.ReaskApprovalParams{ActionID: a.ID,
			Reason: "approval passed its execute_by", ApprovalTTL: time.Hour, Actor: "engine"})
		require.NoError(t, err)
		require.Equal(t, ledger.ActionAwaitingApproval, res.Action.State)
		require.Equal(t, ledger.ApprovalPending, res.Approval.State)
		require.NotEqual(t, apr.ID, res.Approval.ID)
		require.Equal(t, a.ActionDigest, res.Approval.ActionDigest, "the same digest")
		require.Equal(t, b.Clock.Now().Add(time.Hour), *res.Approval.ExpiresAt)
		require.Equal(t, apr.ID, res.Stale.ID)
		require.Equal(t, ledger.ApprovalGranted, res.Stale.State, "the old approval stays granted")
		require.Equal(t, "approval passed its execute_by", res.Stale.StaleReason)
		require.Equal(t, b.Clock.Now(), *res.Stale.StaleAt)

		// Asked again only once: the action is no longer approved.
		_, err = b.Store.ReaskApproval(ctx, ledger.ReaskApprovalParams{ActionID: a.ID, Reason: "again", Actor: "engine"})
		require.ErrorIs(t, err, ledger.ErrConflict)

		// The digest binding holds for the new approval.
		other, err := ledger.DigestJSON([]byte(`{"other":true}`))
		require.NoError(t, err)
		_, err = grant(b, a, other)
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), "digest mismatch")

		granted, err := grant(b, a, a.ActionDigest)
		require.NoError(t, err)
		require.Equal(t, res.Approval.ID, granted.Approval.ID)
		require.Equal(t, b.Clock.Now().Add(within), *granted.Approval.ExecuteBy)
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID, Actor: "engine"})
		require.NoError(t, err, "the new approval covers the begin")
		require.Equal(t, int64(1), att.No)

		all, err := b.Store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, all, 2)
		require.NotNil(t, all[0].StaleAt)
		require.Nil(t, all[1].StaleAt)

		events, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		var stale, back bool
		for _, e := range events {
			stale = stale || e.Type == "approval.stale" && e.EntityID == string(apr.ID)
			back = back || e.EntityID == string(a.ID) && e.FromState == string(ledger.ActionApproved) &&
				e.ToState == string(ledger.ActionAwaitingApproval)
		}
		require.True(t, stale, "the stale approval has its event")
		require.True(t, back, "the action's move has its event")
		rep, err := b.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, rep.OK, "%+v", rep)
	})

	t.Run("OK rule-approved action asked for a person", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
		res, err := b.Store.ReaskApproval(ctx, ledger.ReaskApprovalParams{ActionID: a.ID,
			Reason: "rule 0 now requires approval", Actor: "engine"})
		require.NoError(t, err)
		require.Nil(t, res.Stale, "no person had approved it")
		require.Equal(t, ledger.ActionAwaitingApproval, res.Action.State)
		require.Nil(t, res.Approval.ExpiresAt)
	})

	t.Run("ErrInvalid", func(t *testing.T) {
		b, _, a, _ := setup(t)
		_, err := b.Store.ReaskApproval(ctx, ledger.ReaskApprovalParams{ActionID: a.ID, Actor: "engine"})
		require.ErrorIs(t, err, ledger.ErrInvalid, "a reason is required")
		_, err = b.Store.ReaskApproval(ctx, ledger.ReaskApprovalParams{ActionID: a.ID, Reason: "x", ApprovalTTL: -time.Second})
		require.ErrorIs(t, err, ledger.ErrInvalid)
		_, err = b.Store.ReaskApproval(ctx, ledger.ReaskApprovalParams{ActionID: "act_nope", Reason: "x"})
		require.ErrorIs(t, err, ledger.ErrNotFound)
		_, err = b.Store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: ledger.ActionApproved,
			To: ledger.ActionAwaitingApproval, Actor: "engine"})
		require.ErrorIs(t, err, ledger.ErrInvalid, "the edge is ReaskApproval's")
		run := b.RunningRun(t, "k2", ledger.BudgetLimits{})
		w := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval).Action
		_, err = b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: w.ID, ActionDigest: w.ActionDigest,
			Decision: ledger.DecisionGrant, Principal: "bob", ExecuteWithin: -time.Second})
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})
}
