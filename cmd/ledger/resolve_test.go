package main

import (
	"encoding/json"
	"testing"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// reviewEnv is an env whose cards.write times out and can neither be
// queried, nor dedup, nor cancel: an approved run ends in needs_review with
// its effect unknown.
func reviewEnv(t *testing.T) (*apiEnv, string, string) {
	t.Helper()
	timeout := int64(20)
	env := newAPIEnv(t, envOptions{simulator: simulator.Config{Tools: map[string]simulator.ToolConfig{
		simulator.CardsWriteTool: {Guarantees: &contracts.Guarantees{}, TimeoutMS: &timeout, Faults: []simulator.Fault{{Kind: simulator.FaultTimeout}}}}}})
	run, action := env.awaiting(t, "k1")
	_, _, err := env.cli(t, "bob", "approve", string(action.ID), "--digest", string(action.ActionDigest))
	require.NoError(t, err)
	env.advance(t, run)
	out, _, err := env.cli(t, "bob", "runs", "show", string(run))
	require.NoError(t, err)
	require.Regexp(t, `state:\s+needs_review\n`, out)
	return env, string(run), string(action.ID)
}

func TestResolve(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env, run, action := reviewEnv(t)
		out, _, err := env.cli(t, "bob", "resolve", action, "--outcome", "not_happened", "--note", "no deck in the tool's list")
		require.NoError(t, err)
		require.Contains(t, out, "resolved "+action+" (cards.write) of run "+run+" as not_happened: action failed")
	})

	t.Run("JSON", func(t *testing.T) {
		env, _, action := reviewEnv(t)
		out, _, err := env.cli(t, "bob", "resolve", action, "--outcome", "happened", "--json")
		require.NoError(t, err)
		var a server.Action
		require.NoError(t, json.Unmarshal([]byte(out), &a))
		require.Equal(t, "succeeded", string(a.State))
	})

	t.Run("ErrNotInReview", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		_, _, err := env.cli(t, "bob", "resolve", string(action.ID), "--outcome", "abandon")
		requireExit(t, err, 6)
		require.Contains(t, err.Error(), "409 conflict: ")
	})

	t.Run("ErrNotAnApprover", func(t *testing.T) {
		env, _, action := reviewEnv(t)
		_, _, err := env.cli(t, "alice", "resolve", action, "--outcome", "abandon")
		requireExit(t, err, 4)
	})

	t.Run("ErrUsage", func(t *testing.T) {
		_, _, err := runCLI(t, nil, "resolve", "act_01JAAAAAAAAAAAAAAAAAAAAAAA")
		requireExit(t, err, 2)
		require.Contains(t, err.Error(), "--outcome is required")
		_, _, err = runCLI(t, nil, "resolve", "act_01JAAAAAAAAAAAAAAAAAAAAAAA", "--outcome", "maybe")
		requireExit(t, err, 2)
	})
}
