package postgres_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// recoveryFixture holds two live runs and one that ended:
//
//	run_1 (running): act_1a approved, no attempt; act_1b running, attempts
//	1 and 2 (the last), with unknown query and cancel observations about
//	both; act_1c succeeded. A cancellation, accepted.
//	run_2 (running): act_2a uncertain, one attempt.
//	run_3 (completed): act_3a running (left over), not selected.
func recoveryFixture(t *testing.T) *fixture {
	t.Helper()
	f := open(t)
	ctx := context.Background()
	f.write(t, func(tx ledger.Tx) error {
		for _, id := range []string{"run_1", "run_2", "run_3"} {
			r := newRun(id)
			r.State = ledger.RunRunning
			if id == "run_3" {
				r.State, r.StopReason = ledger.RunCompleted, "completed"
			}
			if err := tx.InsertRun(ctx, r); err != nil {
				return err
			}
		}
		actions := []struct {
			id, run string
			seq     int64
			state   ledger.ActionState
		}{
			{"act_1a", "run_1", 1, ledger.ActionApproved},
			{"act_1b", "run_1", 2, ledger.ActionRunning},
			{"act_1c", "run_1", 3, ledger.ActionSucceeded},
			{"act_2a", "run_2", 1, ledger.ActionUncertain},
			{"act_3a", "run_3", 1, ledger.ActionRunning},
		}
		for _, a := range actions {
			act := newAction(a.id, a.run, a.seq)
			act.State = a.state
			if err := tx.InsertAction(ctx, act); err != nil {
				return err
			}
		}
		for _, a := range []struct {
			id, action, run string
			no              int64
		}{{"att_1b1", "act_1b", "run_1", 1}, {"att_1b2", "act_1b", "run_1", 2}, {"att_2a1", "act_2a", "run_2", 1}, {"att_3a1", "act_3a", "run_3", 1}} {
			if err := tx.InsertAttempt(ctx, newAttempt(a.id, a.action, a.run, a.no)); err != nil {
				return err
			}
		}
		obs := []struct {
			id, attempt string
			src         ledger.ObservationSource
			effect      ledger.EffectFact
			detail      string
		}{
			{"obs_1", "att_1b1", ledger.ObservedQuery, ledger.EffectUnknown, `{"error":"timeout"}`}, // an older attempt's
			{"obs_2", "att_1b2", ledger.ObservedQuery, ledger.EffectUnknown, `{"error":"timeout"}`},
			{"obs_3", "att_1b2", ledger.ObservedCancel, ledger.EffectUnknown, ``},
			{"obs_4", "att_1b2", ledger.ObservedResult, ledger.EffectUnknown, ``},   // not a query or cancel
			{"obs_5", "att_1b2", ledger.ObservedQuery, ledger.EffectHappened, ``},   // established
			{"obs_6", "att_2a1", ledger.ObservedQuery, ledger.EffectUnknown, `{}`},  // the tool said unknown
			{"obs_7", "att_3a1", ledger.ObservedQuery, ledger.EffectUnknown, `{}`},  // a run not selected
			{"obs_8", "att_1b2", ledger.ObservedQuery, ledger.EffectUnknown, `[1]`}, // not an object
		}
		for i, o := range obs {
			action := map[string]ledger.ActionID{"att_1b1": "act_1b", "att_1b2": "act_1b", "att_2a1": "act_2a", "att_3a1": "act_3a"}[o.attempt]
			var detail json.RawMessage
			if o.detail != "" {
				detail = json.RawMessage(o.detail)
			}
			run := map[ledger.ActionID]ledger.RunID{"act_1b": "run_1", "act_2a": "run_2", "act_3a": "run_3"}[action]
			if err := tx.InsertObservation(ctx, &ledger.Observation{ID: ledger.ObservationID(o.id), RunID: run, ActionID: action,
				AttemptID: ledger.AttemptID(o.attempt), Source: o.src, Effect: o.effect, Detail: detail,
				ObservedAt: t0.Add(time.Duration(i) * time.Second)}); err != nil {
				return err
			}
		}
		return tx.InsertCancellation(ctx, &ledger.Cancellation{ID: "cnc_1", RunID: "run_1", Tenant: "acme",
			State: ledger.CancelAccepted, RequestedBy: "alice", Version: 2, RequestedAt: t0, AcceptedAt: &t0})
	})
	return f
}

func factIDs(facts []*ledger.RecoveryFacts) []ledger.ActionID {
	out := make([]ledger.ActionID, len(facts))
	for i, rf := range facts {
		out[i] = rf.Action.ID
	}
	return out
}

func obsIDs(obs []*ledger.Observation) []ledger.ObservationID {
	out := make([]ledger.ObservationID, len(obs))
	for i, o := range obs {
		out[i] = o.ID
	}
	return out
}

func TestListRecoveryFacts(t *testing.T) {
	f := recoveryFixture(t)
	ctx := context.Background()
	facts, obs, err := f.d.Reader().ListRecoveryFacts(ctx, ledger.RecoveryFilter{})
	require.NoError(t, err)
	require.Equal(t, []ledger.ActionID{"act_1a", "act_1b", "act_2a"}, factIDs(facts), "in (run, seq) order")

	a, b, c := facts[0], facts[1], facts[2]
	run1, err := f.d.Reader().GetRun(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, run1, a.Run, "the run with its budget")
	require.Nil(t, a.Attempt, "no attempt")
	require.Equal(t, ledger.CancelAccepted, a.Cancellation)
	last, err := f.d.Reader().GetAttempt(ctx, "att_1b2")
	require.NoError(t, err)
	require.Equal(t, last, b.Attempt, "the last attempt")
	require.Equal(t, ledger.CancellationState(""), c.Cancellation)
	want, err := f.d.Reader().GetAction(ctx, "act_2a")
	require.NoError(t, err)
	require.Equal(t, want, c.Action)
	for _, rf := range facts {
		require.Zero(t, rf.FailedQueries+rf.UnknownQueries+rf.UnknownCancels, "left for the ledger to count")
	}
	// The unknown queries and cancels about the facts' last attempts.
	require.Equal(t, []ledger.ObservationID{"obs_2", "obs_3", "obs_6", "obs_8"}, obsIDs(obs))
	require.Equal(t, `{"error":"timeout"}`, string(obs[0].Detail))

	// One action, whatever its state and its run's.
	one := ledger.ActionID("act_3a")
	facts, obs, err = f.d.Reader().ListRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &one})
	require.NoError(t, err)
	require.Equal(t, []ledger.ActionID{"act_3a"}, factIDs(facts))
	require.Equal(t, []ledger.ObservationID{"obs_7"}, obsIDs(obs))
	none := ledger.ActionID("act_none")
	facts, obs, err = f.d.Reader().ListRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &none})
	require.NoError(t, err)
	require.Empty(t, facts)
	require.Empty(t, obs)

	// Pages of runs.
	facts, _, err = f.d.Reader().ListRecoveryFacts(ctx, ledger.RecoveryFilter{Runs: 1})
	require.NoError(t, err)
	require.Equal(t, []ledger.ActionID{"act_1a", "act_1b"}, factIDs(facts), "a page never splits a run")
	after := ledger.RunID("run_1")
	facts, obs, err = f.d.Reader().ListRecoveryFacts(ctx, ledger.RecoveryFilter{AfterRun: &after, Runs: 1})
	require.NoError(t, err)
	require.Equal(t, []ledger.ActionID{"act_2a"}, factIDs(facts))
	require.Equal(t, []ledger.ObservationID{"obs_6"}, obsIDs(obs))
	facts, _, err = f.d.Reader().ListRecoveryFacts(ctx, ledger.RecoveryFilter{AfterRun: &after})
	require.NoError(t, err)
	require.Equal(t, []ledger.ActionID{"act_2a"}, factIDs(facts), "no limit")
	after = "run_2"
	facts, _, err = f.d.Reader().ListRecoveryFacts(ctx, ledger.RecoveryFilter{AfterRun: &after, Runs: 5})
	require.NoError(t, err)
	require.Empty(t, facts)

	_, _, err = f.d.Reader().ListRecoveryFacts(ctx, ledger.RecoveryFilter{Runs: -1})
	requireCode(t, ledger.CodeInvalid, err)

	// The same inside a snapshot.
	require.NoError(t, f.d.Read(ctx, func(r ledger.Reader) error {
		facts, _, err := r.ListRecoveryFacts(ctx, ledger.RecoveryFilter{})
		require.NoError(t, err)
		require.Len(t, facts, 3)
		return nil
	}))
}

func TestCounts(t *testing.T) {
	f := recoveryFixture(t)
	ctx := context.Background()
	counts, err := f.d.Reader().CountByState(ctx)
	require.NoError(t, err)
	require.Equal(t, map[ledger.RunState]int64{ledger.RunRunning: 2, ledger.RunCompleted: 1}, counts.Runs)
	require.Equal(t, map[ledger.ActionState]int64{ledger.ActionApproved: 1, ledger.ActionRunning: 2, ledger.ActionSucceeded: 1,
		ledger.ActionUncertain: 1}, counts.Actions)
	require.Empty(t, counts.Approvals)
	require.Equal(t, map[ledger.AttemptCountKey]int64{{Status: ledger.AttemptStarted, Effect: ledger.EffectUnknown}: 4}, counts.Attempts)

	// CountWaiting: pending approvals plus queued and running runs, each
	// counted up to the limit.
	f.write(t, func(tx ledger.Tx) error {
		for _, a := range []struct{ id, action string }{{"apr_1", "act_1a"}, {"apr_2", "act_1c"}, {"apr_3", "act_2a"}} {
			if err := tx.InsertApproval(ctx, &ledger.Approval{ID: ledger.ApprovalID(a.id), ActionID: ledger.ActionID(a.action),
				RunID: "run_1", Tenant: "acme", ActionDigest: digest(a.action), State: ledger.ApprovalPending, Version: 1,
				RequestedAt: t0}); err != nil {
				return err
			}
		}
		return nil
	})
	for limit, want := range map[int]int{-1: 5, 0: 0, 1: 2, 2: 4, 3: 5, 10: 5} {
		n, err := f.d.Reader().CountWaiting(ctx, "acme", limit)
		require.NoError(t, err)
		require.Equal(t, want, n, "limit %d", limit)
	}
	n, err := f.d.Reader().CountWaiting(ctx, "other", 3)
	require.NoError(t, err)
	require.Zero(t, n)
	counts, err = f.d.Reader().CountByState(ctx)
	require.NoError(t, err)
	require.Equal(t, map[ledger.ApprovalState]int64{ledger.ApprovalPending: 3}, counts.Approvals)
}
