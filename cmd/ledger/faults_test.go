package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFaultEnvironment: a process reads its fault plan and simulator
// settings from its environment, and refuses any it cannot read exactly
// as written, rather than running another plan than the one meant.
func TestFaultEnvironment(t *testing.T) {
	worker := func(t *testing.T) error {
		_, _, err := runCLI(t, nil, "worker", "--db", filepath.Join(t.TempDir(), "ledger.db"), "--until-idle")
		return err
	}
	for name, plan := range map[string]string{
		"PointPlan":      `{"point": "after_tool_call"}`,
		"StoreErrorPlan": `{"point": "after_tool_call", "hit": 2, "action": "store_error"}`,
		"WritePlan":      `{"action": "kill", "write": 1000000, "at": "before_commit"}`,
		"StopPlan":       `{"point": "after_attempt_recorded", "action": "stop"}`,
	} {
		t.Run("OK"+name, func(t *testing.T) {
			t.Setenv(envFaultPlan, plan)
			require.NoError(t, worker(t), "an idle worker never reaches the plan's point")
		})
	}
	for name, tc := range map[string]struct{ env, value, want string }{
		// The first value decided; the rest was silently ignored.
		"PlanTrailingData": {envFaultPlan, `{"point": "after_tool_call"} {"point": "awaiting_approval"}`, "unexpected data after the top-level value"},
		// The last value decided.
		"PlanDuplicateKey": {envFaultPlan, `{"point": "awaiting_approval", "point": "after_tool_call"}`, `duplicate key "point"`},
		"PlanBothKinds":    {envFaultPlan, `{"point": "after_tool_call", "write": 2, "at": "before_commit"}`, "not both"},
		"PlanWriteNoAt":    {envFaultPlan, `{"write": 2}`, "unknown at"},
		"PlanAtNoWrite":    {envFaultPlan, `{"at": "after_commit"}`, `"at" needs "write"`},
		"PlanWriteAction":  {envFaultPlan, `{"write": 2, "at": "after_commit", "action": "store_error"}`, "unknown action"},
		"PlanNegativeHit":  {envFaultPlan, `{"point": "after_tool_call", "hit": -1}`, "counted from 1"},
		"PlanStopAtWrite":  {envFaultPlan, `{"write": 2, "at": "after_commit", "action": "stop"}`, "unknown action"},
		// 18446744073710 ms is 2^64 ns and a bit: as a time.Duration it
		// wrapped around to a slow fault of 448µs.
		"SimulatorDelayWraps": {envSimulatorConfig, `{"tools": {"cards.write": {"faults": [{"kind": "slow", "delay_ms": 18446744073710}]}}}`, "delay_ms 18446744073710 is more than"},
	} {
		t.Run("Err"+name, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			err := worker(t)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.env)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}
