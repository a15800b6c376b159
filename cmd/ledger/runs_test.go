package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

func TestRunsList(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		out, _, err := env.cli(t, "alice", "runs", "list")
		require.NoError(t, err)
		require.Equal(t, "no runs\n", out)

		waiting, _ := env.awaiting(t, "k1")
		queued := env.submit(t, "alice", "k2")
		out, _, err = env.cli(t, "bob", "runs", "list")
		require.NoError(t, err)
		golden(t, "two", out)
		require.Contains(t, out, string(waiting))
		require.Contains(t, out, string(queued))

		out, _, err = env.cli(t, "bob", "runs", "list", "--state", "awaiting_approval")
		require.NoError(t, err)
		require.Contains(t, out, string(waiting))
		require.NotContains(t, out, string(queued))
	})

	t.Run("Pages", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		for _, k := range []string{"k1", "k2", "k3"} {
			env.submit(t, "alice", k)
		}
		seen := map[string]bool{}
		var cursor string
		for range 3 {
			args := []string{"runs", "list", "--limit", "2", "--json"}
			if cursor != "" {
				args = append(args, "--cursor", cursor)
			}
			out, _, err := env.cli(t, "alice", args...)
			require.NoError(t, err)
			var page server.RunList
			require.NoError(t, json.Unmarshal([]byte(out), &page))
			require.LessOrEqual(t, len(page.Runs), 2)
			for _, r := range page.Runs {
				require.False(t, seen[string(r.ID)], "no run twice")
				seen[string(r.ID)] = true
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		require.Len(t, seen, 3)

		out, _, err := env.cli(t, "alice", "runs", "list", "--limit", "2")
		require.NoError(t, err)
		require.Regexp(t, `\nmore: --cursor \S+\n$`, out)
	})

	t.Run("OtherTenantSeesNothing", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		env.submit(t, "alice", "k1")
		out, _, err := env.cli(t, "carol", "runs", "list", "--json")
		require.NoError(t, err)
		var page server.RunList
		require.NoError(t, json.Unmarshal([]byte(out), &page))
		require.Empty(t, page.Runs)
	})

	t.Run("ErrUsage", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := env.cli(t, "alice", "runs", "list", "--limit", "-1")
		requireExit(t, err, 2)
		_, _, err = env.cli(t, "alice", "runs", "list", "extra")
		requireExit(t, err, 2)
	})
}

func TestRunsShow(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		id, action := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "alice", "runs", "show", string(id))
		require.NoError(t, err)
		golden(t, "awaiting_approval", out)
		require.Contains(t, out, string(action.ActionDigest), "the digest in full, to copy into approve")
		var pretty bytes.Buffer
		require.NoError(t, json.Indent(&pretty, action.Arguments, "    ", "  "))
		require.Contains(t, out, "  arguments:\n    "+pretty.String()+"\n", "each action's arguments")

		out, _, err = env.cli(t, "alice", "runs", "show", string(id), "--json")
		require.NoError(t, err)
		var run server.Run
		require.NoError(t, json.Unmarshal([]byte(out), &run))
		require.Equal(t, id, run.ID)
		require.Equal(t, "awaiting_approval", string(run.State))
		require.True(t, strings.HasPrefix(out, "{\n  \""), "pretty-printed")
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := env.cli(t, "alice", "runs", "show", "run_01JAAAAAAAAAAAAAAAAAAAAAAA")
		requireExit(t, err, 5)
		require.Contains(t, err.Error(), "404 not_found: ")

		id := env.submit(t, "alice", "k1")
		_, _, err = env.cli(t, "carol", "runs", "show", string(id))
		requireExit(t, err, 5)
		require.Contains(t, err.Error(), "404 not_found: ", "another tenant's run is not found, never forbidden")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		_, _, err := runCLI(t, nil, "runs", "show")
		requireExit(t, err, 2)
		_, _, err = runCLI(t, nil, "runs", "show", "a", "b")
		requireExit(t, err, 2)
	})
}

func TestRunsTimeline(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		id, _ := env.awaiting(t, "k1")
		out, _, err := env.cli(t, "alice", "runs", "timeline", string(id))
		require.NoError(t, err)
		require.Contains(t, out, "SEQ  TIME")
		require.Contains(t, out, "queued -> running")
		require.Regexp(t, `\nchain: ok \(\d+ events\)\n$`, out)

		out, _, err = env.cli(t, "alice", "runs", "timeline", string(id), "--json")
		require.NoError(t, err)
		var tl server.Timeline
		require.NoError(t, json.Unmarshal([]byte(out), &tl))
		require.True(t, tl.Chain.OK)
		require.NotEmpty(t, tl.Events)
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := env.cli(t, "alice", "runs", "timeline", "run_01JAAAAAAAAAAAAAAAAAAAAAAA")
		requireExit(t, err, 5)
	})
}

func TestRunsShowWaitState(t *testing.T) {
	t.Parallel()
	t.Run("WaitsForTheState", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		id := env.submit(t, "alice", "k1")
		type result struct {
			out string
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, _, err := env.cli(t, "alice", "runs", "show", string(id), "--wait-state", "awaiting_approval")
			done <- result{out, err}
		}()
		env.advance(t, id) // the run reaches its approval while the CLI waits
		r := <-done
		require.NoError(t, r.err)
		require.Contains(t, r.out, "state:        awaiting_approval")
	})

	t.Run("AlreadyThere", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		id := env.submit(t, "alice", "k1")
		out, _, err := env.cli(t, "alice", "runs", "show", string(id), "--wait-state", "queued", "--field", "state")
		require.NoError(t, err)
		require.Equal(t, "queued\n", out)
	})

	t.Run("ErrEndedElsewhere", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		id, action := env.awaiting(t, "k1")
		_, _, err := env.cli(t, "bob", "deny", string(action.ID), "--digest", string(action.ActionDigest))
		require.NoError(t, err)
		env.advance(t, id)
		out, _, err := env.cli(t, "alice", "runs", "show", string(id), "--wait-state", "completed")
		requireExit(t, err, exitOther)
		require.Contains(t, err.Error(), "ended stopped (stop reason approval_denied): it will not be completed")
		require.Contains(t, out, "state:        stopped", "the run is shown as it is")
	})

	t.Run("ErrTimeout", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		id := env.submit(t, "alice", "k1")
		start := time.Now()
		out, _, err := env.cli(t, "alice", "runs", "show", string(id), "--wait-state", "completed", "--wait-timeout", "300ms", "--json")
		requireExit(t, err, exitOther)
		require.Contains(t, err.Error(), "still queued after 300ms, not completed")
		require.Less(t, time.Since(start), 10*time.Second)
		var run server.Run
		require.NoError(t, json.Unmarshal([]byte(out), &run), "the last answer is shown")
		require.Equal(t, "queued", string(run.State))
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		id := env.submit(t, "alice", "k1")
		_, _, err := env.cli(t, "carol", "runs", "show", string(id), "--wait-state", "completed")
		requireExit(t, err, exitNotFound)
	})

	t.Run("ErrUsage", func(t *testing.T) {
		for name, args := range map[string][]string{
			"unknown state":          {"--wait-state", "done"},
			"timeout without state":  {"--wait-timeout", "5s"},
			"zero timeout":           {"--wait-state", "completed", "--wait-timeout", "0s"},
			"json and field":         {"--json", "--field", "id"},
			"timeout not a duration": {"--wait-state", "completed", "--wait-timeout", "soon"},
		} {
			t.Run(name, func(t *testing.T) {
				_, _, err := runCLI(t, nil, append([]string{"runs", "show", "run_x"}, args...)...)
				requireExit(t, err, exitUsage)
			})
		}
	})
}

// TestBudgetText: runs show gives each measure of the budget with its
// limit, durations in milliseconds as the API does.
func TestBudgetText(t *testing.T) {
	t.Parallel()
	t.Run("NoLimits", func(t *testing.T) {
		require.Equal(t, "attempts 0; execution 0ms; steps 1; tokens 383",
			budgetText(server.Budget{Used: server.BudgetUsage{Steps: 1, Tokens: 383}}))
	})
	t.Run("Limits", func(t *testing.T) {
		b := server.Budget{
			Limits: server.BudgetLimits{MaxAttemptsPerAction: 2, MaxAttemptsPerRun: 5, MaxExecutionMS: 60000, MaxSteps: 20, MaxTokens: 5000},
			Used:   server.BudgetUsage{Attempts: 1, ExecutionMS: 1500, Steps: 3, Tokens: 900, TokensUnavailable: true},
		}
		require.Equal(t, "attempts 1 of 5 (at most 2 per action); execution 1500ms of 60000ms; steps 3 of 20; "+
			"tokens at least 900 of 5000 (a step reported no usage)", budgetText(b))
	})
}
