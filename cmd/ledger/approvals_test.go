package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

func TestApprovalsList(t *testing.T) {
	t.Parallel()
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

	t.Run("Pages", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		want := map[string]bool{}
		for _, k := range []string{"k1", "k2", "k3"} {
			_, a := env.awaiting(t, k)
			want[string(a.ID)] = true
		}
		seen := map[string]bool{}
		var cursor string
		for range 3 {
			args := []string{"approvals", "list", "--limit", "2", "--json"}
			if cursor != "" {
				args = append(args, "--cursor", cursor)
			}
			out, _, err := env.cli(t, "bob", args...)
			require.NoError(t, err)
			var page server.ApprovalList
			require.NoError(t, json.Unmarshal([]byte(out), &page))
			require.LessOrEqual(t, len(page.Approvals), 2)
			for _, ap := range page.Approvals {
				require.False(t, seen[string(ap.ActionID)], "no approval twice")
				seen[string(ap.ActionID)] = true
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		require.Equal(t, want, seen)

		out, _, err := env.cli(t, "bob", "approvals", "list", "--limit", "2")
		require.NoError(t, err)
		require.Regexp(t, `\nmore: --cursor apr_\S+\n$`, out, "the table says where the next page starts")
		last := out[strings.LastIndex(out, "apr_"):]
		out, _, err = env.cli(t, "bob", "approvals", "list", "--cursor", strings.TrimSpace(last))
		require.NoError(t, err)
		require.NotContains(t, out, "more:", "the last page")
		require.Equal(t, 1, strings.Count(out, "\nact_"), "one row: the third approval")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := env.cli(t, "bob", "approvals", "list", "--limit", "-1")
		requireExit(t, err, 2)
		_, _, err = env.cli(t, "bob", "approvals", "list", "--limit", "500")
		requireExit(t, err, 2) // the server's 400
		_, _, err = env.cli(t, "bob", "approvals", "list", "--cursor", "garbage")
		requireExit(t, err, 2)
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
