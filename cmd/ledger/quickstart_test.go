package main

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// quickStartBlock is the fenced shell block under "## Quick start" in the
// repository's README.md, exactly as written there.
func quickStartBlock(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	defer f.Close()
	var (
		section, inBlock bool
		block            strings.Builder
	)
	// The first ```sh fence of the section, to its closing fence.
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## Quick start"
		case section && !inBlock && strings.HasPrefix(line, "```sh"):
			inBlock = true
		case section && inBlock && line == "```":
			return block.String()
		case section && inBlock:
			block.WriteString(line + "\n")
		}
	}
	require.NoError(t, sc.Err())
	t.Fatal(`README.md has no "## Quick start" section with a fenced sh block`)
	return ""
}

// freeAddr is a loopback address with a port nothing listened on a moment
// ago, for a process that cannot be told to pick its own.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestQuickStart runs the README's quick start as it stands there, so the
// README cannot drift from what works: bash (strict, so any failing line
// fails the block) in a temporary directory that holds the built binary as
// bin/ledger and the sample document, with LEDGER_ADDR and LEDGER_SERVER
// on a free port so it runs beside anything on 8080. The block must exit
// 0 (its last line waits for serve, so that is serve's exit status on
// SIGTERM too), leave exactly one effect in the simulator's own store, and
// print no token.
func TestQuickStart(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	block := quickStartBlock(t)
	require.Contains(t, block, "bin/ledger serve")

	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.Symlink(bin, filepath.Join(dir, "bin", "ledger")))
	md, err := os.ReadFile(filepath.Join("..", "..", "simulator", "testdata", "rust-ownership.md"))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "simulator", "testdata"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "simulator", "testdata", "rust-ownership.md"), md, 0o644))
	script := filepath.Join(dir, "quickstart.sh")
	require.NoError(t, os.WriteFile(script, []byte(block), 0o644))
	tmp := filepath.Join(dir, "tmp") // where the block's mktemp -d lands
	require.NoError(t, os.Mkdir(tmp, 0o755))

	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", script)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "TMPDIR="+tmp, envAddr+"="+addr, envServer+"=http://"+addr)
	// Its own process group: if the block fails halfway, the serve it left
	// in the background goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err = cmd.Wait()
	require.NoError(t, err, "the quick start as pasted:\n%s\n%s", block, out.String())

	log := out.String()
	require.Contains(t, log, "state:        awaiting_approval")
	require.Contains(t, log, "approved act_")
	require.Contains(t, log, "state:        completed")
	require.Contains(t, log, `msg=stopped`, "serve stopped cleanly on SIGTERM")
	require.NotContains(t, log, server.TokenPrefix, "no token is printed or logged")

	dbs, err := filepath.Glob(filepath.Join(tmp, "*", "ledger.db.effects.db"))
	require.NoError(t, err)
	require.Len(t, dbs, 1, "the block's own directory")
	effects, err := simulator.OpenEffectStore(context.Background(), dbs[0], nil)
	require.NoError(t, err)
	defer effects.Close()
	got, err := effects.Effects(context.Background())
	require.NoError(t, err)
	require.Len(t, got, 1, "exactly one effect")
	require.Equal(t, simulator.CardsWriteTool, got[0].Tool)
}

// TestBinaryExitStatuses: the exit statuses of the client commands reach
// the shell through main, against serve as a real process.
func TestBinaryExitStatuses(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
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
	newToken := func(principal, role string) string {
		out, err := ledger(t, nil, "token", "new", "--principal", principal, "--tenant", "acme", "--role", role, "--add-to", tokens)
		require.NoError(t, err)
		token, _, _ := strings.Cut(out, "\n")
		return token
	}
	alice, bob := newToken("alice", "submitter"), newToken("bob", "approver")
	p := startServeProcess(t, bin, "--db", filepath.Join(dir, "ledger.db"), "--tokens", tokens)
	asAlice := []string{envServer + "=" + p.url, envToken + "=" + alice}
	asBob := []string{envServer + "=" + p.url, envToken + "=" + bob}

	md := filepath.Join(dir, "doc.md")
	_, doc := simulator.SampleDocument()
	require.NoError(t, os.WriteFile(md, []byte(doc), 0o644))
	out, err := ledger(t, asAlice, "submit", "--title", "Sample", "--markdown-file", md, "--field", "id")
	require.NoError(t, err)
	run := strings.TrimSpace(out)
	_, err = ledger(t, asAlice, "runs", "show", run, "--wait-state", "awaiting_approval")
	require.NoError(t, err)
	action, err := ledger(t, asBob, "approvals", "list", "--field", "action_id")
	require.NoError(t, err)
	action = strings.TrimSpace(action)
	digest, err := ledger(t, asBob, "actions", "show", action, "--field", "action_digest")
	require.NoError(t, err)
	digest = strings.TrimSpace(digest)

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"SelfApproval", asAlice, []string{"approve", action, "--digest", digest}, exitAuth},
		{"UnknownRun", asBob, []string{"runs", "show", "run_01JAAAAAAAAAAAAAAAAAAAAAAA"}, exitNotFound},
		{"NoDigest", asBob, []string{"approve", action}, exitUsage},
		{"Approve", asBob, []string{"approve", action, "--digest", digest}, 0},
		{"ApproveAgain", asBob, []string{"approve", action, "--digest", digest}, exitConflict},
		{"WaitEndsElsewhere", asBob, []string{"runs", "show", run, "--wait-state", "needs_review"}, exitOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ledger(t, tc.env, tc.args...)
			if tc.want == 0 {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tc.want, exitOf(err), "%v", err)
		})
	}
	p.stop(t)
	require.NotContains(t, p.logs.String(), alice, "tokens are never logged")

	t.Run("DevModeRefusesNonLoopback", func(t *testing.T) {
		_, err := ledger(t, nil, "serve", "--db", filepath.Join(dir, "dev.db"), "--addr", "0.0.0.0:0")
		require.Equal(t, exitUsage, exitOf(err))
		require.Contains(t, err.Error(), "dev mode")
	})
	t.Run("AddrFromEnvironment", func(t *testing.T) {
		_, err := ledger(t, []string{envAddr + "=0.0.0.0:0"}, "serve", "--db", filepath.Join(dir, "dev.db"))
		require.Equal(t, exitUsage, exitOf(err), "$%s is the address serve checks", envAddr)
		require.Contains(t, err.Error(), `not "0.0.0.0:0"`)
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
