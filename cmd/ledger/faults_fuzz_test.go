package main

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
)

// FuzzParseFaultPlan: LEDGER_FAULT_PLAN as a decoder. An accepted plan is
// one JSON document the ledger would accept too (no duplicate key, no
// trailing data), names exactly one place to strike — a known point with a
// hit from 1, or a write from 1 with a known moment — and round-trips
// (parse, encode, parse gives the same plan); a refusal says what is wrong.
func FuzzParseFaultPlan(f *testing.F) {
	for _, s := range []string{
		`{"point": "after_tool_call"}`, `{"point": "after_attempt_recorded", "hit": 2, "action": "kill"}`,
		`{"point": "after_tool_call", "action": "store_error"}`, `{"point": "cancel_stopping"}`,
		`{"point": "after_attempt_recorded", "action": "stop"}`, `{"write": 2, "at": "after_commit", "action": "stop"}`,
		`{"action": "kill", "write": 3, "at": "before_commit"}`, `{"write": 1, "at": "after_commit"}`,
		`{"write": 1}`, `{"at": "after_commit"}`, `{"write": -1, "at": "after_commit"}`,
		`{"point": "after_tool_call", "write": 2, "at": "before_commit"}`, `{"write": 2, "at": "before_commit", "action": "store_error"}`,
		`{"point": "nowhere"}`, `{"point": "after_tool_call", "hit": -1}`, `{"point": "after_tool_call", "action": "explode"}`,
		`{"point": "after_tool_call", "when": 1}`, `{}`, `[]`, `null`, ``, `{"point":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		plan, err := parseFaultPlan(raw)
		if err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		require.NoError(t, ledger.CheckJSON(raw), "accepted a plan the ledger's JSON check refuses: %q", raw)
		if plan.Write > 0 {
			require.Empty(t, plan.Point)
			require.Zero(t, plan.Hit)
			require.Contains(t, ledger.WritePoints(), plan.At)
			require.Equal(t, "kill", plan.Action)
		} else {
			require.True(t, slices.Contains(engine.AllFaultPoints(), plan.Point), "point %q", plan.Point)
			require.Empty(t, plan.At)
			require.GreaterOrEqual(t, plan.Hit, 1)
			require.Contains(t, []string{"kill", "store_error", actionStop}, plan.Action)
		}
		b, err := json.Marshal(plan)
		require.NoError(t, err)
		back, err := parseFaultPlan(b)
		require.NoError(t, err, "plan %s encoded as %s is refused", raw, b)
		require.Equal(t, plan, back)
	})
}
