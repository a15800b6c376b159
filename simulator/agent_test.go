package simulator_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

func TestDescriptorsAreValidContracts(t *testing.T) {
	for _, d := range []contracts.ToolDescriptor{simulator.CardsWriteDescriptor(), simulator.CardsCountDescriptor()} {
		t.Run(d.Name, func(t *testing.T) {
			data, err := json.Marshal(d)
			require.NoError(t, err)
			parsed, err := contracts.ParseToolDescriptor(data)
			require.NoError(t, err)
			require.Equal(t, d.Guarantees, parsed.Guarantees)
		})
	}
	write := simulator.CardsWriteDescriptor()
	require.Equal(t, contracts.EffectWrite, write.Effect)
	require.Equal(t, contracts.Guarantees{Query: true, Dedup: true, Cancel: true}, write.Guarantees)
	require.Equal(t, int64(5000), write.TimeoutMS)
	require.Equal(t, contracts.EffectRead, simulator.CardsCountDescriptor().Effect)

	v, err := write.ArgumentValidator()
	require.NoError(t, err)
	require.Error(t, v.Validate([]byte(`{"cards":[{"front":"q","back":"a"}]}`)), "title is required")
	require.Error(t, v.Validate([]byte(`{"title":"t","cards":[]}`)), "at least one card")
}

// TestPracticeCardsAgent drives the agent by hand the way the engine does:
// model step, tool call with a dedup key, history, final step.
func TestPracticeCardsAgent(t *testing.T) {
	ctx := context.Background()
	s := newSetup(t)
	agent := simulator.PracticeCardsAgent(s.store, simulator.Config{})
	require.Equal(t, simulator.AgentName, agent.Name)
	tools := map[string]engine.Tool{}
	for _, tool := range agent.Tools {
		tools[tool.Descriptor().Name] = tool
	}
	require.Len(t, tools, 2)

	in := sampleInput(t)
	model, err := agent.NewModel(in)
	require.NoError(t, err)
	h := engine.History{RunID: "run_1", Input: in}
	step, err := model.Next(ctx, h)
	require.NoError(t, err)
	require.Equal(t, engine.StepToolCall, step.Kind)

	key := ledger.DedupKeyFor("run_1", "act_1")
	res, err := tools[step.Tool].Execute(ctx, engine.Call{RunID: "run_1", ActionID: "act_1", Attempt: 1, DedupKey: key, Arguments: step.Arguments})
	require.NoError(t, err)
	require.Equal(t, ledger.EffectHappened, res.Effect)
	require.JSONEq(t, `{"effect_seq":1,"title":"Rust ownership and borrowing","written":5}`, string(res.Output))

	h.Entries = append(h.Entries, engine.HistoryEntry{Action: &ledger.Action{ID: "act_1", State: ledger.ActionSucceeded}})
	final, err := model.Next(ctx, h)
	require.NoError(t, err)
	require.Equal(t, engine.StepFinal, final.Kind)
	require.JSONEq(t, `{"cards_written":5,"title":"Rust ownership and borrowing"}`, string(final.Final))

	count, err := tools[simulator.CardsCountTool].Execute(ctx, engine.Call{DedupKey: "run_1/act_2", Attempt: 1,
		Arguments: json.RawMessage(`{"title":"Rust ownership and borrowing"}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"count":1,"title":"Rust ownership and borrowing"}`, string(count.Output))

	effects, err := s.store.Effects(ctx)
	require.NoError(t, err)
	require.Len(t, effects, 1)
	require.Equal(t, key, effects[0].DedupKey)
}

func TestPracticeCardsAgentRefusesUnknownTool(t *testing.T) {
	s := newSetup(t)
	require.Panics(t, func() {
		simulator.PracticeCardsAgent(s.store, simulator.Config{Tools: map[string]simulator.ToolConfig{"cards.wirte": {}}})
	})
}

func TestEffectJSON(t *testing.T) {
	e := simulator.Effect{Seq: 1, DedupKey: "run_1/act_1", Tool: "cards.write", ArgumentsDigest: "sha256:00",
		Output: json.RawMessage(`{"written":1}`), CreatedAt: newClock().Now()}
	data, err := json.Marshal(e)
	require.NoError(t, err)
	require.JSONEq(t, `{"seq":1,"dedup_key":"run_1/act_1","tool":"cards.write","arguments_digest":"sha256:00",
		"output":{"written":1},"created_at":"2025-03-01T09:00:00Z"}`, string(data))
}
