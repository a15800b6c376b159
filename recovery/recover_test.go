package recovery_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/recovery"
	"github.com/stretchr/testify/require"
)

// interrupted is a run whose approved action's attempt was started and
// never finished.
func interrupted(t *testing.T, b *ledgertest.Bundle, limits ledger.BudgetLimits) (*ledger.Run, *ledger.Action) {
	t.Helper()
	run := b.RunningRun(t, "k", limits)
	a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
	_, err := b.Store.StartAttempt(context.Background(), ledger.StartAttemptParams{ActionID: a.ID})
	require.NoError(t, err)
	return run, a
}

func queryProbe(answer func() (ledger.EffectFact, error)) recovery.ProbeFunc {
	return func(string, string) (recovery.Probe, bool) {
		return recovery.Probe{Tool: recovery.Tool{Guarantees: contracts.Guarantees{Query: true}},
			QueryFunc: func(context.Context, string) (ledger.EffectFact, json.RawMessage, error) {
				e, err := answer()
				return e, nil, err
			}}, true
	}
}

func TestScan(t *testing.T) {
	ctx := context.Background()

	t.Run("a query that finds the effect reconciles without calling the tool", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		run, a := interrupted(t, b, ledger.BudgetLimits{})
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: queryProbe(func() (ledger.EffectFact, error) { return ledger.EffectHappened, nil })})
		rep, err := r.Scan(ctx)
		require.NoError(t, err)
		require.Equal(t, map[recovery.Kind]int{recovery.Reconcile: 1}, rep.Decisions)
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionSucceeded, got.State)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, atts, 1)
		require.Equal(t, ledger.AttemptUncertain, atts[0].Status, "status: the call's outcome was never seen")
		require.Equal(t, ledger.EffectHappened, atts[0].Effect, "effect: established by the query")
		events, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		var kinds []string
		for _, e := range events {
			if e.Type == "recovery.decision" {
				var d struct{ Decision, Rationale string }
				require.NoError(t, json.Unmarshal(e.Data, &d))
				require.NotEmpty(t, d.Rationale)
				kinds = append(kinds, d.Decision)
			}
		}
		require.Equal(t, []string{"query", "reconcile"}, kinds, "every decision is recorded, probes too")
	})

	t.Run("failed queries are never 'did not happen': wait, then review when the budget is spent", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		run, a := interrupted(t, b, ledger.BudgetLimits{})
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now, MaxQueryFailures: 3,
			Probes: queryProbe(func() (ledger.EffectFact, error) { return "", errors.New("503 from the tool") })})
		for i, want := range []recovery.Kind{recovery.Wait, recovery.Wait, recovery.Review} {
			rep, err := r.Scan(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, rep.Decisions[want], "scan %d", i+1)
		}
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionNeedsReview, got.State)
		r2, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunNeedsReview, r2.State)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.EffectUnknown, atts[0].Effect)
		obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{AttemptID: &atts[0].ID})
		require.NoError(t, err)
		require.Len(t, obs, 3, "each failed query is kept as evidence")
	})

	t.Run("a tool's error text of many lines and any length still lets the pass be recorded", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		_, a := interrupted(t, b, ledger.BudgetLimits{})
		msg := "upstream said:\n\tHTTP 503\r\n" + strings.Repeat("é", 6000) + "\x00end"
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now, MaxQueryFailures: 2,
			Probes: queryProbe(func() (ledger.EffectFact, error) { return "", errors.New(msg) })})
		for i, want := range []recovery.Kind{recovery.Wait, recovery.Review} {
			rep, err := r.Scan(ctx)
			require.NoError(t, err)
			require.Empty(t, rep.Errors, "scan %d", i+1)
			require.Equal(t, 1, rep.Decisions[want], "scan %d", i+1)
		}
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionNeedsReview, got.State)
		events, err := b.Store.FindEvents(ctx, a.RunID)
		require.NoError(t, err)
		var last string
		for _, e := range events {
			if e.Type == "recovery.decision" {
				var d struct{ Rationale string }
				require.NoError(t, json.Unmarshal(e.Data, &d))
				last = d.Rationale
			}
		}
		require.Contains(t, last, "upstream said: HTTP 503", "the error's text, on one line")
		require.LessOrEqual(t, len(last), 4000)
	})

	t.Run("an 'unknown' answer goes to review", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		_, a := interrupted(t, b, ledger.BudgetLimits{})
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: queryProbe(func() (ledger.EffectFact, error) { return ledger.EffectUnknown, nil })})
		rep, err := r.Scan(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Decisions[recovery.Review])
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionNeedsReview, got.State)
	})

	t.Run("not happened with no attempt left stops the run with the budget's reason", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		run, a := interrupted(t, b, ledger.BudgetLimits{MaxAttemptsPerAction: 1})
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: queryProbe(func() (ledger.EffectFact, error) { return ledger.EffectNotHappened, nil }),
			Retry: func(run *ledger.Run, a *ledger.Action, _ time.Time) (ledger.StopReason, string) {
				if a.AttemptCount >= run.Budget.Limits.MaxAttemptsPerAction {
					return ledger.StopRetryBudgetExhausted, "1 of 1 attempts used"
				}
				return "", ""
			}})
		rep, err := r.Scan(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Decisions[recovery.Stop])
		got, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunStopped, got.State)
		require.Equal(t, ledger.StopRetryBudgetExhausted, got.StopReason)
		act, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionFailed, act.State)
	})

	t.Run("an unknown tool guarantees nothing: review", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		_, a := interrupted(t, b, ledger.BudgetLimits{})
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: func(string, string) (recovery.Probe, bool) { return recovery.Probe{}, false }})
		rep, err := r.Scan(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Decisions[recovery.Review])
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionNeedsReview, got.State)
	})
}

// decisionKinds lists the recovery decisions recorded on a run, in order.
func decisionKinds(t *testing.T, s ledger.Store, run ledger.RunID) []string {
	t.Helper()
	events, err := s.FindEvents(context.Background(), run)
	require.NoError(t, err)
	var kinds []string
	for _, e := range events {
		if e.Type == "recovery.decision" {
			var d struct{ Decision string }
			require.NoError(t, json.Unmarshal(e.Data, &d))
			kinds = append(kinds, d.Decision)
		}
	}
	return kinds
}

func TestRecoverWrites(t *testing.T) {
	ctx := context.Background()

	t.Run("a pass that cannot be applied leaves nothing, not even its query", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		run, a := interrupted(t, b, ledger.BudgetLimits{})
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: queryProbe(func() (ledger.EffectFact, error) {
				// Another process settles the attempt while the tool is asked.
				_, err := b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: atts[0].ID, Status: ledger.AttemptFailed,
					Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectNotHappened}})
				require.NoError(t, err)
				return ledger.EffectNotHappened, nil
			})})
		_, err = r.Recover(ctx, run, a)
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Empty(t, decisionKinds(t, b.Store, run.ID), "the query decision is written with its answer, or not at all")
		obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, obs, 1, "the other process's outcome, and not the query's answer")
		require.Equal(t, ledger.ObservedResult, obs[0].Source)
	})

	t.Run("facts that went stale during the pass: decided again from fresh ones, written once", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		run, a := interrupted(t, b, ledger.BudgetLimits{})
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		asked := 0
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: queryProbe(func() (ledger.EffectFact, error) {
				asked++
				if asked == 1 {
					// Another process records an answer that establishes
					// nothing: the run's chain moves, the action does not.
					_, _, err := b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: atts[0].ID,
						Source: ledger.ObservedQuery, Effect: ledger.EffectUnknown, Detail: json.RawMessage(`{"error":"503"}`)})
					require.NoError(t, err)
				}
				return ledger.EffectNotHappened, nil
			})})
		d, err := r.Recover(ctx, run, a)
		require.NoError(t, err)
		require.Equal(t, recovery.Continue, d.Kind)
		require.Equal(t, 2, asked, "asked again in the pass made from the fresh facts")
		require.Equal(t, []string{"query", "continue"}, decisionKinds(t, b.Store, run.ID), "the stale pass wrote nothing")
		rep, err := b.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
	})

	t.Run("a cancel is decided durably before the tool is asked", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		run, a := interrupted(t, b, ledger.BudgetLimits{})
		var seen []string
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: func(string, string) (recovery.Probe, bool) {
				return recovery.Probe{Tool: recovery.Tool{Guarantees: contracts.Guarantees{Cancel: true}},
					CancelFunc: func(context.Context, string) (bool, json.RawMessage, error) {
						seen = decisionKinds(t, b.Store, run.ID)
						return true, json.RawMessage(`{"cancelled":true}`), nil
					}}, true
			}})
		d, err := r.Recover(ctx, run, a)
		require.NoError(t, err)
		require.Equal(t, recovery.Continue, d.Kind)
		require.Equal(t, []string{"cancel"}, seen, "committed before the cancel was sent")
		require.Equal(t, []string{"cancel", "continue"}, decisionKinds(t, b.Store, run.ID))
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.EffectNotHappened, atts[0].Effect, "the confirmed cancel is recorded with the final decision")
	})

	t.Run("an answer that cannot be recorded is a failed query", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		run, a := interrupted(t, b, ledger.BudgetLimits{})
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: func(string, string) (recovery.Probe, bool) {
				return recovery.Probe{Tool: recovery.Tool{Guarantees: contracts.Guarantees{Query: true}},
					QueryFunc: func(context.Context, string) (ledger.EffectFact, json.RawMessage, error) {
						return ledger.EffectNotHappened, json.RawMessage(`{"a":1,"a":2}`), nil
					}}, true
			}})
		d, err := r.Recover(ctx, run, a)
		require.NoError(t, err)
		require.Equal(t, recovery.Wait, d.Kind, "never read as 'did not happen'")
		facts, err := b.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Equal(t, 1, facts[0].FailedQueries, "and it counts against the recovery budget")
	})

	t.Run("many runs in one scan, each decided once with an intact chain", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		var runs []ledger.RunID
		for i := range 40 {
			run := b.RunningRun(t, fmt.Sprintf("k%d", i), ledger.BudgetLimits{})
			a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
			_, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
			require.NoError(t, err)
			runs = append(runs, run.ID)
		}
		var decided atomic.Int64
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now, ScanWorkers: 8, ScanPage: 7,
			OnDecision: func(recovery.Decision) { decided.Add(1) },
			Probes:     queryProbe(func() (ledger.EffectFact, error) { return ledger.EffectNotHappened, nil })})
		rep, err := r.Scan(ctx)
		require.NoError(t, err)
		require.Equal(t, map[recovery.Kind]int{recovery.Continue: 40}, rep.Decisions)
		require.Equal(t, int64(80), decided.Load(), "a query and a continue each")
		for _, id := range runs {
			require.Equal(t, []string{"query", "continue"}, decisionKinds(t, b.Store, id))
			chain, err := b.Store.VerifyChain(ctx, id)
			require.NoError(t, err)
			require.True(t, chain.OK, chain.Reason)
		}
		again, err := r.Scan(ctx)
		require.NoError(t, err)
		require.Equal(t, map[recovery.Kind]int{recovery.Continue: 40}, again.Decisions, "approved, no attempt: start one")
	})

	t.Run("a run stopped by its first action is not recovered further", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		run, first := interrupted(t, b, ledger.BudgetLimits{})
		later := b.Action(t, run.ID, "step-2", ledger.ActionApproved).Action
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: queryProbe(func() (ledger.EffectFact, error) { return ledger.EffectNotHappened, nil }),
			Retry: func(*ledger.Run, *ledger.Action, time.Time) (ledger.StopReason, string) {
				return ledger.StopRetryBudgetExhausted, "no attempt left"
			}})
		rep, err := r.Scan(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Actions)
		require.Equal(t, 1, rep.Decisions[recovery.Stop])
		got, err := b.Store.FindActionByID(ctx, first.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionFailed, got.State)
		got, err = b.Store.FindActionByID(ctx, later.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionApproved, got.State, "its run is stopped: nothing more to decide")
	})
}

func TestResolve(t *testing.T) {
	ctx := context.Background()
	inReview := func(t *testing.T) (*ledgertest.Bundle, *ledger.Run, *ledger.Action) {
		b := ledgertest.OpenStore(t)
		run, a := interrupted(t, b, ledger.BudgetLimits{})
		r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
			Probes: func(string, string) (recovery.Probe, bool) { return recovery.Probe{}, true }})
		_, err := r.Scan(ctx)
		require.NoError(t, err)
		return b, run, a
	}
	for outcome, want := range map[recovery.Outcome]struct {
		action ledger.ActionState
		effect ledger.EffectFact
	}{
		recovery.OutcomeHappened:    {ledger.ActionSucceeded, ledger.EffectHappened},
		recovery.OutcomeNotHappened: {ledger.ActionFailed, ledger.EffectNotHappened},
		recovery.OutcomeAbandon:     {ledger.ActionAbandoned, ledger.EffectUnknown},
	} {
		t.Run(string(outcome), func(t *testing.T) {
			b, run, a := inReview(t)
			got, err := recovery.Resolve(ctx, b.Store, recovery.ResolveParams{Tenant: "acme", Principal: "bob", ActionID: a.ID,
				Outcome: outcome, Note: "checked the tool's console"})
			require.NoError(t, err)
			require.Equal(t, want.action, got.State)
			atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
			require.NoError(t, err)
			require.Equal(t, want.effect, atts[0].Effect)
			r, err := b.Store.FindRunByID(ctx, run.ID)
			require.NoError(t, err)
			require.Equal(t, ledger.RunRunning, r.State, "the run leaves review for the engine to go on or stop")
		})
	}
	t.Run("errors change nothing", func(t *testing.T) {
		b, _, a := inReview(t)
		for name, p := range map[string]recovery.ResolveParams{
			"bad outcome":    {Tenant: "acme", Principal: "bob", ActionID: a.ID, Outcome: "maybe"},
			"no principal":   {Tenant: "acme", ActionID: a.ID, Outcome: recovery.OutcomeHappened},
			"other tenant":   {Tenant: "globex", Principal: "bob", ActionID: a.ID, Outcome: recovery.OutcomeHappened},
			"unknown action": {Tenant: "acme", Principal: "bob", ActionID: "act_nope", Outcome: recovery.OutcomeHappened},
		} {
			_, err := recovery.Resolve(ctx, b.Store, p)
			require.Error(t, err, name)
			require.NotEqual(t, ledger.CodeInternal, ledger.Code(err), name)
		}
		got, err := b.Store.FindActionByID(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionNeedsReview, got.State)
		_, err = recovery.Resolve(ctx, b.Store, recovery.ResolveParams{Tenant: "acme", Principal: "bob", ActionID: a.ID, Outcome: recovery.OutcomeHappened})
		require.NoError(t, err)
		_, err = recovery.Resolve(ctx, b.Store, recovery.ResolveParams{Tenant: "acme", Principal: "bob", ActionID: a.ID, Outcome: recovery.OutcomeHappened})
		require.ErrorIs(t, err, ledger.ErrConflict, "not in review any more")
	})
}

// TestRecoverCountsTheInterruptedAttempt: an interrupted attempt counts in
// the execution budget until recovery finds it, and recovery's budget
// verdict sees that time: with the budget spent while the process was
// dead, no attempt is started or resent.
func TestRecoverCountsTheInterruptedAttempt(t *testing.T) {
	ctx := context.Background()
	retry := func(run *ledger.Run, a *ledger.Action, now time.Time) (ledger.StopReason, string) {
		v := budget.DefaultPolicy().BeforeAttempt(run, a, now)
		return v.Stop, v.Rationale
	}
	probe := func(g contracts.Guarantees, effect ledger.EffectFact) recovery.ProbeFunc {
		return func(string, string) (recovery.Probe, bool) {
			p := recovery.Probe{Tool: recovery.Tool{Guarantees: g}}
			if g.Query {
				p.QueryFunc = func(context.Context, string) (ledger.EffectFact, json.RawMessage, error) { return effect, nil, nil }
			}
			return p, true
		}
	}
	for name, tc := range map[string]struct {
		probe  recovery.ProbeFunc
		want   recovery.Kind
		action ledger.ActionState
		run    ledger.RunState
	}{
		// The query says the tool never acted: the run stops, max_runtime.
		"Stop": {probe(contracts.Guarantees{Query: true}, ledger.EffectNotHappened), recovery.Stop, ledger.ActionFailed, ledger.RunStopped},
		// Only a resend could settle it, and none is allowed: a person decides.
		"Review": {probe(contracts.Guarantees{Dedup: true}, ""), recovery.Review, ledger.ActionNeedsReview, ledger.RunNeedsReview},
	} {
		t.Run(name, func(t *testing.T) {
			b := ledgertest.OpenStore(t)
			run, a := interrupted(t, b, ledger.BudgetLimits{MaxExecution: time.Second})
			b.Clock.Advance(1500 * time.Millisecond) // the process is dead meanwhile
			r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now, Probes: tc.probe, Retry: retry})
			d, err := r.Recover(ctx, run, a)
			require.NoError(t, err)
			require.Equal(t, tc.want, d.Kind, d.Rationale)
			if tc.want == recovery.Stop {
				require.Equal(t, ledger.StopMaxRuntime, d.StopReason)
			}
			got, err := b.Store.FindActionByID(ctx, a.ID)
			require.NoError(t, err)
			require.Equal(t, tc.action, got.State)
			require.Equal(t, int64(1), got.AttemptCount, "no attempt started")
			r2, err := b.Store.FindRunByID(ctx, run.ID)
			require.NoError(t, err)
			require.Equal(t, tc.run, r2.State)
			require.Equal(t, 1500*time.Millisecond, r2.Budget.Used.Execution, "the attempt counted until it was found interrupted")
		})
	}
}

// TestScanSettlesCancellations makes the rows the old three-write cancel
// left when a run completed between its writes (a cancellation accepted,
// or only requested, on a completed run), and a crash's (requested on a
// live run), and checks that a scan settles each with its event.
func TestScanSettlesCancellations(t *testing.T) {
	ctx := context.Background()
	b := ledgertest.OpenStore(t)
	completed := func(key string) *ledger.Run {
		run := b.RunningRun(t, key, ledger.BudgetLimits{})
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunCompleted,
			StopReason: ledger.StopCompleted, Actor: "engine"})
		require.NoError(t, err)
		return run
	}
	accepted, requested := completed("accepted"), completed("requested")
	b.LegacyCancellation(t, accepted.ID, ledger.CancelAccepted)
	b.LegacyCancellation(t, requested.ID, ledger.CancelRequested)
	live := b.RunningRun(t, "live", ledger.BudgetLimits{})
	b.LegacyCancellation(t, live.ID, ledger.CancelRequested)

	r := recovery.New(recovery.Config{Store: b.Store, Now: b.Clock.Now,
		Probes: func(string, string) (recovery.Probe, bool) { return recovery.Probe{}, false }})
	rep, err := r.Scan(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Cancellations, 3)
	for _, tc := range []struct {
		run   *ledger.Run
		state ledger.CancellationState
		runIs ledger.RunState
	}{
		{accepted, ledger.CancelTooLate, ledger.RunCompleted},
		{requested, ledger.CancelTooLate, ledger.RunCompleted},
		{live, ledger.CancelAccepted, ledger.RunStopping},
	} {
		c, err := b.Store.FindCancellation(ctx, tc.run.ID)
		require.NoError(t, err)
		require.Equal(t, tc.state, c.State, tc.run.IdempotencyKey)
		got, err := b.Store.FindRunByID(ctx, tc.run.ID)
		require.NoError(t, err)
		require.Equal(t, tc.runIs, got.State, tc.run.IdempotencyKey)
		chain, err := b.Store.VerifyChain(ctx, tc.run.ID)
		require.NoError(t, err)
		require.True(t, chain.OK, "%+v", chain)
	}
	again, err := r.Scan(ctx)
	require.NoError(t, err)
	require.Empty(t, again.Cancellations, "settled once")
}
