package simulator_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/simulator"
)

// FuzzParseConfig: LEDGER_SIMULATOR_CONFIG as a decoder. An accepted
// config is valid, round-trips (parse, encode, parse gives the same
// config) and keeps every delay it was given; a refusal says it is about
// the simulator config.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"tools": {"cards.write": {
			"guarantees": {"query": false, "dedup": true, "cancel": false},
			"dedup_retention_ms": 60000, "query_visibility_ms": 500, "timeout_ms": 100,
			"faults": [{"kind": "error", "calls": [1]}, {"kind": "slow", "delay_ms": 250},
				{"kind": "effect_then_crash", "calls": [3]}, {"kind": "query_error", "calls": [1, 2]}]}}}`,
		`{"tools": {"cards.count": {"faults": [{"kind": "timeout"}, {"kind": "error_unknown"}, {"kind": "crash_before_effect"}]}}}`,
		`{"agent": {"continue_on_tool_error": true, "policy": {"repeat_limit": 5, "consecutive_errors": 2, "no_progress_window": 4}}}`,
		`{"agent": {"policy": {"repeat_limit": -1}}}`, `{"agent": {"policy": {}}}`, `{"agent": null}`,
		`{}`, `{"tools": {}}`, `{"tools": null}`, `{"tools": {"cards.write": null}}`,
		`{"tools": {"cards.write": {"guarantees": null}}}`,
		`{"tools": {}, "chaos": true}`,
		`{"tools": {"cards.write": {"guarantees": {"query": true}}}}`,
		`{"tools": {"cards.write": {"faults": [{"kind": "slow", "delay_ms": 9223372036854775807}]}}}`,
		`{"tools": {"cards.write": {"faults": [{"kind": "error", "calls": [0]}]}}}`,
		`{"tools": {"cards.write": {"dedup_retention_ms": -1}}}`,
		`{"tools": {"cards.write": {"timeout_ms": 0}}}`,
		`{"tools": {"card.write": {}}}`,
		`{} {}`, `tools`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := simulator.ParseConfig(data)
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "simulator config: "), "error %q does not say what it is about", err)
			return
		}
		require.NoError(t, c.Validate())
		b, err := json.Marshal(c)
		require.NoError(t, err)
		back, err := simulator.ParseConfig(b)
		require.NoError(t, err, "config %s encoded as %s is refused", data, b)
		require.Equal(t, c.Agent, back.Agent, "the agent's config changed in the round trip through %s", b)
		require.Equal(t, len(c.Tools), len(back.Tools))
		for name, tc := range c.Tools {
			// An empty list is written as absent (omitempty): the same config.
			if len(tc.Faults) == 0 {
				tc.Faults = nil
			}
			for i := range tc.Faults {
				if len(tc.Faults[i].Calls) == 0 {
					tc.Faults[i].Calls = nil
				}
			}
			require.Equal(t, tc, back.Tools[name], "tool %s changed in the round trip through %s", name, b)
			for _, fl := range tc.Faults {
				require.GreaterOrEqual(t, fl.Delay, 0*fl.Delay)
			}
		}
	})
}
