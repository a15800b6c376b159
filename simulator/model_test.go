package simulator_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

func sampleInput(t *testing.T) json.RawMessage {
	t.Helper()
	title, md := simulator.SampleDocument()
	in, err := json.Marshal(simulator.PracticeCardsInput{Title: title, Markdown: md})
	require.NoError(t, err)
	return in
}

func entry(state ledger.ActionState) engine.HistoryEntry {
	return engine.HistoryEntry{Action: &ledger.Action{ID: "act_1", Tool: simulator.CardsWriteTool, State: state}}
}

func TestPracticeCardsModel(t *testing.T) {
	ctx := context.Background()
	in := sampleInput(t)
	_, md := simulator.SampleDocument()

	setup := func(t *testing.T) engine.Model {
		m, err := simulator.NewPracticeCardsModel(in)
		require.NoError(t, err)
		return m
	}
	wantUsage := &engine.Usage{InputTokens: int64(len(md)/4 + 1), OutputTokens: 50}

	t.Run("ToolCall", func(t *testing.T) {
		step, err := setup(t).Next(ctx, engine.History{Input: in})
		require.NoError(t, err)
		require.Equal(t, engine.StepToolCall, step.Kind)
		require.Equal(t, simulator.CardsWriteTool, step.Tool)
		require.Equal(t, wantUsage, step.Usage)

		var args struct {
			Title string           `json:"title"`
			Cards []simulator.Card `json:"cards"`
		}
		require.NoError(t, json.Unmarshal(step.Arguments, &args))
		require.Equal(t, "Rust ownership and borrowing", args.Title)
		require.Len(t, args.Cards, 5)

		// The arguments satisfy the tool's own schema.
		desc := simulator.CardsWriteDescriptor()
		v, err := desc.ArgumentValidator()
		require.NoError(t, err)
		require.NoError(t, v.Validate(step.Arguments))
	})

	t.Run("ByteIdenticalAcrossInstances", func(t *testing.T) {
		a, err := setup(t).Next(ctx, engine.History{Input: in})
		require.NoError(t, err)
		b, err := setup(t).Next(ctx, engine.History{Input: in})
		require.NoError(t, err)
		require.Equal(t, string(a.Arguments), string(b.Arguments))
		canonical, err := ledger.Canonicalize(a.Arguments)
		require.NoError(t, err)
		require.Equal(t, string(canonical), string(a.Arguments))
	})

	t.Run("FinalAfterSuccess", func(t *testing.T) {
		step, err := setup(t).Next(ctx, engine.History{Input: in, Entries: []engine.HistoryEntry{entry(ledger.ActionSucceeded)}})
		require.NoError(t, err)
		require.Equal(t, engine.StepFinal, step.Kind)
		require.JSONEq(t, `{"cards_written":5,"title":"Rust ownership and borrowing"}`, string(step.Final))
		require.Equal(t, wantUsage, step.Usage)
	})

	for _, state := range []ledger.ActionState{ledger.ActionFailed, ledger.ActionAbandoned} {
		t.Run("FinalAfter_"+string(state), func(t *testing.T) {
			step, err := setup(t).Next(ctx, engine.History{Input: in, Entries: []engine.HistoryEntry{entry(state)}})
			require.NoError(t, err)
			require.Equal(t, engine.StepFinal, step.Kind)
			require.JSONEq(t, `{"error":"cards.write failed","title":"Rust ownership and borrowing"}`, string(step.Final))
		})
	}

	t.Run("ErrUndecidedAction", func(t *testing.T) {
		_, err := setup(t).Next(ctx, engine.History{Input: in, Entries: []engine.HistoryEntry{entry(ledger.ActionRunning)}})
		require.Error(t, err)
	})
}

// TestPracticeCardsModelRetries: the agent configured to continue on tool
// errors proposes a failed write again, byte for byte, after each failure;
// it still answers after a success and gives up after an abandoned write.
func TestPracticeCardsModelRetries(t *testing.T) {
	ctx := context.Background()
	in := sampleInput(t)
	agent := simulator.PracticeCardsAgent(newSetup(t).store, simulator.Config{Agent: simulator.AgentConfig{ContinueOnToolError: true}})
	model, err := agent.NewModel(in)
	require.NoError(t, err)
	first, err := model.Next(ctx, engine.History{Input: in})
	require.NoError(t, err)

	h := engine.History{Input: in}
	for range 3 {
		h.Entries = append(h.Entries, entry(ledger.ActionFailed))
		step, err := model.Next(ctx, h)
		require.NoError(t, err)
		require.Equal(t, engine.StepToolCall, step.Kind)
		require.Equal(t, simulator.CardsWriteTool, step.Tool)
		require.Equal(t, string(first.Arguments), string(step.Arguments), "the same call again")
		require.Equal(t, first.Usage, step.Usage)
	}

	step, err := model.Next(ctx, engine.History{Input: in, Entries: append(h.Entries, entry(ledger.ActionSucceeded))})
	require.NoError(t, err)
	require.Equal(t, engine.StepFinal, step.Kind)
	require.JSONEq(t, `{"cards_written":5,"title":"Rust ownership and borrowing"}`, string(step.Final))

	step, err = model.Next(ctx, engine.History{Input: in, Entries: append(h.Entries, entry(ledger.ActionAbandoned))})
	require.NoError(t, err)
	require.Equal(t, engine.StepFinal, step.Kind)
	require.JSONEq(t, `{"error":"cards.write failed","title":"Rust ownership and borrowing"}`, string(step.Final))

	_, err = agent.NewModel(json.RawMessage(`{"title":""}`))
	require.Error(t, err, "the input is checked as without retries")
}

func TestNewPracticeCardsModelErrors(t *testing.T) {
	for name, in := range map[string]string{
		"UnknownField":  `{"title":"t","markdown":"## Q\nA","extra":1}`,
		"DuplicateKey":  `{"title":"t","title":"u","markdown":"## Q\nA"}`,
		"NoTitle":       `{"markdown":"## Q\nA"}`,
		"NoCards":       `{"title":"t","markdown":"no headings"}`,
		"NotAnObject":   `["title"]`,
		"TrailingData":  `{"title":"t","markdown":"## Q\nA"} {}`,
		"InvalidJSON":   `{"title":`,
		"WrongTypeName": `{"title":1,"markdown":"## Q\nA"}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := simulator.NewPracticeCardsModel(json.RawMessage(in))
			require.Error(t, err)
		})
	}
}

func TestScriptedModel(t *testing.T) {
	ctx := context.Background()
	read := engine.Step{Kind: engine.StepToolCall, Tool: simulator.CardsCountTool, Arguments: json.RawMessage(`{"title":"t"}`)}
	write := engine.Step{Kind: engine.StepToolCall, Tool: simulator.CardsWriteTool, Arguments: json.RawMessage(cardsArgs),
		Usage: &engine.Usage{InputTokens: 1, OutputTokens: 2}}
	m := simulator.NewScriptedModel(read, write, write)

	var h engine.History
	for i, want := range []engine.Step{read, write, write} {
		got, err := m.Next(ctx, h)
		require.NoError(t, err)
		require.Equal(t, want, got, "step %d", i)
		h.Entries = append(h.Entries, entry(ledger.ActionSucceeded))
	}
	got, err := m.Next(ctx, h)
	require.NoError(t, err)
	require.Equal(t, engine.StepFinal, got.Kind)
	require.JSONEq(t, `{}`, string(got.Final))
	require.NotNil(t, got.Usage)
}
