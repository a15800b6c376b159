package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

func TestApprove(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		run, action := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "bob", "approve", string(action.ID), "--digest", string(action.ActionDigest), "--reason", "cards look right")
		require.NoError(t, err)
		golden(t, "approved", out)
		require.Contains(t, out, "approved "+string(action.ID)+" (cards.write) of run "+string(run))

		env.advance(t, run)
		got, err := env.svc.store.FindRunByID(context.Background(), run)
		require.NoError(t, err)
		require.Equal(t, ledger.RunCompleted, got.State)
		effects, err := env.svc.effects.Effects(context.Background())
		require.NoError(t, err)
		require.Len(t, effects, 1)
	})

	t.Run("JSON", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "bob", "approve", string(action.ID), "--digest", string(action.ActionDigest), "--json")
		require.NoError(t, err)
		var dr server.DecisionResponse
		require.NoError(t, json.Unmarshal([]byte(out), &dr))
		require.Equal(t, ledger.ApprovalGranted, dr.Approval.State)
		require.Equal(t, "bob", dr.Approval.DecidedBy)
	})

	t.Run("ErrStaleDigest", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		stale := "sha256:" + string(make64('0'))
		_, _, err := env.cli(t, "bob", "approve", string(action.ID), "--digest", stale)
		requireExit(t, err, 6)
		require.Contains(t, err.Error(), "409 conflict: ")
	})

	t.Run("ErrDecidedTwice", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		_, _, err := env.cli(t, "bob", "approve", string(action.ID), "--digest", string(action.ActionDigest))
		require.NoError(t, err)
		_, _, err = env.cli(t, "bob", "deny", string(action.ID), "--digest", string(action.ActionDigest))
		requireExit(t, err, 6)
	})

	t.Run("ErrSelfApproval", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		_, _, err := env.cli(t, "alice", "approve", string(action.ID), "--digest", string(action.ActionDigest))
		requireExit(t, err, 4)
		require.Contains(t, err.Error(), "403 forbidden: ")
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		_, _, err := env.cli(t, "carol", "approve", string(action.ID), "--digest", string(action.ActionDigest))
		requireExit(t, err, 5)
		_, _, err = env.cli(t, "bob", "approve", "act_01JAAAAAAAAAAAAAAAAAAAAAAA", "--digest", string(action.ActionDigest))
		requireExit(t, err, 5)
	})

	t.Run("ErrUsage", func(t *testing.T) {
		_, _, err := runCLI(t, nil, "approve", "act_01JAAAAAAAAAAAAAAAAAAAAAAA")
		requireExit(t, err, 2)
		require.Contains(t, err.Error(), "--digest is required")
		_, _, err = runCLI(t, nil, "approve", "--digest", "sha256:00")
		requireExit(t, err, 2)
	})
}

func TestDeny(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		run, action := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "bob", "deny", string(action.ID), "--digest", string(action.ActionDigest), "--reason", "wrong deck")
		require.NoError(t, err)
		require.Contains(t, out, "denied "+string(action.ID))
		require.Contains(t, out, `by bob: "wrong deck"`)

		env.advance(t, run)
		out, _, err = env.cli(t, "alice", "runs", "show", string(run))
		require.NoError(t, err)
		require.Regexp(t, `state:\s+stopped\nstop reason:\s+approval_denied\n`, out)
		effects, err := env.svc.effects.Effects(context.Background())
		require.NoError(t, err)
		require.Empty(t, effects)
	})

	t.Run("ErrUsage", func(t *testing.T) {
		_, _, err := runCLI(t, nil, "deny", "act_01JAAAAAAAAAAAAAAAAAAAAAAA")
		requireExit(t, err, 2)
	})
}

func make64(c byte) []byte {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return b
}
