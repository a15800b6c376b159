package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

func TestSubmit(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		out, _, err := env.cli(t, "alice", "submit", "--title", "Sample", "--markdown-file", env.sample(t))
		require.NoError(t, err)
		golden(t, "new", out)
		key := regexp.MustCompile(`--key (cli-\S+)`).FindStringSubmatch(out)
		require.Len(t, key, 2, "a generated key is printed for replay")
		id := regexp.MustCompile(`run:\s+(run_\S+)`).FindStringSubmatch(out)[1]

		// Replaying with the printed key is the same run.
		again, _, err := env.cli(t, "alice", "submit", "--title", "Sample", "--markdown-file", env.sample(t), "--key", key[1])
		require.NoError(t, err)
		require.Contains(t, again, "run:             "+id)
		require.Contains(t, again, "replayed:        true")
		require.NotContains(t, again, "To resubmit safely", "the key was given")
	})

	t.Run("JSON", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		out, errOut, err := env.cli(t, "alice", "submit", "--title", "Sample", "--markdown-file", env.sample(t), "--key", "k-json", "--json")
		require.NoError(t, err)
		var sr server.SubmitResponse
		require.NoError(t, json.Unmarshal([]byte(out), &sr))
		require.Equal(t, "acme", sr.Tenant)
		require.Equal(t, "queued", string(sr.State))
		require.Equal(t, "idempotency key: k-json\nreplayed: false\n", errOut)

		_, errOut, err = env.cli(t, "alice", "submit", "--title", "Sample", "--markdown-file", env.sample(t), "--key", "k-json", "--json")
		require.NoError(t, err)
		require.Contains(t, errOut, "replayed: true")
	})

	t.Run("Field", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		out, errOut, err := env.cli(t, "alice", "submit", "--title", "Sample", "--markdown-file", env.sample(t), "--field", "id")
		require.NoError(t, err)
		require.Regexp(t, `^run_[0-9A-Z]{26}\n$`, out, "the run id alone, for RUN=$(…)")
		require.Regexp(t, `^idempotency key: cli-\S+\nreplayed: false\n$`, errOut, "the key is still shown")
		run := strings.TrimSpace(out)
		out, _, err = env.cli(t, "alice", "runs", "show", run, "--field", "state")
		require.NoError(t, err)
		require.Equal(t, "queued\n", out)
	})

	t.Run("InputFileAndStdin", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		title, md := simulator.SampleDocument()
		input, err := json.Marshal(map[string]string{"title": title, "markdown": md})
		require.NoError(t, err)
		path := filepath.Join(env.dir, "input.json")
		require.NoError(t, os.WriteFile(path, input, 0o644))
		first, _, err := env.cli(t, "alice", "submit", "--input", path, "--key", "k-in", "--budget-max-steps", "5")
		require.NoError(t, err)

		// The same body from stdin is a replay of the same key.
		out, _, err := runCLI(t, strings.NewReader(string(input)), "submit", "--input", "-", "--key", "k-in",
			"--budget-max-steps", "5", "--server", env.url, "--token", env.tokens["alice"])
		require.NoError(t, err)
		require.Contains(t, out, "replayed:        true")
		require.Equal(t, first[:strings.Index(first, "\n")], out[:strings.Index(out, "\n")])
	})

	t.Run("ErrKeyReusedWithAnotherBody", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		env.submit(t, "alice", "k-reused")
		_, _, err := env.cli(t, "alice", "submit", "--title", "Other title", "--markdown-file", env.sample(t), "--key", "k-reused")
		requireExit(t, err, 6)
		require.Contains(t, err.Error(), "422 idempotency_key_reused: ")
	})

	t.Run("ErrBadKey", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := env.cli(t, "alice", "submit", "--title", "Sample", "--markdown-file", env.sample(t), "--key", strings.Repeat("k", 256))
		requireExit(t, err, 2)
		require.Contains(t, err.Error(), "400 idempotency_key_invalid")
	})

	t.Run("ErrUnknownAgent", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := env.cli(t, "alice", "submit", "--agent", "nope", "--title", "Sample", "--markdown-file", env.sample(t))
		require.Error(t, err)
		require.Contains(t, []int{2, 6}, exitStatus(err), "%v", err)
		require.Contains(t, err.Error(), "nope")
	})

	t.Run("ErrNotASubmitter", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := env.cli(t, "bob", "submit", "--title", "Sample", "--markdown-file", env.sample(t))
		requireExit(t, err, 4)
		require.Contains(t, err.Error(), "403 forbidden")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		for name, args := range map[string][]string{
			"no input":          {"submit"},
			"both inputs":       {"submit", "--input", "x.json", "--title", "T"},
			"title alone":       {"submit", "--title", "T"},
			"missing file":      {"submit", "--input", filepath.Join(env.dir, "missing.json")},
			"missing markdown":  {"submit", "--title", "T", "--markdown-file", filepath.Join(env.dir, "missing.md")},
			"negative budget":   {"submit", "--title", "T", "--markdown-file", env.sample(t), "--budget-max-steps", "-1"},
			"unknown flag":      {"submit", "--nope"},
			"positional":        {"submit", "extra"},
			"input not object":  {"submit", "--input", env.sample(t)},
			"non-numeric steps": {"submit", "--budget-max-steps", "many"},
		} {
			t.Run(name, func(t *testing.T) {
				_, _, err := env.cli(t, "alice", args...)
				requireExit(t, err, 2)
			})
		}
	})
}
