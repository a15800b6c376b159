package storetest

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/stretchr/testify/require"
)

// interruptedAction is a running run whose approved action's attempt was
// started and never finished, as a crash leaves it.
func interruptedAction(t *testing.T, b *bundle, key string) (*ledger.Run, *ledger.Action, *ledger.Attempt) {
	t.Helper()
	run := b.RunningRun(t, key, ledger.BudgetLimits{})
	a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
	att, err := b.Store.StartAttempt(context.Background(), ledger.StartAttemptParams{ActionID: a.ID})
	require.NoError(t, err)
	return run, a, att
}

func decision(kind, why string) ledger.RecoveryStep {
	return ledger.RecoveryStep{Decision: &ledger.RecoveryDecision{Decision: kind, Rationale: why, Data: map[string]any{"query": true}}}
}

func observation(effect ledger.EffectFact, detail string) ledger.RecoveryStep {
	return ledger.RecoveryStep{Observation: &ledger.ObservationInput{Source: ledger.ObservedQuery, Effect: effect, Detail: json.RawMessage(detail)}}
}

// continueAfterQuery is what recovery writes when a query finds that an
// interrupted attempt had no effect.
func continueAfterQuery(a *ledger.Action, att *ledger.Attempt) ledger.RecordRecoveryParams {
	return ledger.RecordRecoveryParams{ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID, Actor: "recovery",
		Steps: []ledger.RecoveryStep{
			decision("query", "effect unknown and the tool can be queried: query by dedup key"),
			observation(ledger.EffectNotHappened, `{"found":false}`),
			decision("continue", "the query found no effect: retry under the same approval"),
		},
		CloseAttempt: &ledger.CloseAttempt{Status: ledger.AttemptUncertain, Error: &ledger.AttemptError{Code: "interrupted", Message: "no outcome was recorded for this attempt"}},
		Moves:        []ledger.ActionMove{{To: ledger.ActionApproved, Data: map[string]any{"decision": "continue"}}},
	}
}

// eventTypes lists a run's event types after its first skip events.
func eventTypes(t *testing.T, s ledger.Store, run ledger.RunID, skip int) []string {
	t.Helper()
	events, err := s.FindEvents(context.Background(), run)
	require.NoError(t, err)
	var types []string
	for _, e := range events[skip:] {
		types = append(types, e.Type)
	}
	return types
}

func testRecordRecovery(t *testing.T, h Harness) {
	ctx := context.Background()

	t.Run("OK decisions, answer and act in one write, in order", func(t *testing.T) {
		b := openStore(t, h)
		run, a, att := interruptedAction(t, b, "k")
		before, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		b.Clock.Advance(2 * time.Second)

		res, err := b.Store.RecordRecovery(ctx, continueAfterQuery(a, att))
		require.NoError(t, err)
		require.Equal(t, ledger.ActionApproved, res.ActionState)
		require.Len(t, res.Decisions, 2)

		require.Equal(t, []string{"recovery.decision", "observation.recorded", "attempt.effect_not_happened",
			"recovery.decision", "attempt.uncertain", "action.uncertain", "action.approved"}, eventTypes(t, b.Store, run.ID, len(before)))
		var d struct {
			Decision, Rationale string
			AttemptID           string `json:"attempt_id"`
			Query               bool
		}
		require.NoError(t, json.Unmarshal(res.Decisions[0].Data, &d))
		require.Equal(t, "query", d.Decision)
		require.Equal(t, string(att.ID), d.AttemptID)
		require.True(t, d.Query, "the decision's data is kept")

		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionApproved, got.State)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.AttemptUncertain, atts[0].Status)
		require.Equal(t, ledger.EffectNotHappened, atts[0].Effect)
		require.Equal(t, "interrupted", atts[0].Error.Code)
		require.NotNil(t, atts[0].FinishedAt)
		r, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, 2*time.Second, r.Budget.Used.Execution, "the interrupted attempt's time counts")
		rep, err := b.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
	})

	t.Run("OK review moves the run", func(t *testing.T) {
		b := openStore(t, h)
		run, a, att := interruptedAction(t, b, "k")
		_, err := b.Store.RecordRecovery(ctx, ledger.RecordRecoveryParams{ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID,
			Actor: "recovery", Steps: []ledger.RecoveryStep{decision("review", "effect unknown: a person decides")},
			CloseAttempt: &ledger.CloseAttempt{Status: ledger.AttemptUncertain},
			Moves:        []ledger.ActionMove{{To: ledger.ActionNeedsReview}},
			Run:          &ledger.RunTransition{From: ledger.RunRunning, To: ledger.RunNeedsReview, Actor: "recovery"}})
		require.NoError(t, err)
		r, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunNeedsReview, r.State)
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionNeedsReview, got.State)
	})

	t.Run("OK decisions alone change no state", func(t *testing.T) {
		b := openStore(t, h)
		run, a, att := interruptedAction(t, b, "k")
		before, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		res, err := b.Store.RecordRecovery(ctx, ledger.RecordRecoveryParams{ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID,
			Actor: "recovery", Steps: []ledger.RecoveryStep{decision("query", "q"), observation(ledger.EffectUnknown, `{"error":"503"}`), decision("wait", "ask later")}})
		require.NoError(t, err)
		require.Equal(t, ledger.ActionRunning, res.ActionState)
		require.Equal(t, []string{"recovery.decision", "observation.recorded", "recovery.decision"}, eventTypes(t, b.Store, run.ID, len(before)))
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.AttemptStarted, atts[0].Status)
	})

	// Each case must leave the ledger exactly as it was: no decision, no
	// observation, no effect, no move.
	nothingWritten := func(t *testing.T, b *bundle, run *ledger.Run, a *ledger.Action, events int, actionState ledger.ActionState) {
		t.Helper()
		got, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		require.Len(t, got, events, "no event was written")
		obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Empty(t, obs, "no observation was written")
		act, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, actionState, act.State)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.EffectUnknown, atts[0].Effect, "no effect was established")
		rep, err := b.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
	}

	t.Run("ErrConflict the run moved underneath: nothing half-written", func(t *testing.T) {
		b := openStore(t, h)
		run, a, att := interruptedAction(t, b, "k")
		// Decided while the run was running; it moved before the write.
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunNeedsReview})
		require.NoError(t, err)
		events, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		p := continueAfterQuery(a, att)
		p.Moves = []ledger.ActionMove{{To: ledger.ActionNeedsReview}}
		p.Run = &ledger.RunTransition{From: ledger.RunRunning, To: ledger.RunNeedsReview}
		_, err = b.Store.RecordRecovery(ctx, p)
		require.ErrorIs(t, err, ledger.ErrConflict)
		nothingWritten(t, b, run, a, len(events), ledger.ActionRunning)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.AttemptStarted, atts[0].Status, "the attempt is still open")
	})

	t.Run("ErrConflict the action moved underneath", func(t *testing.T) {
		b := openStore(t, h)
		run, a, att := interruptedAction(t, b, "k")
		_, err := b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptUncertain})
		require.NoError(t, err)
		events, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		_, err = b.Store.RecordRecovery(ctx, continueAfterQuery(a, att))
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), "stale")
		nothingWritten(t, b, run, a, len(events), ledger.ActionUncertain)
	})

	t.Run("ErrConflict an answer contradicting the established effect", func(t *testing.T) {
		b := openStore(t, h)
		run, a, att := interruptedAction(t, b, "k")
		_, _, err := b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: att.ID, Source: ledger.ObservedResult,
			Effect: ledger.EffectHappened})
		require.NoError(t, err)
		events, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		_, err = b.Store.RecordRecovery(ctx, continueAfterQuery(a, att))
		require.ErrorIs(t, err, ledger.ErrConflict)
		got, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		require.Len(t, got, len(events), "not even the decisions before the answer were written")
		obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, obs, 1, "only the earlier observation")
	})

	t.Run("ErrInvalid malformed passes change nothing", func(t *testing.T) {
		b := openStore(t, h)
		run, a, att := interruptedAction(t, b, "k")
		events, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		for name, p := range map[string]ledger.RecordRecoveryParams{
			"empty step":   {ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID, Steps: []ledger.RecoveryStep{{}}},
			"no rationale": {ActionID: a.ID, ActionState: ledger.ActionRunning, Steps: []ledger.RecoveryStep{decision("wait", "")}},
			"observation without attempt": {ActionID: a.ID, ActionState: ledger.ActionRunning,
				Steps: []ledger.RecoveryStep{observation(ledger.EffectHappened, `{}`)}},
			"close a non-running action": {ActionID: a.ID, ActionState: ledger.ActionUncertain, AttemptID: att.ID,
				CloseAttempt: &ledger.CloseAttempt{Status: ledger.AttemptUncertain}},
			"close as started": {ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID,
				CloseAttempt: &ledger.CloseAttempt{Status: ledger.AttemptStarted}},
			"an edge owned by closing the attempt": {ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID,
				Moves: []ledger.ActionMove{{To: ledger.ActionSucceeded}}},
			"not an edge": {ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID,
				CloseAttempt: &ledger.CloseAttempt{Status: ledger.AttemptUncertain},
				Moves:        []ledger.ActionMove{{To: ledger.ActionCancelled}}},
			"another action's attempt": {ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: "att_nope",
				Steps: []ledger.RecoveryStep{decision("wait", "w")}},
			"another run": {ActionID: a.ID, ActionState: ledger.ActionRunning, Steps: []ledger.RecoveryStep{decision("review", "r")},
				Run: &ledger.RunTransition{ID: "run_other", From: ledger.RunRunning, To: ledger.RunNeedsReview}},
		} {
			_, err := b.Store.RecordRecovery(ctx, p)
			require.ErrorIs(t, err, ledger.ErrInvalid, name)
		}
		nothingWritten(t, b, run, a, len(events), ledger.ActionRunning)
	})

	t.Run("ErrNotFound unknown action", func(t *testing.T) {
		b := openStore(t, h)
		_, err := b.Store.RecordRecovery(ctx, ledger.RecordRecoveryParams{ActionID: "act_nope", ActionState: ledger.ActionRunning,
			Steps: []ledger.RecoveryStep{decision("wait", "w")}})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

func testFindRecoveryFacts(t *testing.T, h Harness) {
	ctx := context.Background()
	b := openStore(t, h)

	// Run 1: an action on its second attempt; failed queries about both.
	run1, a1, first := interruptedAction(t, b, "k1")
	failed := func(att ledger.AttemptID, detail string) {
		_, _, err := b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: att, Source: ledger.ObservedQuery,
			Effect: ledger.EffectUnknown, Detail: json.RawMessage(detail)})
		require.NoError(t, err)
	}
	failed(first.ID, `{"error":"503"}`)
	_, err := b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: first.ID, Status: ledger.AttemptFailed,
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}})
	require.NoError(t, err)
	_, err = b.Store.TransitionAction(ctx, ledger.ActionTransition{ID: a1.ID, From: ledger.ActionUncertain, To: ledger.ActionApproved})
	require.NoError(t, err)
	second, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a1.ID})
	require.NoError(t, err)
	failed(second.ID, `{"error":"503"}`)
	failed(second.ID, `{"error":"timeout"}`)
	failed(second.ID, `{"state":"unknown"}`) // the tool answered "unknown": not a failed query
	failed(second.ID, `{"error":""}`)

	// Run 2: approved, no attempt, its cancel accepted.
	run2 := b.RunningRun(t, "k2", ledger.BudgetLimits{MaxAttemptsPerAction: 2})
	a2 := b.Action(t, run2.ID, "step-1", ledger.ActionApproved).Action
	_, err = b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run2.ID, Principal: "alice"})
	require.NoError(t, err)

	// Run 3: terminal; run 4: its action settled. Neither is recovery's.
	run3 := b.RunningRun(t, "k3", ledger.BudgetLimits{})
	b.Action(t, run3.ID, "step-1", ledger.ActionApproved)
	_, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run3.ID, From: ledger.RunRunning, To: ledger.RunFailed, StopReason: ledger.StopInternalError})
	require.NoError(t, err)
	run4 := b.RunningRun(t, "k4", ledger.BudgetLimits{})
	a4 := b.Action(t, run4.ID, "step-1", ledger.ActionAwaitingApproval).Action

	t.Run("OK every unsettled action of a live run, with its facts", func(t *testing.T) {
		got, err := b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{})
		require.NoError(t, err)
		require.Len(t, got, 2)

		f1 := got[0]
		require.Equal(t, a1.ID, f1.Action.ID)
		require.Equal(t, ledger.ActionRunning, f1.Action.State)
		require.Equal(t, run1.ID, f1.Run.ID)
		require.Equal(t, int64(2), f1.Run.Budget.Used.Attempts, "the run comes with its budget")
		require.NotNil(t, f1.Attempt)
		require.Equal(t, second.ID, f1.Attempt.ID, "the last attempt")
		require.Equal(t, ledger.AttemptStarted, f1.Attempt.Status)
		require.Equal(t, 2, f1.FailedQueries, "failed queries about the last attempt only")
		require.Empty(t, f1.Cancellation)

		f2 := got[1]
		require.Equal(t, a2.ID, f2.Action.ID)
		require.Nil(t, f2.Attempt)
		require.Equal(t, ledger.CancelAccepted, f2.Cancellation)
		require.Equal(t, int64(2), f2.Run.Budget.Limits.MaxAttemptsPerAction)
	})

	t.Run("OK one action whatever its state", func(t *testing.T) {
		got, err := b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &a4.ID})
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, ledger.ActionAwaitingApproval, got[0].Action.State)
		require.Nil(t, got[0].Attempt)
		got, err = b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &a1.ID})
		require.NoError(t, err)
		require.Equal(t, 2, got[0].FailedQueries)
	})

	t.Run("OK pages of runs", func(t *testing.T) {
		page, err := b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{Runs: 1})
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, a1.ID, page[0].Action.ID)
		page, err = b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{AfterRun: &run1.ID, Runs: 1})
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, a2.ID, page[0].Action.ID)
		require.Equal(t, ledger.CancelAccepted, page[0].Cancellation)
		page, err = b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{AfterRun: &run2.ID})
		require.NoError(t, err)
		require.Empty(t, page)
		_, err = b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{Runs: -1})
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})

	t.Run("ErrNotFound unknown action", func(t *testing.T) {
		id := ledger.ActionID("act_nope")
		_, err := b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &id})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

// testRecordRecoveryFromFacts: a recovery pass written with the facts it
// was decided on (RecordRecoveryParams.Facts) reads none of them again, so
// it must write exactly what the same pass writes without them, and must
// refuse, writing nothing, once another write has changed any row the
// facts hold: the attempt, the budget, the chain head, the action.
func testRecordRecoveryFromFacts(t *testing.T, h Harness) {
	ctx := context.Background()
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	factsOf := func(t *testing.T, s ledger.Store, a *ledger.Action) *ledger.RecoveryFacts {
		t.Helper()
		got, err := s.FindRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &a.ID})
		require.NoError(t, err)
		return got[0]
	}
	// written is everything a pass can have written about run and its
	// action, as the Store reads it back.
	type written struct {
		Chain        *ledger.Chain
		Action       *ledger.Action
		Attempts     []*ledger.Attempt
		Observations []*ledger.Observation
	}
	read := func(t *testing.T, s ledger.Store, run ledger.RunID, a ledger.ActionID) written {
		t.Helper()
		c, err := s.FindChain(ctx, run)
		require.NoError(t, err)
		require.True(t, c.Report.OK, c.Report.Reason)
		act, err := s.FindActionByID(ctx, a)
		require.NoError(t, err)
		atts, err := s.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a})
		require.NoError(t, err)
		obs, err := s.FindObservations(ctx, ledger.ObservationFilter{ActionID: &a})
		require.NoError(t, err)
		return written{Chain: c, Action: act, Attempts: atts, Observations: obs}
	}

	// Each case with what it raises the action's and the attempt's
	// versions by: one per change, as the statements of each change raise
	// them.
	type pass struct {
		params              func(a *ledger.Action, att *ledger.Attempt) ledger.RecordRecoveryParams
		actionUp, attemptUp int64
	}
	for name, c := range map[string]pass{
		// running → uncertain → approved; effect set, then closed.
		"continue": {continueAfterQuery, 2, 2},
		// running → uncertain → needs_review; closed, no effect established.
		"review, which moves the run": {func(a *ledger.Action, att *ledger.Attempt) ledger.RecordRecoveryParams {
			return ledger.RecordRecoveryParams{ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID, Actor: "recovery",
				Steps:        []ledger.RecoveryStep{decision("query", "q"), observation(ledger.EffectUnknown, `{"error":"503"}`), decision("review", "r")},
				CloseAttempt: &ledger.CloseAttempt{Status: ledger.AttemptUncertain},
				Moves:        []ledger.ActionMove{{To: ledger.ActionNeedsReview}},
				Run:          &ledger.RunTransition{From: ledger.RunRunning, To: ledger.RunNeedsReview, Actor: "recovery"}}
		}, 2, 1},
		"decisions alone": {func(a *ledger.Action, att *ledger.Attempt) ledger.RecordRecoveryParams {
			return ledger.RecordRecoveryParams{ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID, Actor: "recovery",
				Steps: []ledger.RecoveryStep{decision("query", "q"), observation(ledger.EffectUnknown, `{"error":"503"}`), decision("wait", "w")}}
		}, 0, 0},
	} {
		t.Run("OK "+name+": the same write as without the facts", func(t *testing.T) {
			var got [2]written
			for i, withFacts := range []bool{false, true} {
				b := openWith(t, h, Options{NewID: ledgertest.SequentialIDs(), SigningKey: key}, ledgertest.NewClock())
				run, a, att := interruptedAction(t, b, "k")
				b.Clock.Advance(2 * time.Second)
				p := c.params(a, att)
				facts := factsOf(t, b.Store, a)
				if withFacts {
					p.Facts = facts
				}
				_, err := b.Store.RecordRecovery(ctx, p)
				require.NoError(t, err)
				got[i] = read(t, b.Store, run.ID, a.ID)
				require.Equal(t, facts.Action.Version+c.actionUp, got[i].Action.Version, "the action's version")
				require.Equal(t, facts.Attempt.Version+c.attemptUp, got[i].Attempts[0].Version, "the attempt's version")
			}
			require.Equal(t, got[0], got[1])
		})
	}

	for name, change := range map[string]func(t *testing.T, b *bundle, run *ledger.Run, att *ledger.Attempt){
		"the attempt's effect was established": func(t *testing.T, b *bundle, _ *ledger.Run, att *ledger.Attempt) {
			_, _, err := b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: att.ID, Source: ledger.ObservedResult,
				Effect: ledger.EffectNotHappened})
			require.NoError(t, err)
		},
		"the budget was spent": func(t *testing.T, b *bundle, run *ledger.Run, _ *ledger.Attempt) {
			_, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1})
			require.NoError(t, err)
		},
		"the chain moved (an answer that established nothing)": func(t *testing.T, b *bundle, _ *ledger.Run, att *ledger.Attempt) {
			_, _, err := b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: att.ID, Source: ledger.ObservedQuery,
				Effect: ledger.EffectUnknown, Detail: json.RawMessage(`{"error":"503"}`)})
			require.NoError(t, err)
		},
		"the attempt was finished and the action moved": func(t *testing.T, b *bundle, _ *ledger.Run, att *ledger.Attempt) {
			_, err := b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptUncertain})
			require.NoError(t, err)
		},
	} {
		t.Run("ErrConflict "+name+" after the facts were read: nothing written", func(t *testing.T) {
			b := openStore(t, h)
			run, a, att := interruptedAction(t, b, "k")
			facts := factsOf(t, b.Store, a)
			change(t, b, run, att)
			before := read(t, b.Store, run.ID, a.ID)

			p := continueAfterQuery(a, att)
			p.Facts = facts
			_, err := b.Store.RecordRecovery(ctx, p)
			require.ErrorIs(t, err, ledger.ErrConflict)
			require.Equal(t, before, read(t, b.Store, run.ID, a.ID), "nothing of the pass was written")
		})
	}

	// The guards on each row alone: a row changed beside the Store, as
	// someone with access to the database could, moves no chain head.
	for name, q := range map[string]string{
		"attempt": `UPDATE attempts SET version = version + 1 WHERE action_id = ?`,
		"budget":  `UPDATE budgets SET steps_used = steps_used + 1 WHERE run_id = (SELECT run_id FROM actions WHERE id = ?)`,
		"action":  `UPDATE actions SET version = version + 1 WHERE id = ?`,
	} {
		t.Run("ErrConflict the "+name+" changed beside the store after the facts were read", func(t *testing.T) {
			b := openStore(t, h)
			run, a, att := interruptedAction(t, b, "k")
			facts := factsOf(t, b.Store, a)
			events, err := b.Store.FindEvents(ctx, run.ID)
			require.NoError(t, err)
			require.NoError(t, b.DB.Exec(ctx, q, string(a.ID)))
			p := continueAfterQuery(a, att)
			p.Facts = facts
			_, err = b.Store.RecordRecovery(ctx, p)
			require.ErrorIs(t, err, ledger.ErrConflict)
			require.Contains(t, err.Error(), "stale")
			got, err := b.Store.FindEvents(ctx, run.ID)
			require.NoError(t, err)
			require.Len(t, got, len(events), "nothing of the pass was written")
		})
	}

	t.Run("ErrInvalid facts about something else", func(t *testing.T) {
		b := openStore(t, h)
		_, a, att := interruptedAction(t, b, "k1")
		_, other, otherAtt := interruptedAction(t, b, "k2")
		for name, p := range map[string]ledger.RecordRecoveryParams{
			"another action": {ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: att.ID,
				Steps: []ledger.RecoveryStep{decision("wait", "w")}, Facts: factsOf(t, b.Store, other)},
			"another attempt": {ActionID: a.ID, ActionState: ledger.ActionRunning, AttemptID: otherAtt.ID,
				Steps: []ledger.RecoveryStep{decision("wait", "w")}, Facts: factsOf(t, b.Store, a)},
			"another state": {ActionID: a.ID, ActionState: ledger.ActionUncertain, AttemptID: att.ID,
				Steps: []ledger.RecoveryStep{decision("wait", "w")}, Facts: factsOf(t, b.Store, a)},
		} {
			_, err := b.Store.RecordRecovery(ctx, p)
			require.ErrorIs(t, err, ledger.ErrInvalid, name)
		}
	})
}
