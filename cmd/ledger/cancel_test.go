package main

import (
	"encoding/json"
	"testing"

	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

func TestCancel(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		run, _ := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "alice", "cancel", string(run), "--reason", "changed my mind")
		require.NoError(t, err)
		require.Contains(t, out, "cancellation of run "+string(run)+": ")
		require.Contains(t, out, `requested by alice at `)
		require.Contains(t, out, `: "changed my mind"`)

		env.advance(t, run)
		out, _, err = env.cli(t, "alice", "runs", "show", string(run), "--json")
		require.NoError(t, err)
		var got server.Run
		require.NoError(t, json.Unmarshal([]byte(out), &got))
		require.Equal(t, "stopped", string(got.State))
		require.Equal(t, "user_cancelled", string(got.StopReason))
		require.NotNil(t, got.Cancellation)
	})

	t.Run("JSON", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		run := env.submit(t, "alice", "k1")
		out, _, err := env.cli(t, "alice", "cancel", string(run), "--json")
		require.NoError(t, err)
		var c server.Cancellation
		require.NoError(t, json.Unmarshal([]byte(out), &c))
		require.Equal(t, "alice", c.RequestedBy)
	})

	t.Run("ErrFinishedRun", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		run, action := env.awaiting(t, "k1")
		_, _, err := env.cli(t, "bob", "deny", string(action.ID), "--digest", string(action.ActionDigest))
		require.NoError(t, err)
		env.advance(t, run)
		_, _, err = env.cli(t, "alice", "cancel", string(run))
		requireExit(t, err, 6)
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		run := env.submit(t, "alice", "k1")
		_, _, err := env.cli(t, "carol", "cancel", string(run))
		requireExit(t, err, 5)
	})

	t.Run("ErrUsage", func(t *testing.T) {
		_, _, err := runCLI(t, nil, "cancel")
		requireExit(t, err, 2)
	})
}
