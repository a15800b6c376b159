package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

func testCreateAction(t *testing.T, h Harness) {
	ctx := context.Background()
	params := func(run ledger.RunID, key, args string) ledger.CreateActionParams {
		return ledger.CreateActionParams{RunID: run, IdempotencyKey: key, Tool: "cards.write", ToolVersion: "1",
			Effect: ledger.EffectWrite, Arguments: json.RawMessage(args), Gate: ledger.ActionAwaitingApproval}
	}

	t.Run("OK", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		res, err := b.Store.CreateAction(ctx, params(run.ID, "step-1", `{"cards":[]}`))
		require.NoError(t, err)
		a := res.Action
		require.True(t, ledger.ValidID(ledger.PrefixAction, string(a.ID)))
		require.Equal(t, ledger.ActionAwaitingApproval, a.State)
		require.Equal(t, ledger.DedupKeyFor(run.ID, a.ID), a.DedupKey)
		require.Equal(t, int64(1), a.Seq)
		require.Equal(t, "acme", a.Tenant)
		want, err := ledger.ActionDigest(ledger.ActionDigestInput{Tool: "cards.write", ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"cards":[]}`)})
		require.NoError(t, err)
		require.Equal(t, want, a.ActionDigest)
		require.NotNil(t, res.Approval)
		require.Equal(t, a.ActionDigest, res.Approval.ActionDigest)
		require.Equal(t, ledger.ApprovalPending, res.Approval.State)
		require.Nil(t, res.Approval.ExpiresAt, "no TTL, no expiry")
	})

	t.Run("replayed step returns the action", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		first, err := b.Store.CreateAction(ctx, params(run.ID, "step-1", `{"cards":[]}`))
		require.NoError(t, err)
		again, err := b.Store.CreateAction(ctx, params(run.ID, "step-1", `{ "cards" : [ ] }`))
		require.NoError(t, err)
		require.True(t, again.Duplicate)
		require.Equal(t, first.Action.ID, again.Action.ID)
		require.Equal(t, first.Approval.ID, again.Approval.ID)
		_, err = b.Store.CreateAction(ctx, params(run.ID, "step-1", `{"cards":[{"front":"x","back":"y"}]}`))
		require.ErrorIs(t, err, ledger.ErrConflict)
		actions, err := b.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Len(t, actions, 1)
	})

	t.Run("ErrConflict when the run is not running", func(t *testing.T) {
		b := openStore(t, h)
		run := b.SubmitRun(t, "k", ledger.BudgetLimits{})
		_, err := b.Store.CreateAction(ctx, params(run.ID, "step-1", `{}`))
		require.ErrorIs(t, err, ledger.ErrConflict)
	})

	t.Run("ErrNotFound for an unknown run", func(t *testing.T) {
		b := openStore(t, h)
		_, err := b.Store.CreateAction(ctx, params("run_nope", "step-1", `{}`))
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})

	t.Run("ErrInvalid", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		for name, mut := range map[string]func(p *ledger.CreateActionParams){
			"arguments not an object": func(p *ledger.CreateActionParams) { p.Arguments = json.RawMessage(`[1]`) },
			"duplicate argument key":  func(p *ledger.CreateActionParams) { p.Arguments = json.RawMessage(`{"a":1,"a":1}`) },
			"no arguments":            func(p *ledger.CreateActionParams) { p.Arguments = nil },
			"no tool":                 func(p *ledger.CreateActionParams) { p.Tool = "" },
			"bad effect":              func(p *ledger.CreateActionParams) { p.Effect = "delete" },
			"bad gate":                func(p *ledger.CreateActionParams) { p.Gate = ledger.ActionRunning },
			"no key":                  func(p *ledger.CreateActionParams) { p.IdempotencyKey = "" },
			"negative ttl":            func(p *ledger.CreateActionParams) { p.ApprovalTTL = -time.Second },
		} {
			t.Run(name, func(t *testing.T) {
				p := params(run.ID, "step-1", `{}`)
				mut(&p)
				_, err := b.Store.CreateAction(ctx, p)
				require.ErrorIs(t, err, ledger.ErrInvalid)
			})
		}
	})

	t.Run("superseding invalidates the pending approval", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		old, err := b.Store.CreateAction(ctx, params(run.ID, "step-1", `{"cards":[]}`))
		require.NoError(t, err)
		p := params(run.ID, "step-2", `{"cards":[{"front":"q","back":"a"}]}`)
		p.Supersedes = old.Action.ID
		next, err := b.Store.CreateAction(ctx, p)
		require.NoError(t, err)
		require.NotEqual(t, old.Action.ActionDigest, next.Action.ActionDigest)
		require.Equal(t, old.Action.ID, next.Action.Supersedes)
		gotOld, err := b.Store.FindActionByID(ctx, old.Action.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionSuperseded, gotOld.State)
		aprs, err := b.Store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &old.Action.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.ApprovalInvalidated, aprs[0].State)
		// The old digest approves nothing now.
		_, err = b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: old.Action.ID,
			ActionDigest: old.Action.ActionDigest, Decision: ledger.DecisionGrant, Principal: "bob"})
		require.ErrorIs(t, err, ledger.ErrConflict)
		// Nor does it approve the new action.
		_, err = b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: next.Action.ID,
			ActionDigest: old.Action.ActionDigest, Decision: ledger.DecisionGrant, Principal: "bob"})
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), "digest mismatch")
	})
}

func testCreateActionAndStart(t *testing.T, h Harness) {
	ctx := context.Background()
	params := func(run ledger.RunID) ledger.CreateActionParams {
		return ledger.CreateActionParams{RunID: run, IdempotencyKey: "step-1", Tool: "cards.write", ToolVersion: "1",
			Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"cards":[]}`), Gate: ledger.ActionApproved,
			StartAttempt: true, Usage: &ledger.AddUsageParams{Steps: 1, Tokens: 42}}
	}

	t.Run("one transaction records the step, the action and its attempt", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		res, err := b.Store.CreateAction(ctx, params(run.ID))
		require.NoError(t, err)
		require.NoError(t, res.StartErr)
		require.NotNil(t, res.Attempt)
		require.Equal(t, ledger.ActionRunning, res.Action.State)
		require.Equal(t, int64(1), res.Attempt.No)
		got, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.BudgetUsage{Attempts: 1, Steps: 1, Tokens: 42}, got.Budget.Used)

		// The replayed step counts nothing twice and starts nothing.
		again, err := b.Store.CreateAction(ctx, params(run.ID))
		require.NoError(t, err)
		require.True(t, again.Duplicate)
		require.Nil(t, again.Attempt)
		got, err = b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.BudgetUsage{Attempts: 1, Steps: 1, Tokens: 42}, got.Budget.Used)
		rep, err := b.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
	})

	t.Run("a refused attempt keeps the recorded action", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{MaxExecution: time.Second})
		_, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Execution: time.Second})
		require.NoError(t, err)
		res, err := b.Store.CreateAction(ctx, params(run.ID))
		require.NoError(t, err)
		require.ErrorIs(t, res.StartErr, ledger.ErrBudgetExceeded)
		require.Nil(t, res.Attempt)
		require.Equal(t, ledger.ActionApproved, res.Action.State)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Empty(t, atts)
		rep, err := b.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
	})

	t.Run("ErrInvalid without gate approved", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		p := params(run.ID)
		p.Gate = ledger.ActionAwaitingApproval
		_, err := b.Store.CreateAction(ctx, p)
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})
}

func testDecideApproval(t *testing.T, h Harness) {
	ctx := context.Background()
	setup := func(t *testing.T) (*bundle, *ledger.Run, *ledger.Action) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		return b, run, b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval).Action
	}
	decide := func(b *bundle, a *ledger.Action, d ledger.Digest, dec ledger.ApprovalDecision) (ledger.DecideApprovalResult, error) {
		return b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a.ID, ActionDigest: d, Decision: dec, Principal: "bob", Reason: "looks right"})
	}

	t.Run("grant", func(t *testing.T) {
		b, _, a := setup(t)
		res, err := decide(b, a, a.ActionDigest, ledger.DecisionGrant)
		require.NoError(t, err)
		require.Equal(t, ledger.ApprovalGranted, res.Approval.State)
		require.Equal(t, "bob", res.Approval.DecidedBy)
		require.Equal(t, "looks right", res.Approval.Reason)
		require.Equal(t, ledger.ActionApproved, res.Action.State)
		_, err = decide(b, a, a.ActionDigest, ledger.DecisionGrant)
		require.ErrorIs(t, err, ledger.ErrConflict, "a decided approval is not decided again")
	})

	t.Run("deny", func(t *testing.T) {
		b, _, a := setup(t)
		res, err := decide(b, a, a.ActionDigest, ledger.DecisionDeny)
		require.NoError(t, err)
		require.Equal(t, ledger.ApprovalDenied, res.Approval.State)
		require.Equal(t, ledger.ActionDenied, res.Action.State)
		_, err = b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.ErrorIs(t, err, ledger.ErrConflict)
	})

	t.Run("stale digest changes nothing", func(t *testing.T) {
		b, run, a := setup(t)
		before, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		other, err := ledger.DigestJSON([]byte(`{"other":true}`))
		require.NoError(t, err)
		_, err = decide(b, a, other, ledger.DecisionGrant)
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), "digest mismatch")
		after, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, before.EventSeq, after.EventSeq)
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionAwaitingApproval, got.State)
	})

	t.Run("expired by time, then by the sweep", func(t *testing.T) {
		b, _, a := setup(t)
		b.Clock.Advance(time.Hour) // the fixture's TTL
		_, err := decide(b, a, a.ActionDigest, ledger.DecisionGrant)
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), "expired")
		expired, err := b.Store.ExpireApprovals(ctx)
		require.NoError(t, err)
		require.Len(t, expired, 1)
		require.Equal(t, ledger.ApprovalExpired, expired[0].State)
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionExpired, got.State)
		again, err := b.Store.ExpireApprovals(ctx)
		require.NoError(t, err)
		require.Empty(t, again)
	})

	t.Run("not yet expired", func(t *testing.T) {
		b, _, a := setup(t)
		b.Clock.Advance(time.Hour - time.Microsecond)
		expired, err := b.Store.ExpireApprovals(ctx)
		require.NoError(t, err)
		require.Empty(t, expired)
		_, err = decide(b, a, a.ActionDigest, ledger.DecisionGrant)
		require.NoError(t, err)
	})

	t.Run("a settled approval resumes the waiting run", func(t *testing.T) {
		for _, settle := range []string{"grant", "deny", "expire"} {
			t.Run(settle, func(t *testing.T) {
				b, run, a := setup(t)
				second := b.Action(t, run.ID, "step-2", ledger.ActionAwaitingApproval).Action
				_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunAwaitingApproval})
				require.NoError(t, err)
				_, err = decide(b, second, second.ActionDigest, ledger.DecisionGrant)
				require.NoError(t, err)
				got, err := b.Store.FindRunByID(ctx, run.ID)
				require.NoError(t, err)
				require.Equal(t, ledger.RunAwaitingApproval, got.State, "another approval is still pending")
				switch settle {
				case "grant":
					_, err = decide(b, a, a.ActionDigest, ledger.DecisionGrant)
				case "deny":
					_, err = decide(b, a, a.ActionDigest, ledger.DecisionDeny)
				case "expire":
					b.Clock.Advance(2 * time.Hour)
					_, err = b.Store.ExpireApprovals(ctx)
				}
				require.NoError(t, err)
				got, err = b.Store.FindRunByID(ctx, run.ID)
				require.NoError(t, err)
				require.Equal(t, ledger.RunRunning, got.State)
			})
		}
	})

	t.Run("ErrInvalid and ErrNotFound", func(t *testing.T) {
		b, _, a := setup(t)
		_, err := decide(b, a, "sha256:nothex", ledger.DecisionGrant)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		_, err = decide(b, a, a.ActionDigest, "maybe")
		require.ErrorIs(t, err, ledger.ErrInvalid)
		_, err = b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a.ID, ActionDigest: a.ActionDigest, Decision: ledger.DecisionGrant})
		require.ErrorIs(t, err, ledger.ErrInvalid, "principal required")
		_, err = b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: "act_nope", ActionDigest: a.ActionDigest, Decision: ledger.DecisionGrant, Principal: "bob"})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

func testAttempts(t *testing.T, h Harness) {
	ctx := context.Background()

	t.Run("approval required", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval).Action
		_, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.ErrorIs(t, err, ledger.ErrApprovalRequired)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Empty(t, atts)
	})

	t.Run("retry keeps the dedup key, error round-trips", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
		first, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.NoError(t, err)
		b.Clock.Advance(3 * time.Second)
		res, err := b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: first.ID, Status: ledger.AttemptTimedOut,
			Error: &ledger.AttemptError{Code: "timeout", Message: "no answer in 3s"}})
		require.NoError(t, err)
		require.Equal(t, ledger.EffectUnknown, res.Attempt.Effect, "a timeout says nothing about the effect")
		require.Equal(t, &ledger.AttemptError{Code: "timeout", Message: "no answer in 3s"}, res.Attempt.Error)
		// The query finds nothing happened; retry under the same approval.
		_, _, err = b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: first.ID, Source: ledger.ObservedQuery,
			Effect: ledger.EffectNotHappened, Detail: json.RawMessage(`{"found":false}`)})
		require.NoError(t, err)
		_, err = b.Store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: ledger.ActionUncertain, To: ledger.ActionApproved})
		require.NoError(t, err)
		second, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.NoError(t, err)
		require.Equal(t, int64(2), second.No)
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, a.DedupKey, got.DedupKey, "dedup key is per action, not per attempt")
		require.Equal(t, int64(2), got.AttemptCount)
		r, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, int64(2), r.Budget.Used.Attempts)
		require.Equal(t, 3*time.Second, r.Budget.Used.Execution)
		obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, obs, 1)
		require.JSONEq(t, `{"found":false}`, string(obs[0].Detail))
	})

	t.Run("a 3-attempt budget allows no 4th, across restarts", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{MaxAttemptsPerAction: 3})
		a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
		for i := range 3 {
			s := b.reopen(t, Options{}) // a restart between every attempt
			att, err := s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
			require.NoError(t, err, "attempt %d", i+1)
			_, err = s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptFailed,
				Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown},
			})
			require.NoError(t, err)
			_, err = s.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: ledger.ActionUncertain, To: ledger.ActionApproved})
			require.NoError(t, err)
			require.NoError(t, s.Close())
		}
		s := b.reopen(t, Options{})
		_, err := s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.ErrorIs(t, err, ledger.ErrBudgetExceeded)
		require.Contains(t, err.Error(), "3 of 3")
		atts, err := s.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, atts, 3)
	})

	t.Run("run budgets: attempts, execution time, deadline", func(t *testing.T) {
		b := openStore(t, h)
		cases := map[string]struct {
			limits ledger.BudgetLimits
			spend  func(s ledger.Store, a *ledger.Action)
		}{
			"attempts per run": {ledger.BudgetLimits{MaxAttemptsPerRun: 1}, func(s ledger.Store, a *ledger.Action) {
				att, err := s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
				require.NoError(t, err)
				_, err = s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptUncertain})
				require.NoError(t, err)
				_, err = s.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: ledger.ActionUncertain, To: ledger.ActionApproved})
				require.NoError(t, err)
			}},
			"execution time": {ledger.BudgetLimits{MaxExecution: time.Minute}, func(s ledger.Store, a *ledger.Action) {
				_, err := s.AddUsage(ctx, ledger.AddUsageParams{RunID: a.RunID, Steps: 1, Execution: time.Minute})
				require.NoError(t, err)
			}},
			"deadline": {ledger.BudgetLimits{DeadlineAfter: time.Hour}, func(s ledger.Store, a *ledger.Action) {
				b.Clock.Advance(2 * time.Hour)
			}},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				run := b.RunningRun(t, name, tc.limits)
				a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
				tc.spend(b.Store, a)
				_, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
				require.ErrorIs(t, err, ledger.ErrBudgetExceeded)
			})
		}
	})

	t.Run("no attempt after a cancel is accepted", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
		res, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice"})
		require.NoError(t, err)
		require.True(t, res.Created)
		again, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice"})
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, res.Cancellation.ID, again.Cancellation.ID)
		require.Equal(t, ledger.CancelAccepted, res.Cancellation.State, "accepted in the same write")
		got, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunStopping, got.State, "and the run moved with it")
		_, err = b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), "stopping")
	})

	t.Run("cancel of a terminal run is refused", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunCompleted, StopReason: ledger.StopCompleted})
		require.NoError(t, err)
		_, err = b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice"})
		require.ErrorIs(t, err, ledger.ErrConflict)
		_, err = b.Store.FindCancellation(ctx, run.ID)
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})

	t.Run("token accounting unavailable is sticky", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{MaxTokens: 100})
		_, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, Tokens: 10})
		require.NoError(t, err)
		_, err = b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, TokensUnavailable: true})
		require.NoError(t, err)
		got, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, Tokens: 5})
		require.NoError(t, err)
		require.Equal(t, ledger.BudgetUsage{Steps: 3, Tokens: 15, TokensUnavailable: true}, got.Used)
		_, err = b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Tokens: -1})
		require.ErrorIs(t, err, ledger.ErrInvalid)
		_, err = b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: "run_nope", Steps: 1})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}
