package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// Tools of the loop tests, all reads (auto-approved): cards.count refuses
// every call before acting (a tool error with effect not_happened, so the
// action fails), cards.peek is the same read under another name and
// answers every call, cards.vague is a write (approved by a rule) that
// fails every call without knowing the effect (uncertain: recovery's, never
// the model's).
const (
	failingTool = simulator.CardsCountTool
	workingTool = "cards.peek"
	vagueTool   = "cards.vague"
)

// loopEnv is a real ledger, a real effect store and an engine with the
// given agents, built from loopAgent.
type loopEnv struct {
	lb     *ledgertest.Bundle
	engine *engine.Engine
}

// loopAgent is a scripted built-in agent over the loop tests' tools.
type loopAgent struct {
	name      string
	policy    budget.Policy
	continues bool
	steps     []engine.Step
}

func newLoopEnv(t *testing.T, enginePolicy budget.Policy, agents ...loopAgent) *loopEnv {
	t.Helper()
	ctx := context.Background()
	lb := ledgertest.OpenStore(t)
	effects, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), lb.Clock.Now)
	require.NoError(t, err)
	t.Cleanup(func() { _ = effects.Close() })

	peek := simulator.CardsCountDescriptor()
	peek.Name = workingTool
	vague := simulator.CardsCountDescriptor()
	vague.Name, vague.Effect = vagueTool, contracts.EffectWrite
	tools := []engine.Tool{
		simulator.NewTool(simulator.CardsCountDescriptor(), effects, simulator.ToolConfig{
			Faults: []simulator.Fault{{Kind: simulator.FaultError}}}),
		simulator.NewTool(peek, effects, simulator.ToolConfig{}),
		simulator.NewTool(vague, effects, simulator.ToolConfig{Faults: []simulator.Fault{{Kind: simulator.FaultErrorUnknown}}}),
	}
	descs := map[string]contracts.ToolDescriptor{}
	for _, tool := range tools {
		descs[tool.Descriptor().Name] = tool.Descriptor()
	}
	var registered []engine.Agent
	for _, a := range agents {
		steps := a.steps
		registered = append(registered, engine.Agent{Name: a.name, Tools: tools, Policy: a.policy, ContinueOnToolError: a.continues,
			NewModel: func(json.RawMessage) (engine.Model, error) { return simulator.NewScriptedModel(steps...), nil }})
	}
	policy, err := approval.NewPolicy(&contracts.Rules{SchemaVersion: "1",
		Rules: []contracts.Rule{{Tool: vagueTool, Decision: contracts.RuleDecisionAutoApprove}}}, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(lb.Store, policy, func(n string) (contracts.ToolDescriptor, bool) { d, ok := descs[n]; return d, ok },
		approval.Options{})
	eng, err := engine.New(engine.Config{Store: lb.Store, Approvals: svc, Agents: registered, Now: lb.Clock.Now, Policy: enginePolicy})
	require.NoError(t, err)
	return &loopEnv{lb: lb, engine: eng}
}

// run submits a run of agent and advances it as far as it goes.
func (e *loopEnv) run(t *testing.T, agent string) *ledger.Run {
	t.Helper()
	ctx := context.Background()
	res, err := e.lb.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k-" + agent, Principal: "alice",
		Agent: agent, Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, e.engine.Advance(ctx, res.Run.ID))
	run, err := e.lb.Store.FindRunByID(ctx, res.Run.ID)
	require.NoError(t, err)
	return run
}

func (e *loopEnv) actions(t *testing.T, run ledger.RunID) []*ledger.Action {
	t.Helper()
	as, err := e.lb.Store.FindActions(context.Background(), ledger.ActionFilter{RunID: &run})
	require.NoError(t, err)
	return as
}

// stopEvent is the one event that ended the run; it fails unless exactly
// one did.
func stopEvent(t *testing.T, store ledger.Store, run *ledger.Run) map[string]any {
	t.Helper()
	events, err := store.FindEvents(context.Background(), run.ID)
	require.NoError(t, err)
	var stops []*ledger.Event
	for _, ev := range events {
		if ev.EntityType == "run" && ledger.RunState(ev.ToState).Terminal() {
			stops = append(stops, ev)
		}
	}
	require.Len(t, stops, 1, "the stop is recorded once")
	var data map[string]any
	require.NoError(t, json.Unmarshal(stops[0].Data, &data))
	require.Equal(t, string(run.StopReason), data["stop_reason"])
	return data
}

// call is a step calling tool with a title of its own, so that no two
// steps repeat an action.
func call(tool, title string) engine.Step {
	return engine.Step{Kind: engine.StepToolCall, Tool: tool, Arguments: json.RawMessage(fmt.Sprintf(`{"title":%q}`, title)),
		Usage: &engine.Usage{InputTokens: 1, OutputTokens: 1}}
}

// failing is n calls of the failing tool, titled prefix-1 … prefix-n.
func failing(prefix string, n int) []engine.Step {
	steps := make([]engine.Step, n)
	for i := range steps {
		steps[i] = call(failingTool, fmt.Sprintf("%s-%d", prefix, i+1))
	}
	return steps
}

func ids(as []*ledger.Action) string {
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = string(a.ID)
	}
	return strings.Join(ss, ", ")
}

func TestLoopConsecutiveErrors(t *testing.T) {
	t.Run("DefaultEndsTheRunAtTheFirstFailure", func(t *testing.T) {
		e := newLoopEnv(t, budget.Policy{}, loopAgent{name: "a", steps: failing("t", 10)})
		run := e.run(t, "a")
		require.Equal(t, ledger.RunFailed, run.State)
		require.Equal(t, ledger.StopToolError, run.StopReason)
		require.Len(t, e.actions(t, run.ID), 1)
	})

	t.Run("PerAgentThresholds", func(t *testing.T) {
		// The engine's threshold is 4; strict sets 2 of its own, lenient
		// none: each run is held to its agent's.
		e := newLoopEnv(t, budget.Policy{ConsecutiveErrors: 4},
			loopAgent{name: "strict", policy: budget.Policy{ConsecutiveErrors: 2}, continues: true, steps: failing("t", 10)},
			loopAgent{name: "lenient", continues: true, steps: failing("t", 10)})
		for name, n := range map[string]int{"strict": 2, "lenient": 4} {
			t.Run(name, func(t *testing.T) {
				run := e.run(t, name)
				require.Equal(t, ledger.RunStopped, run.State)
				require.Equal(t, ledger.StopConsecutiveErrors, run.StopReason)
				actions := e.actions(t, run.ID)
				require.Len(t, actions, n, "exactly N failed actions, the N+1th proposal refused before it was recorded")
				for _, a := range actions {
					require.Equal(t, ledger.ActionFailed, a.State)
					require.Equal(t, int64(1), a.AttemptCount, "a failure whose effect is known is not retried")
				}
				require.Equal(t, int64(n+1), run.Budget.Used.Steps, "the refused proposal was a model step")
				data := stopEvent(t, e.lb.Store, run)
				require.Equal(t, fmt.Sprintf("the last %d actions all failed (limit %d): %s", n, n, ids(actions)), data["rationale"])
			})
		}
	})

	t.Run("SuccessBreaksTheStreak", func(t *testing.T) {
		steps := append(failing("a", 2), call(workingTool, "b"))
		steps = append(steps, failing("c", 5)...)
		e := newLoopEnv(t, budget.Policy{}, loopAgent{name: "a", continues: true, steps: steps})
		run := e.run(t, "a")
		require.Equal(t, ledger.StopConsecutiveErrors, run.StopReason)
		actions := e.actions(t, run.ID)
		require.Len(t, actions, 6, "2 failures, a success, then the default 3 failures")
		require.Equal(t, ledger.ActionSucceeded, actions[2].State)
		require.Contains(t, stopEvent(t, e.lb.Store, run)["rationale"], ids(actions[3:]))
	})

	t.Run("FinalAnswerAfterFailures", func(t *testing.T) {
		steps := append(failing("a", 2), engine.Step{Kind: engine.StepFinal, Final: json.RawMessage(`{"gave_up":true}`), Usage: &engine.Usage{}})
		e := newLoopEnv(t, budget.Policy{}, loopAgent{name: "a", continues: true, steps: steps})
		run := e.run(t, "a")
		require.Equal(t, ledger.RunCompleted, run.State, "the model answered its failures itself")
		require.Len(t, e.actions(t, run.ID), 2)
	})

	t.Run("UncertainIsRecoverysNotAnError", func(t *testing.T) {
		// After one failure the model calls a tool that fails without
		// knowing the effect. That never reaches the model, nor counts as
		// the second error: recovery queries, finds nothing and retries the
		// same action until its attempts are spent.
		steps := []engine.Step{call(failingTool, "a"), call(vagueTool, "b"), call(failingTool, "c")}
		e := newLoopEnv(t, budget.Policy{}, loopAgent{name: "a", policy: budget.Policy{ConsecutiveErrors: 2}, continues: true, steps: steps})
		run := e.run(t, "a")
		require.Equal(t, ledger.StopRetryBudgetExhausted, run.StopReason)
		actions := e.actions(t, run.ID)
		require.Len(t, actions, 2)
		require.Equal(t, ledger.ActionFailed, actions[0].State)
		require.Equal(t, ledger.ActionFailed, actions[1].State, "established not to have happened, with no attempt left")
		require.Equal(t, int64(5), actions[1].AttemptCount)
	})
}

func TestLoopNoProgress(t *testing.T) {
	t.Run("FiresAfterItsWindow", func(t *testing.T) {
		e := newLoopEnv(t, budget.Policy{ConsecutiveErrors: 10},
			loopAgent{name: "a", policy: budget.Policy{NoProgressWindow: 3}, continues: true, steps: failing("t", 10)})
		run := e.run(t, "a")
		require.Equal(t, ledger.RunStopped, run.State)
		require.Equal(t, ledger.StopNoProgress, run.StopReason)
		actions := e.actions(t, run.ID)
		require.Len(t, actions, 3)
		require.Equal(t, fmt.Sprintf("none of the last 3 actions succeeded: %s … %s", actions[0].ID, actions[2].ID),
			stopEvent(t, e.lb.Store, run)["rationale"])
	})

	t.Run("ASuccessInTheWindowIsProgress", func(t *testing.T) {
		steps := append(failing("a", 2), call(workingTool, "b"))
		steps = append(steps, failing("c", 10)...)
		e := newLoopEnv(t, budget.Policy{ConsecutiveErrors: 10},
			loopAgent{name: "a", policy: budget.Policy{NoProgressWindow: 4}, continues: true, steps: steps})
		run := e.run(t, "a")
		require.Equal(t, ledger.StopNoProgress, run.StopReason)
		require.Len(t, e.actions(t, run.ID), 7, "the window slid past the success: 2 failures, a success, 4 failures")
	})
}

// TestLoopPracticeCards: the shipped agent configured to continue on tool
// errors, its write refused on every call: each retry is a new action a
// person approves, and the agent's own thresholds decide which policy ends
// the run.
func TestLoopPracticeCards(t *testing.T) {
	fail := map[string]simulator.ToolConfig{simulator.CardsWriteTool: {Faults: []simulator.Fault{{Kind: simulator.FaultError}}}}
	for _, tt := range []struct {
		name    string
		policy  budget.Policy
		actions int
		want    ledger.StopReason
	}{
		// The retry is the same call: the default repeat limit of 2 refuses
		// the third proposal.
		{name: "RepeatedAction", actions: 2, want: ledger.StopRepeatedAction},
		{name: "ConsecutiveErrors", policy: budget.Policy{RepeatLimit: 10}, actions: 3, want: ledger.StopConsecutiveErrors},
		{name: "ConsecutiveErrorsOfTheAgent", policy: budget.Policy{RepeatLimit: 10, ConsecutiveErrors: 4}, actions: 4,
			want: ledger.StopConsecutiveErrors},
		{name: "NoProgress", policy: budget.Policy{RepeatLimit: 10, ConsecutiveErrors: 10, NoProgressWindow: 2}, actions: 2,
			want: ledger.StopNoProgress},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t, simulator.Config{Agent: simulator.AgentConfig{ContinueOnToolError: true, Policy: tt.policy}, Tools: fail})
			run := b.submit(t, simulator.AgentName, "k1")
			for range tt.actions {
				require.Equal(t, ledger.RunAwaitingApproval, b.advance(t, run.ID).State)
				a := b.pendingAction(t, run.ID)
				require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
			}
			got := b.advance(t, run.ID)
			require.Equal(t, tt.want, got.StopReason)
			actions, err := b.Store.FindActions(context.Background(), ledger.ActionFilter{RunID: &run.ID})
			require.NoError(t, err)
			require.Len(t, actions, tt.actions)
			for _, a := range actions {
				require.Equal(t, ledger.ActionFailed, a.State)
			}
			require.NotEmpty(t, stopEvent(t, b.Store, got)["rationale"])
			require.Zero(t, b.effectCount(t))
			b.chainOK(t, run.ID)
		})
	}
}
