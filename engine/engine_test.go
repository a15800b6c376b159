package engine_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: the
// worker pool must stop all of its own, and every store must close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bundle is a real ledger, a real effect store, the approval service and an
// engine with the practice-cards agent and a scripted reader agent.
type bundle struct {
	*ledgertest.Bundle
	effects   *simulator.EffectStore
	approvals *approval.Service
	engine    *engine.Engine
}

func setup(t *testing.T, cfg simulator.Config) *bundle {
	t.Helper()
	return setupWith(t, cfg, nil)
}

// setupWith is setup with a last say on the engine's configuration.
func setupWith(t *testing.T, cfg simulator.Config, tune func(*engine.Config)) *bundle {
	t.Helper()
	ctx := context.Background()
	lb := ledgertest.OpenStore(t)
	effects, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), lb.Clock.Now)
	require.NoError(t, err)
	t.Cleanup(func() { _ = effects.Close() })

	cards := simulator.PracticeCardsAgent(effects, cfg)
	count := simulator.NewTool(simulator.CardsCountDescriptor(), effects, cfg.Tools["cards.count"])
	reader := engine.Agent{
		Name: "reader",
		NewModel: func(json.RawMessage) (engine.Model, error) {
			return simulator.NewScriptedModel(
				engine.Step{Kind: engine.StepToolCall, Tool: "cards.count", Arguments: json.RawMessage(`{"title":"Rust"}`)},
				engine.Step{Kind: engine.StepFinal, Final: json.RawMessage(`{"done":true}`)},
			), nil
		},
		Tools: []engine.Tool{count},
	}
	tools := map[string]contracts.ToolDescriptor{}
	for _, a := range []engine.Agent{cards, reader} {
		for _, tool := range a.Tools {
			tools[tool.Descriptor().Name] = tool.Descriptor()
		}
	}
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(lb.Store, policy, func(n string) (contracts.ToolDescriptor, bool) { d, ok := tools[n]; return d, ok }, approval.Options{})
	ecfg := engine.Config{Store: lb.Store, Approvals: svc, Agents: []engine.Agent{cards, reader},
		Now: lb.Clock.Now, PollInterval: 10 * time.Millisecond}
	if tune != nil {
		tune(&ecfg)
	}
	eng, err := engine.New(ecfg)
	require.NoError(t, err)
	return &bundle{Bundle: lb, effects: effects, approvals: svc, engine: eng}
}

func (b *bundle) submit(t *testing.T, agent, key string) *ledger.Run {
	t.Helper()
	title, md := simulator.SampleDocument()
	input, err := json.Marshal(map[string]string{"title": title, "markdown": md})
	require.NoError(t, err)
	res, err := b.Store.SubmitRun(context.Background(), ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: key,
		Principal: "alice", Agent: agent, Input: input})
	require.NoError(t, err)
	return res.Run
}

func (b *bundle) advance(t *testing.T, id ledger.RunID) *ledger.Run {
	t.Helper()
	require.NoError(t, b.engine.Advance(context.Background(), id))
	run, err := b.Store.FindRunByID(context.Background(), id)
	require.NoError(t, err)
	return run
}

// pendingAction is the run's action waiting for approval.
func (b *bundle) pendingAction(t *testing.T, run ledger.RunID) *ledger.Action {
	t.Helper()
	ctx := context.Background()
	aprs, err := b.Store.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &run, State: ptr(ledger.ApprovalPending)})
	require.NoError(t, err)
	require.Len(t, aprs, 1)
	a, err := b.Store.FindActionByID(ctx, aprs[0].ActionID)
	require.NoError(t, err)
	require.Equal(t, aprs[0].ActionDigest, a.ActionDigest)
	return a
}

func (b *bundle) decide(principal string, a *ledger.Action, d ledger.Digest, dec ledger.ApprovalDecision) error {
	_, err := b.approvals.Decide(context.Background(), approval.DecideParams{Tenant: "acme", Principal: principal,
		ActionID: a.ID, ActionDigest: d, Decision: dec})
	return err
}

// effects counts effects in the simulator's own store, never the ledger.
func (b *bundle) effectCount(t *testing.T) int {
	t.Helper()
	es, err := b.effects.Effects(context.Background())
	require.NoError(t, err)
	return len(es)
}

func (b *bundle) chainOK(t *testing.T, run ledger.RunID) {
	t.Helper()
	rep, err := b.Store.VerifyChain(context.Background(), run)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
}

func TestApprovedWriteRunsOnce(t *testing.T) {
	b := setup(t, simulator.Config{})
	ctx := context.Background()
	run := b.submit(t, "practice-cards", "k1")
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunAwaitingApproval, run.State)
	require.Equal(t, 0, b.effectCount(t), "nothing runs before approval")

	a := b.pendingAction(t, run.ID)
	require.Equal(t, "cards.write", a.Tool)
	require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunCompleted, run.State)
	require.Equal(t, ledger.StopCompleted, run.StopReason)

	es, err := b.effects.Effects(ctx)
	require.NoError(t, err)
	require.Len(t, es, 1)
	require.Equal(t, a.DedupKey, es[0].DedupKey)
	argsDigest, err := ledger.DigestJSON(a.Arguments)
	require.NoError(t, err)
	require.Equal(t, argsDigest, es[0].ArgumentsDigest, "the tool ran the exact approved arguments")

	atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
	require.NoError(t, err)
	require.Len(t, atts, 1)
	require.Equal(t, ledger.AttemptSucceeded, atts[0].Status)
	require.Equal(t, ledger.EffectHappened, atts[0].Effect)
	obs, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{AttemptID: &atts[0].ID})
	require.NoError(t, err)
	require.Len(t, obs, 1)
	require.Equal(t, ledger.ObservedResult, obs[0].Source)
	require.Equal(t, int64(2), run.Budget.Used.Steps, "write step and final step")
	b.chainOK(t, run.ID)

	// Advancing a finished run does nothing more.
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunCompleted, run.State)
	require.Equal(t, 1, b.effectCount(t))
}

func TestDeniedWriteHasNoEffect(t *testing.T) {
	b := setup(t, simulator.Config{})
	run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
	a := b.pendingAction(t, run.ID)
	require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionDeny))
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunStopped, run.State)
	require.Equal(t, ledger.StopApprovalDenied, run.StopReason)
	require.Equal(t, 0, b.effectCount(t))
	b.chainOK(t, run.ID)
}

func TestExpiredApprovalStopsTheRun(t *testing.T) {
	b := setup(t, simulator.Config{})
	ctx := context.Background()
	run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
	a := b.pendingAction(t, run.ID)
	b.Clock.Advance(approval.DefaultApprovalTTL)
	require.ErrorIs(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant), ledger.ErrConflict, "too late")
	expired, err := b.approvals.ExpireDue(ctx)
	require.NoError(t, err)
	require.Len(t, expired, 1)
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunStopped, run.State)
	require.Equal(t, ledger.StopApprovalExpired, run.StopReason)
	require.Equal(t, 0, b.effectCount(t))
}

func TestStaleDigestAfterTheActionChanged(t *testing.T) {
	b := setup(t, simulator.Config{})
	ctx := context.Background()
	run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
	old := b.pendingAction(t, run.ID)

	// The model re-proposes the action with other arguments while it waits:
	// a new action with a new digest supersedes the old one. (The engine
	// records actions only while a run runs.)
	_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunAwaitingApproval, To: ledger.RunRunning})
	require.NoError(t, err)
	next, err := b.Store.CreateAction(ctx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: "step-1b",
		Tool: old.Tool, ToolVersion: old.ToolVersion, Effect: old.Effect, Supersedes: old.ID,
		Arguments: json.RawMessage(`{"title":"Rust","cards":[{"front":"Borrowing?","back":"References without ownership"}]}`),
		Gate:      ledger.ActionAwaitingApproval, Actor: "engine"})
	require.NoError(t, err)
	require.NotEqual(t, old.ActionDigest, next.Action.ActionDigest)

	err = b.decide("bob", old, old.ActionDigest, ledger.DecisionGrant)
	require.ErrorIs(t, err, ledger.ErrConflict, "the old action's approval was invalidated")
	err = b.decide("bob", next.Action, old.ActionDigest, ledger.DecisionGrant)
	require.ErrorIs(t, err, ledger.ErrConflict, "the old digest approves nothing else")
	require.Equal(t, 0, b.effectCount(t))

	require.NoError(t, b.decide("bob", next.Action, next.Action.ActionDigest, ledger.DecisionGrant))
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunCompleted, run.State)
	es, err := b.effects.Effects(ctx)
	require.NoError(t, err)
	require.Len(t, es, 1)
	require.Equal(t, next.Action.DedupKey, es[0].DedupKey, "the approved action ran, not the superseded one")
}

func TestSelfApprovalRefused(t *testing.T) {
	b := setup(t, simulator.Config{})
	run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
	a := b.pendingAction(t, run.ID)
	require.ErrorIs(t, b.decide("alice", a, a.ActionDigest, ledger.DecisionGrant), ledger.ErrForbidden)
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunAwaitingApproval, run.State)
	require.Equal(t, 0, b.effectCount(t))
}

func TestReadRunsWithoutApproval(t *testing.T) {
	b := setup(t, simulator.Config{})
	ctx := context.Background()
	run := b.advance(t, b.submit(t, "reader", "k1").ID)
	require.Equal(t, ledger.RunCompleted, run.State)
	actions, err := b.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
	require.NoError(t, err)
	require.Len(t, actions, 1)
	require.Equal(t, ledger.EffectRead, actions[0].Effect)
	require.Equal(t, ledger.ActionSucceeded, actions[0].State)
	aprs, err := b.Store.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &run.ID})
	require.NoError(t, err)
	require.Empty(t, aprs, "no approval was asked for")
	atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run.ID})
	require.NoError(t, err)
	require.Len(t, atts, 1)
	require.Equal(t, ledger.EffectNotHappened, atts[0].Effect, "a read changes nothing")
	require.Equal(t, 0, b.effectCount(t))
}

func TestSameSubmitTwiceRunsOnce(t *testing.T) {
	b := setup(t, simulator.Config{})
	first := b.submit(t, "practice-cards", "k1")
	second := b.submit(t, "practice-cards", "k1")
	require.Equal(t, first.ID, second.ID)
	run := b.advance(t, first.ID)
	a := b.pendingAction(t, run.ID)
	require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
	b.advance(t, first.ID)
	b.advance(t, second.ID)
	require.Equal(t, 1, b.effectCount(t))
}

func TestToolFailures(t *testing.T) {
	ctx := context.Background()
	approve := func(t *testing.T, b *bundle) *ledger.Run {
		run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
		a := b.pendingAction(t, run.ID)
		require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
		return b.advance(t, run.ID)
	}

	t.Run("an error that did nothing fails the run", func(t *testing.T) {
		b := setup(t, simulator.Config{Tools: map[string]simulator.ToolConfig{
			"cards.write": {Faults: []simulator.Fault{{Kind: simulator.FaultError}}}}})
		run := approve(t, b)
		require.Equal(t, ledger.RunFailed, run.State)
		require.Equal(t, ledger.StopToolError, run.StopReason)
		require.Equal(t, 0, b.effectCount(t))
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.AttemptFailed, atts[0].Status)
		require.Equal(t, ledger.EffectNotHappened, atts[0].Effect)
		require.Equal(t, "simulated_error", atts[0].Error.Code)
	})

	none := &contracts.Guarantees{}

	t.Run("timeouts of a queryable tool: query, retry, then the retry budget stops the run", func(t *testing.T) {
		b := setup(t, simulator.Config{Tools: map[string]simulator.ToolConfig{
			"cards.write": {TimeoutMS: ptr(int64(20)), Faults: []simulator.Fault{{Kind: simulator.FaultTimeout}}}}})
		run := approve(t, b)
		require.Equal(t, ledger.RunStopped, run.State)
		require.Equal(t, ledger.StopRetryBudgetExhausted, run.StopReason)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Len(t, atts, 5, "the engine's cap when the run sets no budget")
		for _, a := range atts {
			require.Equal(t, ledger.AttemptTimedOut, a.Status)
			require.Equal(t, ledger.EffectNotHappened, a.Effect, "established by query, not assumed")
		}
		require.Equal(t, 0, b.effectCount(t))
		require.Equal(t, 5, countDecisions(t, b, run.ID, "query"))
	})

	t.Run("an error of unknown effect: query finds nothing, retry succeeds once", func(t *testing.T) {
		b := setup(t, simulator.Config{Tools: map[string]simulator.ToolConfig{
			"cards.write": {Faults: []simulator.Fault{{Kind: simulator.FaultErrorUnknown, Calls: []int{1}}}}}})
		run := approve(t, b)
		require.Equal(t, ledger.RunCompleted, run.State)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Len(t, atts, 2)
		require.Equal(t, ledger.AttemptFailed, atts[0].Status)
		require.Equal(t, ledger.EffectNotHappened, atts[0].Effect, "established by the query, not by the error")
		require.Equal(t, ledger.EffectHappened, atts[1].Effect)
		require.Equal(t, 1, b.effectCount(t))
	})

	t.Run("a timeout of a tool that guarantees nothing goes to review", func(t *testing.T) {
		b := setup(t, simulator.Config{Tools: map[string]simulator.ToolConfig{
			"cards.write": {Guarantees: none, TimeoutMS: ptr(int64(20)), Faults: []simulator.Fault{{Kind: simulator.FaultTimeout}}}}})
		run := approve(t, b)
		require.Equal(t, ledger.RunNeedsReview, run.State)
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Len(t, atts, 1, "never retried")
		require.Equal(t, ledger.AttemptTimedOut, atts[0].Status)
		require.Equal(t, ledger.EffectUnknown, atts[0].Effect, "a timeout is not 'did not happen'")
		a, err := b.Store.FindActionByID(ctx, atts[0].ActionID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionNeedsReview, a.State)
		require.Equal(t, 1, countDecisions(t, b, run.ID, "review"))
	})

	t.Run("an attempt left started by a dead process: query, then retry once", func(t *testing.T) {
		b := setup(t, simulator.Config{})
		run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
		a := b.pendingAction(t, run.ID)
		require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
		// Another process recorded the attempt and died before calling the tool.
		_, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.NoError(t, err)
		run = b.advance(t, run.ID)
		require.Equal(t, ledger.RunCompleted, run.State)
		require.Equal(t, 1, b.effectCount(t))
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, atts, 2)
		require.Equal(t, ledger.AttemptUncertain, atts[0].Status)
		require.Equal(t, ledger.EffectNotHappened, atts[0].Effect)
		require.Equal(t, ledger.EffectHappened, atts[1].Effect)
	})

	t.Run("an attempt left started by a dead process, tool guarantees nothing: review, no call", func(t *testing.T) {
		b := setup(t, simulator.Config{Tools: map[string]simulator.ToolConfig{"cards.write": {Guarantees: none}}})
		run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
		a := b.pendingAction(t, run.ID)
		require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
		_, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.NoError(t, err)
		run = b.advance(t, run.ID)
		require.Equal(t, ledger.RunNeedsReview, run.State)
		require.Equal(t, 0, b.effectCount(t), "the engine did not call the tool again")
		atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		require.NoError(t, err)
		require.Len(t, atts, 1)
		require.Equal(t, ledger.AttemptUncertain, atts[0].Status)
	})
}

// countDecisions counts recovery decisions of a kind in a run's events.
func countDecisions(t *testing.T, b *bundle, run ledger.RunID, kind string) int {
	t.Helper()
	events, err := b.Store.FindEvents(context.Background(), run)
	require.NoError(t, err)
	n := 0
	for _, e := range events {
		if e.Type != "recovery.decision" {
			continue
		}
		var d struct{ Decision, Rationale string }
		require.NoError(t, json.Unmarshal(e.Data, &d))
		require.NotEmpty(t, d.Rationale)
		if d.Decision == kind {
			n++
		}
	}
	return n
}

// TestWorkerPoolResumesOnApproval: no goroutine waits for the person; the
// approval, given later, makes the run runnable and the pool finishes it.
func TestWorkerPoolResumesOnApproval(t *testing.T) {
	b := setup(t, simulator.Config{})
	ctx := context.Background()
	b.engine.Start(ctx)
	defer b.engine.Stop()

	run := b.submit(t, "practice-cards", "k1")
	b.engine.Notify()
	waitState(t, b, run.ID, ledger.RunAwaitingApproval)
	a := b.pendingAction(t, run.ID)
	require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
	b.engine.Notify()
	waitState(t, b, run.ID, ledger.RunCompleted)
	require.Equal(t, 1, b.effectCount(t))
	b.engine.Stop()
}

func waitState(t *testing.T, b *bundle, id ledger.RunID, want ledger.RunState) {
	t.Helper()
	require.Eventually(t, func() bool {
		run, err := b.Store.FindRunByID(context.Background(), id)
		return err == nil && run.State == want
	}, 10*time.Second, 5*time.Millisecond, "run never reached %s", want)
}

func ptr[T any](v T) *T { return &v }
