package main

import (
	"encoding/json"
	"net/http"
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

// serveProcess is `ledger serve` running as a real process.
type serveProcess struct {
	cmd    *exec.Cmd
	logs   *syncBuffer
	url    string
	exited chan error
}

// startServeProcess starts the built binary as serve with args and waits
// until it listens; the test's cleanup kills it if the test did not stop it.
func startServeProcess(t *testing.T, bin string, args ...string) *serveProcess {
	t.Helper()
	return startServeProcessEnv(t, bin, nil, args...)
}

// startServeProcessEnv is startServeProcess with env added to the
// process's environment.
func startServeProcessEnv(t *testing.T, bin string, env []string, args ...string) *serveProcess {
	t.Helper()
	p := &serveProcess{logs: &syncBuffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	eventually(t, "serve to listen", func() bool {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("serve exited early: %v\n%s", err, p.logs.String())
		default:
		}
		p.url = listenURL(p.logs.String())
		return p.url != ""
	})
	return p
}

// signal sends sig and, for SIGHUP, waits for the log line that says the
// process handled it: the count of msg grows by one.
func (p *serveProcess) hup(t *testing.T, msg string) {
	t.Helper()
	before := strings.Count(p.logs.String(), msg)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	eventually(t, msg, func() bool {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("serve exited on SIGHUP: %v\n%s", err, p.logs.String())
		default:
		}
		return strings.Count(p.logs.String(), msg) > before
	})
}

// stop sends SIGTERM and requires exit status 0.
func (p *serveProcess) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.exited:
		require.NoError(t, err, "exit status 0 on SIGTERM\n%s", p.logs.String())
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not exit within 15s of SIGTERM\n%s", p.logs.String())
	}
}

// TestTokensReload: serve re-reads its tokens file on SIGHUP, through the
// real binary: a revoked token stops working once the signal is handled,
// a broken file keeps the tokens in force, and dev mode ignores SIGHUP.
func TestTokensReload(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	// cli runs the binary and returns stdout, stderr and its exit status.
	cli := func(t *testing.T, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = cleanEnv()
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if err != nil {
			code = exitOf(err)
			require.NotEqual(t, -1, code, "%v", err)
		}
		return stdout.String(), stderr.String(), code
	}

	t.Run("RevokeThenSIGHUP", func(t *testing.T) {
		dir := t.TempDir()
		tokens := filepath.Join(dir, "tokens.json")
		newToken := func(principal, role string) string {
			out, errOut, code := cli(t, "token", "new", "--principal", principal, "--tenant", "acme", "--role", role, "--add-to", tokens)
			require.Zero(t, code, errOut)
			tok, _, _ := strings.Cut(out, "\n")
			return tok
		}
		alice, bob := newToken("alice", "submitter"), newToken("bob", "approver")
		p := startServeProcess(t, bin, "--db", filepath.Join(dir, "ledger.db"), "--tokens", tokens)
		runsList := func(token string, extra ...string) (string, string, int) {
			return cli(t, append([]string{"runs", "list", "--server", p.url, "--token", token}, extra...)...)
		}
		_, errOut, code := runsList(alice)
		require.Zero(t, code, errOut)

		_, errOut, code = cli(t, "token", "revoke", "--file", tokens, "--principal", "alice")
		require.Zero(t, code, errOut)
		_, _, code = runsList(alice)
		require.Zero(t, code, "the server reads the file on SIGHUP only")

		p.hup(t, `"msg":"tokens reloaded"`)
		require.Contains(t, p.logs.String(), `"tokens":1`)
		_, errOut, code = runsList(alice)
		require.Equal(t, exitAuth, code, errOut)
		require.Equal(t, "ledger: 401 unauthorized: unknown token\n", errOut)
		_, errOut, code = runsList(bob)
		require.Zero(t, code, errOut, "the others keep working")

		// Through main, --json prints the problem document alone on stderr.
		out, errOut, code := runsList(alice, "--json")
		require.Equal(t, exitAuth, code)
		require.Empty(t, out)
		var problem server.Problem
		require.NoError(t, json.Unmarshal([]byte(errOut), &problem), errOut)
		require.Equal(t, http.StatusUnauthorized, problem.Status)

		t.Run("BrokenFileKeepsTheTokensInForce", func(t *testing.T) {
			require.NoError(t, os.WriteFile(tokens, []byte(`{"tokens": [{"sha256": "not a hash"`), 0o600))
			p.hup(t, `"msg":"tokens not reloaded; the tokens in force stay"`)
			_, errOut, code := runsList(bob)
			require.Zero(t, code, errOut)
			_, _, code = runsList(alice)
			require.Equal(t, exitAuth, code)

			// A missing file, too.
			require.NoError(t, os.Remove(tokens))
			p.hup(t, `"msg":"tokens not reloaded; the tokens in force stay"`)
			_, errOut, code = runsList(bob)
			require.Zero(t, code, errOut)
		})

		// A file that parses is still refused when it lists no tokens (it
		// would lock everyone out) or when others may write it; through a
		// symlink, what the link leads to is read, checked and logged.
		t.Run("RefusedFileKeepsTheTokensInForce", func(t *testing.T) {
			notReloaded := `"msg":"tokens not reloaded; the tokens in force stay"`
			require.NoError(t, os.WriteFile(tokens, []byte(`{"tokens": []}`), 0o600))
			p.hup(t, notReloaded)
			require.Contains(t, p.logs.String(), "the file lists no tokens, so nobody could get in")
			_, errOut, code := runsList(bob)
			require.Zero(t, code, errOut)

			carol := newToken("carol", "submitter")
			require.NoError(t, os.Chmod(tokens, 0o666))
			p.hup(t, notReloaded)
			require.Contains(t, p.logs.String(), "group or others may write it (mode 0666), and whoever writes it decides who may act: chmod 600 "+tokens)
			_, errOut, code = runsList(bob)
			require.Zero(t, code, errOut)
			_, _, code = runsList(carol)
			require.Equal(t, exitAuth, code, "carol's entry was not taken")

			target := filepath.Join(t.TempDir(), "tokens.json")
			require.NoError(t, os.Rename(tokens, target))
			require.NoError(t, os.Symlink(target, tokens))
			require.NoError(t, os.Chmod(target, 0o600))
			p.hup(t, `"msg":"tokens reloaded"`)
			target, err := filepath.EvalSymlinks(target) // TMPDIR may be a link itself
			require.NoError(t, err)
			require.Contains(t, p.logs.String(), `"level":"WARN","msg":"tokens file is a symlink: its target is read, and its target's permissions checked","file":"`+
				tokens+`","target":"`+target+`"`)
			_, errOut, code = runsList(carol)
			require.Zero(t, code, errOut)
			_, _, code = runsList(bob)
			require.Equal(t, exitAuth, code, "the file in force is carol's alone")
		})

		p.stop(t)
		for _, tok := range []string{alice, bob} {
			require.NotContains(t, p.logs.String(), tok, "tokens are never logged")
		}
	})

	t.Run("DevModeIgnoresSIGHUP", func(t *testing.T) {
		p := startServeProcess(t, bin, "--db", filepath.Join(t.TempDir(), "ledger.db"))
		p.hup(t, `"msg":"SIGHUP ignored: dev mode has no tokens file to reload"`)
		res, err := http.Get(p.url + "/readyz")
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
		require.Equal(t, http.StatusOK, res.StatusCode, "still serving")
		p.stop(t)
	})
}
