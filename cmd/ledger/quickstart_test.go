package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

// TestQuickStart runs the README's quick start with the built binary: two
// tokens, serve as a real process, submit as alice, approve as bob, one
// effect in the simulator's own store, and a clean exit on SIGTERM.
func TestQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs the server as a process")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "ledger")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())

	// ledger runs the binary with extra environment and returns stdout.
	ledger := func(t *testing.T, env []string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = append(cleanEnv(), env...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return string(out), &cliError{err: err, stderr: stderr.String()}
		}
		return string(out), nil
	}
	tokens := filepath.Join(dir, "tokens.json")
	newToken := func(principal, role string) string {
		out, err := ledger(t, nil, "token", "new", "--principal", principal, "--tenant", "acme", "--role", role, "--add-to", tokens)
		require.NoError(t, err)
		token, _, _ := strings.Cut(out, "\n")
		require.True(t, strings.HasPrefix(token, server.TokenPrefix))
		return token
	}
	alice := newToken("alice", "submitter")
	bob := newToken("bob", "approver")

	db := filepath.Join(dir, "ledger.db")
	serve := exec.Command(bin, "serve", "--db", db, "--addr", "127.0.0.1:0", "--tokens", tokens)
	serve.Dir = dir
	serve.Env = cleanEnv()
	logs := &syncBuffer{}
	serve.Stdout, serve.Stderr = logs, logs
	require.NoError(t, serve.Start())
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped { // a failed test: do not leave the server behind
			_ = serve.Process.Kill()
			<-exited
		}
	})
	var url string
	eventually(t, "serve to log its address", func() bool {
		url = listenURL(logs.String())
		return url != ""
	})
	asAlice := []string{envServer + "=" + url, envToken + "=" + alice}
	asBob := []string{envServer + "=" + url, envToken + "=" + bob}

	md, err := filepath.Abs(filepath.Join("..", "..", "simulator", "testdata", "rust-ownership.md"))
	require.NoError(t, err)
	out, err := ledger(t, asAlice, "submit", "--title", "Rust ownership", "--markdown-file", md)
	require.NoError(t, err, "%v\n%s", err, logs.String())
	id := fieldOf(t, out, "run:")

	show := func(env []string) server.Run {
		out, err := ledger(t, env, "runs", "show", id, "--json")
		require.NoError(t, err)
		var run server.Run
		require.NoError(t, json.Unmarshal([]byte(out), &run))
		return run
	}
	var run server.Run
	eventually(t, "awaiting_approval", func() bool {
		run = show(asAlice)
		return run.State == "awaiting_approval"
	})
	action := run.Actions[len(run.Actions)-1]
	require.Equal(t, "cards.write", action.Tool)

	out, err = ledger(t, asBob, "approvals", "list")
	require.NoError(t, err)
	require.Contains(t, out, string(action.ID))
	require.Contains(t, out, string(action.ActionDigest))

	_, err = ledger(t, asAlice, "approve", string(action.ID), "--digest", string(action.ActionDigest))
	require.Error(t, err, "alice may not approve her own run")
	require.Equal(t, 4, exitOf(err))

	out, err = ledger(t, asBob, "approve", string(action.ID), "--digest", string(action.ActionDigest))
	require.NoError(t, err)
	require.Contains(t, out, "approved "+string(action.ID))
	eventually(t, "completed", func() bool {
		run = show(asBob)
		return run.State == "completed"
	})
	require.Equal(t, "completed", string(run.StopReason))

	out, err = ledger(t, nil, "simulator", "effects", "--store", db+".effects.db", "--json")
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 1, "exactly one effect:\n%s", out)

	// The exit statuses reach the shell.
	_, err = ledger(t, asBob, "runs", "show", "run_01JAAAAAAAAAAAAAAAAAAAAAAA")
	require.Equal(t, 5, exitOf(err))
	_, err = ledger(t, asBob, "approve", string(action.ID), "--digest", string(action.ActionDigest))
	require.Equal(t, 6, exitOf(err))
	_, err = ledger(t, asBob, "approve", string(action.ID))
	require.Equal(t, 2, exitOf(err))

	require.NoError(t, serve.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		stopped = true
		require.NoError(t, err, "exit status 0 on SIGTERM\n%s", logs.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("serve did not exit within 10s of SIGTERM\n%s", logs.String())
	}
	require.NotContains(t, logs.String(), alice, "tokens are never logged")

	t.Run("DevModeRefusesNonLoopback", func(t *testing.T) {
		_, err := ledger(t, nil, "serve", "--db", filepath.Join(dir, "dev.db"), "--addr", "0.0.0.0:0")
		require.Equal(t, 2, exitOf(err))
		require.Contains(t, err.Error(), "dev mode")
	})
}

// cliError is a failed run of the binary with what it said on stderr.
type cliError struct {
	err    error
	stderr string
}

func (e *cliError) Error() string { return e.err.Error() + ": " + e.stderr }
func (e *cliError) Unwrap() error { return e.err }

// exitOf is the exit status of a failed run of the binary.
func exitOf(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// cleanEnv is the test's environment without the ledger's own variables,
// so a developer's settings cannot change what the test sees.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEDGER_") {
			env = append(env, kv)
		}
	}
	return env
}

// fieldOf returns the value of the "name  value" line of a command's output.
func fieldOf(t *testing.T, out, name string) string {
	t.Helper()
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(line, name); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("no %q line in:\n%s", name, out)
	return ""
}
