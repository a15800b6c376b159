package simulator_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/simulator"
)

func TestParseConfig(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		c, err := simulator.ParseConfig([]byte(`{"tools": {"cards.write": {
			"guarantees": {"query": false, "dedup": true, "cancel": false},
			"dedup_retention_ms": 60000, "query_visibility_ms": 500,
			"faults": [{"kind": "error", "calls": [1]}, {"kind": "slow", "delay_ms": 250},
				{"kind": "effect_then_crash", "calls": [3]}]}}}`))
		require.NoError(t, err)
		tc := c.Tools[simulator.CardsWriteTool]
		require.Equal(t, &contracts.Guarantees{Dedup: true}, tc.Guarantees)
		require.Equal(t, int64(60000), *tc.DedupRetentionMS)
		require.Equal(t, int64(500), *tc.QueryVisibilityMS)
		require.Equal(t, []simulator.Fault{
			{Kind: simulator.FaultError, Calls: []int{1}},
			{Kind: simulator.FaultSlow, Delay: 250 * time.Millisecond},
			{Kind: simulator.FaultEffectThenCrash, Calls: []int{3}},
		}, tc.Faults)

		// The overrides reach the tool's descriptor.
		s := newSetup(t)
		agent := simulator.PracticeCardsAgent(s.store, c)
		d := agent.Tools[0].Descriptor()
		require.Equal(t, contracts.Guarantees{Dedup: true}, d.Guarantees)
		require.Equal(t, time.Minute, d.DedupRetention())
		require.Equal(t, 500*time.Millisecond, d.QueryVisibility())
		// The package's descriptor is untouched.
		require.Equal(t, contracts.Guarantees{Query: true, Dedup: true, Cancel: true}, simulator.CardsWriteDescriptor().Guarantees)
	})

	t.Run("RoundTrip", func(t *testing.T) {
		in := simulator.Config{Tools: map[string]simulator.ToolConfig{
			simulator.CardsWriteTool: {
				Guarantees: &contracts.Guarantees{Query: true},
				Faults:     []simulator.Fault{{Kind: simulator.FaultSlow, Calls: []int{2}, Delay: time.Second}},
			},
		}}
		data, err := json.Marshal(in)
		require.NoError(t, err)
		out, err := simulator.ParseConfig(data)
		require.NoError(t, err)
		require.Equal(t, in.Tools, out.Tools)
	})

	t.Run("Empty", func(t *testing.T) {
		c, err := simulator.ParseConfig([]byte(`{}`))
		require.NoError(t, err)
		require.Empty(t, c.Tools)
		require.Equal(t, simulator.AgentConfig{}, c.Agent)
	})

	t.Run("Agent", func(t *testing.T) {
		c, err := simulator.ParseConfig([]byte(`{"agent": {"continue_on_tool_error": true,
			"policy": {"repeat_limit": 5, "consecutive_errors": 2, "no_progress_window": 7}},
			"tools": {"cards.write": {"faults": [{"kind": "error"}]}}}`))
		require.NoError(t, err)
		want := simulator.AgentConfig{ContinueOnToolError: true,
			Policy: budget.Policy{RepeatLimit: 5, ConsecutiveErrors: 2, NoProgressWindow: 7}}
		require.Equal(t, want, c.Agent)

		// It reaches the agent the engine registers.
		agent := simulator.PracticeCardsAgent(newSetup(t).store, c)
		require.True(t, agent.ContinueOnToolError)
		require.Equal(t, want.Policy, agent.Policy)
		plain := simulator.PracticeCardsAgent(newSetup(t).store, simulator.Config{})
		require.False(t, plain.ContinueOnToolError)
		require.Equal(t, budget.Policy{}, plain.Policy, "the engine's thresholds, unless the config sets some")

		data, err := json.Marshal(c)
		require.NoError(t, err)
		back, err := simulator.ParseConfig(data)
		require.NoError(t, err)
		require.Equal(t, c.Agent, back.Agent)
		data, err = json.Marshal(simulator.Config{})
		require.NoError(t, err)
		require.JSONEq(t, `{}`, string(data), "the zero agent config is absent")
	})

	for name, data := range map[string]string{
		"UnknownTopField":       `{"tools": {}, "chaos": true}`,
		"UnknownToolField":      `{"tools": {"cards.write": {"fautls": []}}}`,
		"UnknownFaultField":     `{"tools": {"cards.write": {"faults": [{"kind": "error", "when": 1}]}}}`,
		"UnknownGuaranteeField": `{"tools": {"cards.write": {"guarantees": {"query": true, "dedup": true, "cancel": true, "undo": true}}}}`,
		"UnknownKind":           `{"tools": {"cards.write": {"faults": [{"kind": "meteor"}]}}}`,
		"UnknownTool":           `{"tools": {"card.write": {}}}`,
		"PartialGuarantees":     `{"tools": {"cards.write": {"guarantees": {"query": true}}}}`,
		"CallZero":              `{"tools": {"cards.write": {"faults": [{"kind": "error", "calls": [0]}]}}}`,
		"SlowWithoutDelay":      `{"tools": {"cards.write": {"faults": [{"kind": "slow"}]}}}`,
		"NegativeRetention":     `{"tools": {"cards.write": {"dedup_retention_ms": -1}}}`,
		"NegativeVisibility":    `{"tools": {"cards.write": {"query_visibility_ms": -1}}}`,
		"UnknownAgentField":     `{"agent": {"continue_on_error": true}}`,
		"UnknownPolicyField":    `{"agent": {"policy": {"max_errors": 2}}}`,
		"NegativeRepeatLimit":   `{"agent": {"policy": {"repeat_limit": -1}}}`,
		"NegativeErrors":        `{"agent": {"policy": {"consecutive_errors": -2}}}`,
		"NegativeWindow":        `{"agent": {"policy": {"no_progress_window": -3}}}`,
		"TrailingData":          `{} {}`,
		"NotJSON":               `tools`,
	} {
		t.Run("Err"+name, func(t *testing.T) {
			_, err := simulator.ParseConfig([]byte(data))
			require.Error(t, err)
		})
	}
}
