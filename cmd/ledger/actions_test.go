package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

// compactArgs is an action's arguments on one line, as the server sends
// them when nothing in them is secret.
func compactArgs(t *testing.T, a *ledger.Action) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, json.Compact(&buf, a.Arguments))
	return buf.String()
}

func TestActionsShow(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "bob", "actions", "show", string(action.ID))
		require.NoError(t, err)
		golden(t, "awaiting_approval", out)
		require.Contains(t, out, "digest:    "+string(action.ActionDigest), "the full digest")
		require.Contains(t, out, "tool:      cards.write (version 1)")
		require.Contains(t, out, "effect:    write")
		require.Contains(t, out, "state:     awaiting_approval")
		var pretty bytes.Buffer
		require.NoError(t, json.Indent(&pretty, action.Arguments, "  ", "  "))
		require.Contains(t, out, "arguments:\n  "+pretty.String()+"\n", "the arguments, pretty-printed")
		require.Regexp(t, `approval  apr_\w+  pending  expires \S+  digest `+string(action.ActionDigest), out)

		// The submitter reads her own run's action too.
		_, _, err = env.cli(t, "alice", "actions", "show", string(action.ID))
		require.NoError(t, err)
	})

	t.Run("JSON", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "bob", "actions", "show", string(action.ID), "--json")
		require.NoError(t, err)
		var a server.Action
		require.NoError(t, json.Unmarshal([]byte(out), &a))
		require.Equal(t, action.ID, a.ID)
		require.Equal(t, action.ActionDigest, a.ActionDigest)
		require.JSONEq(t, string(action.Arguments), string(a.Arguments))
		require.True(t, strings.HasPrefix(out, "{\n  \""), "pretty-printed")
	})

	t.Run("Field", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "bob", "actions", "show", string(action.ID), "--field", "action_digest")
		require.NoError(t, err)
		require.Equal(t, string(action.ActionDigest)+"\n", out)
		out, _, err = env.cli(t, "bob", "actions", "show", string(action.ID), "--field", "arguments")
		require.NoError(t, err)
		require.Equal(t, compactArgs(t, action)+"\n", out, "an object prints as compact JSON")

		_, _, err = env.cli(t, "bob", "actions", "show", string(action.ID), "--field", "nope")
		requireExit(t, err, exitUsage)
		require.Contains(t, err.Error(), "it has action_digest, approvals, arguments,", "names the fields there are")
		_, _, err = env.cli(t, "bob", "actions", "show", string(action.ID), "--field", "id", "--json")
		requireExit(t, err, exitUsage)
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, action := env.awaiting(t, "k1")
		_, _, err := env.cli(t, "bob", "actions", "show", "act_01JAAAAAAAAAAAAAAAAAAAAAAA")
		requireExit(t, err, exitNotFound)
		out, _, err := env.cli(t, "carol", "actions", "show", string(action.ID))
		requireExit(t, err, exitNotFound)
		require.Empty(t, out, "another tenant's action is not found, and shows nothing")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		_, _, err := runCLI(t, nil, "actions", "show")
		requireExit(t, err, exitUsage)
		_, _, err = runCLI(t, nil, "actions", "show", "a", "b")
		requireExit(t, err, exitUsage)
	})

	// Arguments come from a model: what would hide or reorder text on the
	// approver's terminal is shown escaped, in every view of them.
	t.Run("HiddenCharacters", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		md := filepath.Join(env.dir, "tricky.md")
		require.NoError(t, os.WriteFile(md, []byte("# Tricky\n\n## Delete \u202egnihton\u202c?\n\nYes\u200b, \x1b[8mhidden\x1b[0m all of it.\n"), 0o644))
		out, _, err := env.cli(t, "alice", "submit", "--title", "Tricky", "--markdown-file", md, "--key", "k1", "--json")
		require.NoError(t, err)
		var sr server.SubmitResponse
		require.NoError(t, json.Unmarshal([]byte(out), &sr))
		env.advance(t, sr.ID)
		actions, err := env.svc.store.FindActions(t.Context(), ledger.ActionFilter{RunID: &sr.ID})
		require.NoError(t, err)
		a := actions[len(actions)-1]
		require.Contains(t, string(a.Arguments), "\u202e", "the stored arguments carry the override")

		for name, args := range map[string][]string{
			"actions show":   {"actions", "show", string(a.ID)},
			"runs show":      {"runs", "show", string(sr.ID)},
			"approvals list": {"approvals", "list"},
		} {
			t.Run(name, func(t *testing.T) {
				out, _, err := env.cli(t, "bob", args...)
				require.NoError(t, err)
				for _, r := range []string{"\u202e", "\u202c", "\u200b", "\x1b"} {
					require.NotContains(t, out, r)
				}
				require.Contains(t, out, `Yes\u200b, \u001b[8mhidden`)
				if name != "approvals list" { // the row shows the start only
					require.Contains(t, out, `Delete \u202egnihton\u202c?`)
				}
			})
		}
	})
}
