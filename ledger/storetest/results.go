package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// testWriteResultsAreRows holds what CreateAction, StartAttempt and
// FinishAttempt return to what a reader finds afterwards, field for field:
// the engine goes on from those results (it builds the model's history
// from them), so a result built without reading the row back must be the
// row.
func testWriteResultsAreRows(t *testing.T, h Harness) {
	ctx := context.Background()
	b := openStore(t, h)
	run := b.RunningRun(t, "k", ledger.BudgetLimits{MaxAttemptsPerRun: 3})
	audit := ledger.GateAudit{Rule: -1, Reason: "default", RulesDigest: ledger.DigestCanonical([]byte(`{}`))}
	create := func(key string, gate ledger.ActionState, start bool, mod func(*ledger.CreateActionParams)) ledger.CreateActionResult {
		t.Helper()
		b.Clock.Advance(time.Millisecond)
		p := ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: key, Tool: "cards.write", ToolVersion: "1",
			Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{ "cards": [ {"front": "q", "back": "a"} ] }`),
			Gate: gate, GateAudit: audit, StartAttempt: start, Actor: "engine", ApprovalTTL: time.Hour,
			Usage: &ledger.AddUsageParams{Steps: 1, Tokens: 3, Execution: time.Millisecond}}
		if mod != nil {
			mod(&p)
		}
		res, err := b.Store.CreateAction(ctx, p)
		require.NoError(t, err)
		return res
	}
	action := func(a *ledger.Action) {
		t.Helper()
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, got, a)
	}
	attempt := func(a *ledger.Attempt) {
		t.Helper()
		got, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ActionID})
		require.NoError(t, err)
		require.NotEmpty(t, got)
		require.Equal(t, got[len(got)-1], a)
	}
	finish := func(att *ledger.Attempt, p ledger.FinishAttemptParams) {
		t.Helper()
		b.Clock.Advance(time.Millisecond)
		p.AttemptID, p.Actor = att.ID, "engine"
		res, err := b.Store.FinishAttempt(ctx, p)
		require.NoError(t, err)
		action(res.Action)
		attempt(res.Attempt)
		if p.Observation != nil {
			obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{AttemptID: &att.ID})
			require.NoError(t, err)
			require.Equal(t, obs[len(obs)-1], res.Observation)
		}
	}

	t.Run("approved and started, then succeeded", func(t *testing.T) {
		res := create("step-1", ledger.ActionApproved, true, nil)
		require.NotNil(t, res.Attempt)
		action(res.Action)
		attempt(res.Attempt)
		finish(res.Attempt, ledger.FinishAttemptParams{Status: ledger.AttemptSucceeded, Result: json.RawMessage(`{ "ok": true }`),
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened, Detail: json.RawMessage(`{ "ok": true }`)}})
	})
	t.Run("approved and started, then failed without an established effect", func(t *testing.T) {
		res := create("step-2", ledger.ActionApproved, true, func(p *ledger.CreateActionParams) { p.GateAudit = ledger.GateAudit{} })
		action(res.Action)
		attempt(res.Attempt)
		finish(res.Attempt, ledger.FinishAttemptParams{Status: ledger.AttemptFailed, Error: &ledger.AttemptError{Code: "tool_error", Message: "it broke"},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}})
	})
	t.Run("approved, started on its own, timed out without an observation", func(t *testing.T) {
		res := create("step-3", ledger.ActionApproved, false, func(p *ledger.CreateActionParams) { p.Usage = nil })
		action(res.Action)
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: res.Action.ID, Actor: "engine"})
		require.NoError(t, err)
		attempt(att)
		finish(att, ledger.FinishAttemptParams{Status: ledger.AttemptTimedOut, Error: &ledger.AttemptError{Code: "timeout", Message: "late"}})
	})
	t.Run("the attempt refused by the budget", func(t *testing.T) {
		res := create("step-4", ledger.ActionApproved, true, nil)
		require.ErrorIs(t, res.StartErr, ledger.ErrBudgetExceeded)
		require.Nil(t, res.Attempt)
		action(res.Action)
	})
	t.Run("awaiting approval, then superseded", func(t *testing.T) {
		res := create("step-5", ledger.ActionAwaitingApproval, false, nil)
		action(res.Action)
		next := create("step-6", ledger.ActionDenied, false, func(p *ledger.CreateActionParams) { p.Supersedes = res.Action.ID })
		action(next.Action)
	})
	t.Run("a replayed step", func(t *testing.T) {
		res := create("step-1", ledger.ActionApproved, true, nil)
		require.True(t, res.Duplicate)
		action(res.Action)
	})
	rep, err := b.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
}
