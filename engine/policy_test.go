package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// scripted runs one scripted agent over a read tool (auto-approved) and
// returns the finished run.
func scripted(t *testing.T, limits ledger.BudgetLimits, cfg simulator.ToolConfig, steps ...engine.Step) (*ledger.Run, *ledgertest.Bundle) {
	t.Helper()
	ctx := context.Background()
	lb := ledgertest.OpenStore(t)
	effects, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), lb.Clock.Now)
	require.NoError(t, err)
	t.Cleanup(func() { _ = effects.Close() })
	tool := simulator.NewTool(simulator.CardsCountDescriptor(), effects, cfg)
	agent := engine.Agent{Name: "scripted", Tools: []engine.Tool{tool},
		NewModel: func(json.RawMessage) (engine.Model, error) { return simulator.NewScriptedModel(steps...), nil }}
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(lb.Store, policy, func(string) (contracts.ToolDescriptor, bool) { return tool.Descriptor(), true }, approval.Options{})
	eng, err := engine.New(engine.Config{Store: lb.Store, Approvals: svc, Agents: []engine.Agent{agent}, Now: lb.Clock.Now})
	require.NoError(t, err)
	res, err := lb.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k", Principal: "alice",
		Agent: "scripted", Input: json.RawMessage(`{}`), Budgets: limits})
	require.NoError(t, err)
	require.NoError(t, eng.Advance(ctx, res.Run.ID))
	run, err := lb.Store.FindRunByID(ctx, res.Run.ID)
	require.NoError(t, err)
	return run, lb
}

func count(title string, usage *engine.Usage) engine.Step {
	return engine.Step{Kind: engine.StepToolCall, Tool: "cards.count", Arguments: json.RawMessage(fmt.Sprintf(`{"title":%q}`, title)), Usage: usage}
}

func TestLoopPolicies(t *testing.T) {
	some := &engine.Usage{InputTokens: 10, OutputTokens: 5}

	t.Run("max steps", func(t *testing.T) {
		run, _ := scripted(t, ledger.BudgetLimits{MaxSteps: 2}, simulator.ToolConfig{},
			count("a", some), count("b", some), count("c", some))
		require.Equal(t, ledger.RunStopped, run.State)
		require.Equal(t, ledger.StopMaxSteps, run.StopReason)
		require.Equal(t, int64(2), run.Budget.Used.Steps)
	})

	t.Run("token budget", func(t *testing.T) {
		run, _ := scripted(t, ledger.BudgetLimits{MaxTokens: 20}, simulator.ToolConfig{},
			count("a", some), count("b", some), count("c", some))
		require.Equal(t, ledger.StopTokenBudgetExceeded, run.StopReason)
		require.Equal(t, int64(30), run.Budget.Used.Tokens)
	})

	t.Run("token accounting unavailable is never zero", func(t *testing.T) {
		run, lb := scripted(t, ledger.BudgetLimits{MaxTokens: 1000}, simulator.ToolConfig{},
			count("a", nil), count("b", some))
		require.Equal(t, ledger.StopTokenBudgetExceeded, run.StopReason)
		require.True(t, run.Budget.Used.TokensUnavailable)
		events, err := lb.Store.FindEvents(context.Background(), run.ID)
		require.NoError(t, err)
		require.Contains(t, string(events[len(events)-1].Data), "accounting unavailable")
	})

	t.Run("no token budget, missing usage is recorded but does not stop", func(t *testing.T) {
		run, _ := scripted(t, ledger.BudgetLimits{}, simulator.ToolConfig{}, count("a", nil))
		require.Equal(t, ledger.RunCompleted, run.State)
		require.True(t, run.Budget.Used.TokensUnavailable)
	})

	t.Run("repeated identical action", func(t *testing.T) {
		run, _ := scripted(t, ledger.BudgetLimits{}, simulator.ToolConfig{},
			count("a", some), count("a", some), count("a", some), count("b", some))
		require.Equal(t, ledger.StopRepeatedAction, run.StopReason)
	})
}
