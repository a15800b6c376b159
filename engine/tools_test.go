package engine_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/simulator"
)

// Config.Tools: tools the engine calls that no agent has to name yet (the
// config file's http tools) are found, listed and held to agree with the
// agents' tools of the same name.
func TestConfigTools(t *testing.T) {
	other := contracts.ToolDescriptor{SchemaVersion: "1.0", Name: "tickets.open", Version: "1", Effect: contracts.EffectWrite,
		ArgumentsSchema: json.RawMessage(`{"type":"object"}`), TimeoutMS: 1000}

	t.Run("OK", func(t *testing.T) {
		b := setupWith(t, simulator.Config{}, func(c *engine.Config) {
			c.Tools = []engine.Tool{simulator.NewTool(other, nil, simulator.ToolConfig{}), c.Agents[0].Tools[0]}
		})
		d, ok := b.engine.Tool("tickets.open")
		require.True(t, ok)
		require.Equal(t, other, d)
		var names []string
		for _, d := range b.engine.Tools() {
			names = append(names, d.Name)
		}
		require.Equal(t, []string{"cards.write", "tickets.open"}, names, "in name order")
		for _, a := range b.engine.Agents() {
			for _, d := range a.Tools {
				require.NotEqual(t, "tickets.open", d.Name, "no agent is given a tool it does not list")
			}
		}
	})

	for name, tc := range map[string]struct {
		tools func(c *engine.Config) []engine.Tool
		part  string
	}{
		"ErrClientTool": {func(*engine.Config) []engine.Tool { return []engine.Tool{engine.ClientTool(other, engine.Lease{})} },
			"a client tool is its agent's"},
		"ErrTwice": {func(*engine.Config) []engine.Tool {
			return []engine.Tool{simulator.NewTool(other, nil, simulator.ToolConfig{}), simulator.NewTool(other, nil, simulator.ToolConfig{})}
		}, "registered twice"},
		"ErrOtherDescriptor": {func(*engine.Config) []engine.Tool {
			d := simulator.CardsWriteDescriptor()
			d.Version = "2"
			return []engine.Tool{simulator.NewTool(d, nil, simulator.ToolConfig{})}
		}, "another descriptor"},
		"ErrArgumentsSchema": {func(*engine.Config) []engine.Tool {
			d := other
			d.ArgumentsSchema = json.RawMessage(`{"type":"object","pattern":"("}`)
			return []engine.Tool{simulator.NewTool(d, nil, simulator.ToolConfig{})}
		}, "tickets.open"},
	} {
		t.Run(name, func(t *testing.T) {
			b := setup(t, simulator.Config{})
			cfg := engine.Config{Store: b.Store, Approvals: b.approvals, Agents: []engine.Agent{simulator.PracticeCardsAgent(b.effects, simulator.Config{})}}
			cfg.Tools = tc.tools(&cfg)
			_, err := engine.New(cfg)
			require.ErrorContains(t, err, tc.part)
		})
	}
}
