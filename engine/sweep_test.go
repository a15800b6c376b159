package engine_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
)

// The pool's sweep settles what an agent that never comes back left open,
// with nobody asking /next (docs/recovery.md).

// sweep runs one pass of the pool (which sweeps lapsed leases and
// unanswered decisions), handing out no run.
func (b *clientBundle) sweep(t *testing.T) {
	t.Helper()
	d := engine.NewDispatcher(b.engine, make(chan ledger.RunID, 1024))
	d.RunOnce(context.Background())
}

func (b *clientBundle) action(t *testing.T, id ledger.ActionID) *ledger.Action {
	t.Helper()
	a, err := b.Store.FindActionByID(context.Background(), id)
	require.NoError(t, err)
	return a
}

// begun proposes an approved write of tool in a new run and begins it.
func (b *clientBundle) begun(t *testing.T, key, tool string) (*ledger.Run, *ledger.Action) {
	t.Helper()
	run := b.run(t, key)
	a := b.approved(t, run.ID, tool, "s")
	_, err := b.engine.Begin(context.Background(), engine.BeginParams{Caller: b.caller, ActionID: a.ID, Key: "b"})
	require.NoError(t, err)
	return run, a
}

// TestSweepUnansweredDecision: the agent is gone after its lease lapsed;
// the sweep tells it to query, then, once the decision timeout passes,
// hands the action to a person.
func TestSweepUnansweredDecision(t *testing.T) {
	b := setupClient(t)
	for _, tool := range []string{"pay.query", "pay.dedup"} {
		t.Run(tool, func(t *testing.T) {
			run, a := b.begun(t, tool, tool)
			b.Clock.Advance(11 * time.Second)
			b.sweep(t)
			require.NotEqual(t, ledger.ActionNeedsReview, b.action(t, a.ID).State, "told, not yet due")
			b.Clock.Advance(engine.DefaultDecisionTimeout)
			b.sweep(t)
			require.Equal(t, ledger.ActionNeedsReview, b.action(t, a.ID).State)
			got, err := b.Store.FindRunByID(context.Background(), run.ID)
			require.NoError(t, err)
			require.Equal(t, ledger.RunNeedsReview, got.State)
		})
	}
}

// TestSweepBacklog: 105 lapsed attempts whose agents were told to query
// and never answered do not keep the sweep from a no-guarantee write that
// lapses after them: it reaches review in the next pass.
func TestSweepBacklog(t *testing.T) {
	b := setupClient(t)
	for i := range 105 {
		b.begun(t, "q"+strconv.Itoa(i), "pay.query")
	}
	b.Clock.Advance(11 * time.Second)
	b.sweep(t)
	b.sweep(t) // every one of them told, none answered
	_, last := b.begun(t, "none", "pay.none")
	b.Clock.Advance(11 * time.Second)
	b.sweep(t)
	require.Equal(t, ledger.ActionNeedsReview, b.action(t, last.ID).State)
}

// TestInterruptedReadContinues: a read that promises nothing, interrupted
// (its lease lapsed), is run again: it carries no effect for a person to
// establish.
func TestInterruptedReadContinues(t *testing.T) {
	b := setupClient(t)
	ctx := context.Background()
	run := b.run(t, "read")
	res, err := b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "s", Tool: "kv.get",
		Arguments: []byte(`{"n":1}`), Usage: &engine.Usage{}})
	require.NoError(t, err)
	_, err = b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: res.Action.ID, Key: "b1"})
	require.NoError(t, err)
	b.Clock.Advance(11 * time.Second)
	b.sweep(t)
	next, err := b.engine.Next(ctx, b.caller, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.DirectiveExecute, next.Directives[0].Kind, next.Directives[0].Rationale)
	require.Equal(t, ledger.RunRunning, next.Run.State)
	_, err = b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: res.Action.ID, Key: "b2"})
	require.NoError(t, err)
}
