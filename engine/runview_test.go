package engine_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/simulator"
)

// countingStore counts the reads of a run's rows beside the run itself.
type countingStore struct {
	ledger.Store
	actions, attempts, cancellations atomic.Int64
}

func (s *countingStore) FindActions(ctx context.Context, f ledger.ActionFilter) ([]*ledger.Action, error) {
	s.actions.Add(1)
	return s.Store.FindActions(ctx, f)
}

func (s *countingStore) FindAttempts(ctx context.Context, f ledger.AttemptFilter) ([]*ledger.Attempt, error) {
	s.attempts.Add(1)
	return s.Store.FindAttempts(ctx, f)
}

func (s *countingStore) FindCancellation(ctx context.Context, run ledger.RunID) (*ledger.Cancellation, error) {
	s.cancellations.Add(1)
	return s.Store.FindCancellation(ctx, run)
}

// hookTool answers at once and runs call, if set, during its n-th call.
type hookTool struct {
	desc  contracts.ToolDescriptor
	calls *atomic.Int64
	n     int64
	call  func(engine.Call)
}

func (t hookTool) Descriptor() contracts.ToolDescriptor { return t.desc }

func (t hookTool) Execute(_ context.Context, c engine.Call) (engine.Result, error) {
	if t.calls.Add(1) == t.n && t.call != nil {
		t.call(c)
	}
	return engine.Result{Output: json.RawMessage(`{"ok":true}`), Effect: ledger.EffectHappened}, nil
}

// viewEngine is an engine over a counting store whose agent "view" makes
// steps calls of a hook tool, auto-approved.
func viewEngine(t *testing.T, steps, n int64, call func(*ledgertest.Bundle, engine.Call)) (*ledgertest.Bundle, *countingStore, *engine.Engine) {
	t.Helper()
	lb := ledgertest.OpenStore(t)
	desc := simulator.CardsWriteDescriptor()
	desc.Name, desc.Guarantees = "view.write", contracts.Guarantees{}
	tool := hookTool{desc: desc, calls: new(atomic.Int64), n: n}
	if call != nil {
		tool.call = func(c engine.Call) { call(lb, c) }
	}
	var script []engine.Step
	for i := range steps {
		script = append(script, engine.Step{Kind: engine.StepToolCall, Tool: desc.Name,
			Arguments: json.RawMessage(`{"title":"t","cards":[{"front":"q` + string(rune('0'+i)) + `","back":"a"}]}`)})
	}
	agent := engine.Agent{Name: "view", Tools: []engine.Tool{tool},
		NewModel: func(json.RawMessage) (engine.Model, error) { return simulator.NewScriptedModel(script...), nil }}
	rules := &contracts.Rules{Rules: []contracts.Rule{{Tool: desc.Name, Decision: contracts.RuleDecisionAutoApprove}}}
	policy, err := approval.NewPolicy(rules, approval.Defaults{})
	require.NoError(t, err)
	store := &countingStore{Store: lb.Store}
	eng, err := engine.New(engine.Config{Store: store, Approvals: approval.NewService(lb.Store, policy, nil, approval.Options{}),
		Agents: []engine.Agent{agent}, Now: lb.Clock.Now})
	require.NoError(t, err)
	return lb, store, eng
}

func submitView(t *testing.T, lb *ledgertest.Bundle) ledger.RunID {
	t.Helper()
	res, err := lb.Store.SubmitRun(context.Background(), ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k",
		Principal: "alice", Agent: "view", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	return res.Run.ID
}

// TestAdvanceReadsARunOnce: between the steps of one Advance the engine
// follows its own writes (CreateAction, FinishAttempt) and reads the run
// alone, not its actions, attempts and cancellation again for every step.
func TestAdvanceReadsARunOnce(t *testing.T) {
	lb, store, eng := viewEngine(t, 5, 0, nil)
	run := submitView(t, lb)
	require.NoError(t, eng.Advance(context.Background(), run))
	got, err := lb.Store.FindRunByID(context.Background(), run)
	require.NoError(t, err)
	require.Equal(t, ledger.RunCompleted, got.State)
	// Queued → running is a write the view does not follow: the first
	// step of the running run reads everything, the rest nothing more.
	require.Equal(t, int64(1), store.actions.Load(), "actions read")
	require.Equal(t, int64(1), store.attempts.Load(), "attempts read")
	require.Equal(t, int64(2), store.cancellations.Load(), "cancellation read (queued, then running)")
}

// TestAdvanceSeesWritesOfOthers: a write of someone else to the run
// between two of the engine's writes is seen at the next step. Here,
// during the second call, another writer records a denied action on the
// run; the engine, reading the run again, finds it the current action and
// stops the run, instead of going on from what it had seen.
func TestAdvanceSeesWritesOfOthers(t *testing.T) {
	lb, store, eng := viewEngine(t, 5, 2, func(lb *ledgertest.Bundle, c engine.Call) {
		_, err := lb.Store.CreateAction(context.Background(), ledger.CreateActionParams{RunID: c.RunID, IdempotencyKey: "outside",
			Tool: "view.write", ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"title":"x","cards":[]}`),
			Gate: ledger.ActionDenied, Actor: "someone"})
		require.NoError(t, err)
	})
	run := submitView(t, lb)
	require.NoError(t, eng.Advance(context.Background(), run))
	got, err := lb.Store.FindRunByID(context.Background(), run)
	require.NoError(t, err)
	require.Equal(t, ledger.RunStopped, got.State)
	require.Equal(t, ledger.StopPolicyDenied, got.StopReason)
	actions, err := lb.Store.FindActions(context.Background(), ledger.ActionFilter{RunID: &run})
	require.NoError(t, err)
	require.Len(t, actions, 3, "two of the engine's, then the other writer's")
	require.Equal(t, "outside", actions[2].IdempotencyKey)
	require.Equal(t, int64(2), store.actions.Load(), "read again after the other write")
}
