package simulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
)

// PracticeCardsInput is the practice-cards agent's input:
// {"title": "…", "markdown": "…"}.
type PracticeCardsInput struct {
	Title    string `json:"title"`
	Markdown string `json:"markdown"`
}

// PracticeCardsModel is the deterministic model of the practice-cards agent.
// For a run with no action yet it proposes one cards.write call with the
// cards parsed from the input's Markdown; once that action has succeeded it
// answers {"cards_written": N, "title": …}; once it has failed or was
// abandoned it answers {"error": "cards.write failed", "title": …}. In the
// agent configured to continue on tool errors (AgentConfig), a failed write
// is proposed again instead, as often as the engine asks: the run's loop
// policies decide when that stops.
//
// It derives every step from the input and the history alone, so the
// arguments it proposes are byte-identical every time for the same input:
// a restarted engine re-asking the question gets the same action digest.
type PracticeCardsModel struct {
	title string
	cards []Card
	args  json.RawMessage // canonical JSON of the cards.write arguments
	usage engine.Usage
	// retryFailed proposes a failed write again instead of answering.
	retryFailed bool
}

// cardsWriteArguments are the arguments of cards.write.
type cardsWriteArguments struct {
	Title string `json:"title"`
	Cards []Card `json:"cards"`
}

// NewPracticeCardsModel returns the model for one run's input. It fits
// engine.Agent.NewModel. The input must be one JSON object with a non-empty
// title and a Markdown document that yields at least one card; unknown
// fields, duplicate keys and trailing data are refused.
func NewPracticeCardsModel(input json.RawMessage) (engine.Model, error) {
	return newPracticeCardsModel(input)
}

func newPracticeCardsModel(input json.RawMessage) (*PracticeCardsModel, error) {
	if err := ledger.CheckJSON(input); err != nil {
		return nil, fmt.Errorf("practice-cards input: %w", err)
	}
	var in PracticeCardsInput
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("practice-cards input: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("practice-cards input: unexpected data after the object")
	}
	if in.Title == "" {
		return nil, errors.New("practice-cards input: title is required")
	}
	cards, err := ParseCards(in.Markdown)
	if err != nil {
		return nil, fmt.Errorf("practice-cards input: markdown: %w", err)
	}
	args, err := ledger.CanonicalJSON(cardsWriteArguments{Title: in.Title, Cards: cards})
	if err != nil {
		return nil, fmt.Errorf("practice-cards arguments: %w", err)
	}
	return &PracticeCardsModel{
		title: in.Title,
		cards: cards,
		args:  args,
		usage: engine.Usage{
			InputTokens:  int64(len(in.Markdown)/4 + 1),
			OutputTokens: int64(10 * len(cards)),
		},
	}, nil
}

// Cards returns a copy of the cards the model proposes to write.
func (m *PracticeCardsModel) Cards() []Card { return append([]Card(nil), m.cards...) }

// Next implements engine.Model. It looks at the last history entry only:
// succeeded and failed/abandoned actions end the run as described on the
// type (a failed one is retried when so configured); any other state (the
// engine asking while the action is still undecided, or after it was
// denied, cancelled or superseded) is an error, because this model has
// nothing sensible to propose then.
//
// Every step reports the same usage: len(markdown)/4+1 input tokens and ten
// output tokens per card.
func (m *PracticeCardsModel) Next(ctx context.Context, h engine.History) (engine.Step, error) {
	if err := ctx.Err(); err != nil {
		return engine.Step{}, err
	}
	usage := m.usage
	retry := m.retryFailed && len(h.Entries) > 0 && h.Entries[len(h.Entries)-1].Action != nil &&
		h.Entries[len(h.Entries)-1].Action.State == ledger.ActionFailed
	if len(h.Entries) == 0 || retry {
		return engine.Step{
			Kind:      engine.StepToolCall,
			Tool:      CardsWriteTool,
			Arguments: append(json.RawMessage(nil), m.args...),
			Usage:     &usage,
		}, nil
	}
	last := h.Entries[len(h.Entries)-1]
	if last.Action == nil {
		return engine.Step{}, errors.New("practice-cards: history entry without an action")
	}
	var final any
	switch last.Action.State {
	case ledger.ActionSucceeded:
		final = struct {
			CardsWritten int    `json:"cards_written"`
			Title        string `json:"title"`
		}{len(m.cards), m.title}
	case ledger.ActionFailed, ledger.ActionAbandoned:
		final = struct {
			Error string `json:"error"`
			Title string `json:"title"`
		}{CardsWriteTool + " failed", m.title}
	default:
		return engine.Step{}, fmt.Errorf("practice-cards: action %s is %s: no step to propose", last.Action.ID, last.Action.State)
	}
	out, err := ledger.CanonicalJSON(final)
	if err != nil {
		return engine.Step{}, fmt.Errorf("practice-cards final: %w", err)
	}
	return engine.Step{Kind: engine.StepFinal, Final: out, Usage: &usage}, nil
}

// ScriptedModel replays a fixed script: for a history of n entries it
// returns the script's step n, and once the script is exhausted a final
// step with the answer {} and zero usage. It is for tests that need runs
// the practice-cards model never produces: a read action, repeated
// actions, a missing usage report.
type ScriptedModel struct {
	steps []engine.Step
}

// NewScriptedModel returns a model that replays steps. The steps are copied;
// a step's Usage is returned as given, so a nil Usage reports none.
func NewScriptedModel(steps ...engine.Step) engine.Model {
	return &ScriptedModel{steps: append([]engine.Step(nil), steps...)}
}

// Next implements engine.Model.
func (m *ScriptedModel) Next(ctx context.Context, h engine.History) (engine.Step, error) {
	if err := ctx.Err(); err != nil {
		return engine.Step{}, err
	}
	if n := len(h.Entries); n < len(m.steps) {
		return m.steps[n], nil
	}
	return engine.Step{Kind: engine.StepFinal, Final: json.RawMessage(`{}`), Usage: &engine.Usage{}}, nil
}
