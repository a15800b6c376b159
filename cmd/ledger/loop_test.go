package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// TestSubmitLoopPolicy: practice-cards configured as LEDGER_SIMULATOR_CONFIG
// would configure it — its failed writes reported back to the model, which
// retries them, and a threshold of its own — with a write that fails on
// every call. Submitted and approved through the CLI, the run stops with
// consecutive_errors after exactly two failed actions, and its timeline
// says why.
func TestSubmitLoopPolicy(t *testing.T) {
	t.Parallel()
	sim, err := simulator.ParseConfig([]byte(`{
		"agent": {"continue_on_tool_error": true, "policy": {"repeat_limit": 10, "consecutive_errors": 2}},
		"tools": {"cards.write": {"faults": [{"kind": "error"}]}}}`))
	require.NoError(t, err)
	env := newAPIEnv(t, envOptions{simulator: sim})
	id := env.submit(t, "alice", "k-loop")
	ctx := context.Background()

	var actions []ledger.ActionID
	for range 2 {
		env.advance(t, id)
		out, _, err := env.cli(t, "bob", "approvals", "list", "--json")
		require.NoError(t, err)
		var list server.ApprovalList
		require.NoError(t, json.Unmarshal([]byte(out), &list))
		require.Len(t, list.Approvals, 1, "each retry is a new write, approved by a person")
		a := list.Approvals[0]
		_, _, err = env.cli(t, "bob", "approve", string(a.ActionID), "--digest", string(a.ActionDigest))
		require.NoError(t, err)
		actions = append(actions, a.ActionID)
	}
	env.advance(t, id)

	out, _, err := env.cli(t, "alice", "runs", "show", string(id), "--field", "stop_reason")
	require.NoError(t, err)
	require.Equal(t, "consecutive_errors\n", out)
	for _, a := range actions {
		got, err := env.svc.store.FindActionByID(ctx, a)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionFailed, got.State)
	}
	all, err := env.svc.store.FindActions(ctx, ledger.ActionFilter{RunID: &id})
	require.NoError(t, err)
	require.Len(t, all, 2, "the third proposal was refused before it was recorded")

	out, _, err = env.cli(t, "alice", "runs", "timeline", string(id), "--json")
	require.NoError(t, err)
	var tl server.Timeline
	require.NoError(t, json.Unmarshal([]byte(out), &tl))
	require.True(t, tl.Chain.OK)
	last := tl.Events[len(tl.Events)-1]
	require.Equal(t, "stopped", last.ToState)
	require.Contains(t, string(last.Data), "the last 2 actions all failed (limit 2): "+string(actions[0])+", "+string(actions[1]))

	effects, err := env.svc.effects.Effects(ctx)
	require.NoError(t, err)
	require.Empty(t, effects)

	out, _, err = env.cli(t, "alice", "runs", "show", string(id))
	require.NoError(t, err)
	require.Contains(t, out, "consecutive_errors")
}
