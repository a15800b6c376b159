package main

import (
	"encoding/json"
	"testing"

	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

func TestApprovalsList(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		out, _, err := env.cli(t, "bob", "approvals", "list")
		require.NoError(t, err)
		require.Equal(t, "no approvals\n", out)

		run, action := env.awaiting(t, "k1")
		out, _, err = env.cli(t, "bob", "approvals", "list")
		require.NoError(t, err)
		golden(t, "pending", out)
		require.Contains(t, out, string(action.ID))
		require.Contains(t, out, string(run))
		require.Contains(t, out, "cards.write")
		require.Contains(t, out, string(action.ActionDigest), "the digest in full")
		require.Contains(t, out, "ARGUMENTS")
		require.Contains(t, out, compactArgs(t, action)[:approvalArgumentsWidth]+"…", "the start of the arguments, on the row")
		require.Contains(t, out, "ledger actions show ACTION")

		out, _, err = env.cli(t, "bob", "approvals", "list", "--field", "action_id")
		require.NoError(t, err)
		require.Equal(t, string(action.ID)+"\n", out, "one line per approval, for a shell to capture")

		out, _, err = env.cli(t, "bob", "approvals", "list", "--json")
		require.NoError(t, err)
		var list server.ApprovalList
		require.NoError(t, json.Unmarshal([]byte(out), &list))
		require.Len(t, list.Approvals, 1)
		require.Equal(t, action.ActionDigest, list.Approvals[0].ActionDigest)
	})

	t.Run("OtherTenantSeesNothing", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		env.awaiting(t, "k1")
		out, _, err := env.cli(t, "carol", "approvals", "list")
		require.NoError(t, err)
		require.Equal(t, "no approvals\n", out)
	})

	t.Run("ErrBadToken", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := env.cli(t, "", "approvals", "list")
		requireExit(t, err, 4)
	})
}
