package simulator

import (
	"encoding/json"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
)

// Names of the built-in agent and its tools.
const (
	// AgentName is the name the submit body uses: {"agent": "practice-cards"}.
	AgentName = "practice-cards"
	// CardsWriteTool writes practice cards: the agent's one write.
	CardsWriteTool = "cards.write"
	// CardsCountTool counts the cards effects written under a title.
	CardsCountTool = "cards.count"
)

// cardsWriteSchema is the arguments schema of cards.write.
const cardsWriteSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["title", "cards"],
  "properties": {
    "title": {"type": "string", "minLength": 1},
    "cards": {
      "type": "array",
      "minItems": 1,
      "items": {
        "type": "object",
        "additionalProperties": false,
        "required": ["front", "back"],
        "properties": {
          "front": {"type": "string", "minLength": 1},
          "back": {"type": "string", "minLength": 1}
        }
      }
    }
  }
}`

// cardsCountSchema is the arguments schema of cards.count.
const cardsCountSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["title"],
  "properties": {
    "title": {"type": "string", "minLength": 1}
  }
}`

// CardsWriteDescriptor describes cards.write: a write that stores a deck of
// practice cards under a title. It declares every guarantee (query, dedup
// and cancel), a 5 s timeout, dedup keys honoured for 24 hours and no query
// visibility delay; a Config overrides any of these.
func CardsWriteDescriptor() contracts.ToolDescriptor {
	return contracts.ToolDescriptor{
		SchemaVersion:    contracts.DefaultVersion,
		Name:             CardsWriteTool,
		Version:          "1",
		Effect:           contracts.EffectWrite,
		ArgumentsSchema:  json.RawMessage(cardsWriteSchema),
		Guarantees:       contracts.Guarantees{Query: true, Dedup: true, Cancel: true},
		TimeoutMS:        5000,
		DedupRetentionMS: 24 * 60 * 60 * 1000,
		Description:      "Stores a deck of practice cards in the simulator's side-effect store.",
	}
}

// CardsCountDescriptor describes cards.count: a read that answers how many
// cards.write effects exist for a title ({"count": N, "title": …}). A read
// changes nothing, so running it again is always safe (dedup) and a query
// truthfully answers not_happened; it cannot be cancelled.
func CardsCountDescriptor() contracts.ToolDescriptor {
	return contracts.ToolDescriptor{
		SchemaVersion:   contracts.DefaultVersion,
		Name:            CardsCountTool,
		Version:         "1",
		Effect:          contracts.EffectRead,
		ArgumentsSchema: json.RawMessage(cardsCountSchema),
		Guarantees:      contracts.Guarantees{Query: true, Dedup: true, Cancel: false},
		TimeoutMS:       2000,
		Description:     "Counts the decks written under a title in the simulator's side-effect store.",
	}
}

// PracticeCardsAgent returns the practice-cards agent: NewPracticeCardsModel
// with the tools cards.write and cards.count, both keeping their effects in
// store and configured by cfg, and cfg.Agent's loop policy. With
// cfg.Agent.ContinueOnToolError the engine reports a failed write to the
// model, and the model retries it. A cfg that fails Validate panics, as
// NewTool does; configs from files come through ParseConfig.
func PracticeCardsAgent(store *EffectStore, cfg Config) engine.Agent {
	if err := cfg.Validate(); err != nil {
		panic(err.Error())
	}
	newModel := NewPracticeCardsModel
	if cfg.Agent.ContinueOnToolError {
		newModel = func(input json.RawMessage) (engine.Model, error) {
			m, err := newPracticeCardsModel(input)
			if err != nil {
				return nil, err
			}
			m.retryFailed = true
			return m, nil
		}
	}
	return engine.Agent{
		Name:     AgentName,
		NewModel: newModel,
		Tools: []engine.Tool{
			NewTool(CardsWriteDescriptor(), store, cfg.toolConfig(CardsWriteTool)),
			NewTool(CardsCountDescriptor(), store, cfg.toolConfig(CardsCountTool)),
		},
		Policy:              cfg.Agent.Policy,
		ContinueOnToolError: cfg.Agent.ContinueOnToolError,
	}
}
