package faultmatrix

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/simulator"
)

// TestWriteChecks proves the write loop's checks can fail: facts of a real
// run, read back through the store, pass; each broken on purpose as a
// half-written commit or a lost effect would leave them, they fail with a
// message that names what is wrong.
func TestWriteChecks(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*runFacts, []simulator.Effect) {
		t.Helper()
		b := ledgertest.OpenStore(t)
		run := b.RunningRun(t, "k1", ledger.BudgetLimits{})
		res := b.Action(t, run.ID, "step-1", ledger.ActionApproved)
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: res.Action.ID, Actor: "engine"})
		require.NoError(t, err)
		_, err = b.Store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded,
			Actor:       "engine",
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened}})
		require.NoError(t, err)
		_, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunCompleted,
			StopReason: ledger.StopCompleted, Actor: "engine"})
		require.NoError(t, err)
		f, err := readFacts(ctx, b.Store, run.ID)
		require.NoError(t, err)
		return f, []simulator.Effect{{Seq: 1, DedupKey: res.Action.DedupKey, Tool: "cards.write"}}
	}
	t.Run("OK", func(t *testing.T) {
		f, effects := setup(t)
		require.Empty(t, f.check(WritePathAuto, effects))
	})
	for name, tc := range map[string]struct {
		breakIt func(f *runFacts, effects *[]simulator.Effect)
		want    string
	}{
		"RowWithoutItsEvent": {func(f *runFacts, _ *[]simulator.Effect) { f.actions[0].State = ledger.ActionFailed },
			"is failed but its last event says succeeded"},
		"EffectWithoutItsEvent": {func(f *runFacts, _ *[]simulator.Effect) { f.attempts[0].Effect = ledger.EffectUnknown },
			"has effect unknown but its events say"},
		"BudgetOfALostAttempt": {func(f *runFacts, _ *[]simulator.Effect) { f.run.Budget.Used.Attempts++ },
			"the budget counts 2 attempts"},
		"EventsCut": {func(f *runFacts, _ *[]simulator.Effect) { f.events = f.events[:len(f.events)-1] },
			"but it has"},
		"StuckRun": {func(f *runFacts, _ *[]simulator.Effect) { f.run.State = ledger.RunRunning },
			"stuck"},
		"TwoEffects": {func(f *runFacts, e *[]simulator.Effect) { *e = append(*e, (*e)[0]) },
			"two effects for dedup key"},
		"LostEffect": {func(f *runFacts, e *[]simulator.Effect) { *e = nil },
			"the run completed with 0 effects"},
		"UnapprovedWrite": {func(*runFacts, *[]simulator.Effect) {}, // checked as the approval path: no approval was granted
			"ran with 0 granted approvals"},
	} {
		t.Run("Err"+name, func(t *testing.T) {
			f, effects := setup(t)
			tc.breakIt(f, &effects)
			path := WritePathAuto
			if name == "UnapprovedWrite" {
				path = WritePathApproval
			}
			got := strings.Join(f.check(path, effects), "; ")
			require.Contains(t, got, tc.want)
		})
	}
}
