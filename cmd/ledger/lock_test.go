package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

func TestLockDatabase(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "ledger.db")
		l, err := lockDatabase(db, "serve", discardLogger())
		require.NoError(t, err)
		data, err := os.ReadFile(db + ".lock")
		require.NoError(t, err)
		var h lockHolder
		require.NoError(t, json.Unmarshal(data, &h), "the lock file names its holder: %s", data)
		require.Equal(t, os.Getpid(), h.PID)
		require.Equal(t, "serve", h.Command)
		require.False(t, h.Since.IsZero())

		require.NoError(t, l.Release())
		require.NoError(t, l.Release(), "releasing twice is harmless")
		again, err := lockDatabase(db, "worker", discardLogger())
		require.NoError(t, err, "a released lock can be taken again")
		data, err = os.ReadFile(db + ".lock")
		require.NoError(t, err)
		require.Contains(t, string(data), `"command":"worker"`, "the new holder replaced the old record")
		require.NotContains(t, string(data), "serve")
		require.NoError(t, again.Release())
	})

	t.Run("ErrInUse", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "ledger.db")
		held, err := lockDatabase(db, "serve", discardLogger())
		require.NoError(t, err)
		defer held.Release()
		// flock belongs to the open file: a second open in this very
		// process is refused as another process would be.
		_, err = lockDatabase(db, "worker", discardLogger())
		require.ErrorIs(t, err, errInUse)
		require.Equal(t, exitInUse, exitStatus(err))
		require.Equal(t, fmt.Sprintf("database %s is in use by another ledger process (pid %d, serve since ", db, os.Getpid()),
			err.Error()[:strings.Index(err.Error(), "since ")+len("since ")])
		require.Contains(t, err.Error(), "stop it first")
		require.Contains(t, err.Error(), db+".lock")
		data, err := os.ReadFile(db + ".lock")
		require.NoError(t, err)
		require.Contains(t, string(data), `"command":"serve"`, "a refused process leaves the holder's record alone")
	})

	t.Run("ErrInUseHolderUnknown", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "ledger.db")
		f, err := os.OpenFile(db+".lock", os.O_RDWR|os.O_CREATE, 0o644)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, flockExclusive(f), "someone holds the lock and has written nothing yet")
		_, err = lockDatabase(db, "recover", discardLogger())
		require.ErrorIs(t, err, errInUse)
		require.Contains(t, err.Error(), "(pid unknown)")
	})

	t.Run("ErrInUseThroughSymlink", func(t *testing.T) {
		dir := t.TempDir()
		db := filepath.Join(dir, "ledger.db")
		require.NoError(t, os.WriteFile(db, nil, 0o644))
		link := filepath.Join(dir, "other-name.db")
		require.NoError(t, os.Symlink(db, link))
		held, err := lockDatabase(db, "serve", discardLogger())
		require.NoError(t, err)
		defer held.Release()
		_, err = lockDatabase(link, "worker", discardLogger())
		require.ErrorIs(t, err, errInUse, "two names of one database share one lock")
	})

	t.Run("ErrMissingDirectory", func(t *testing.T) {
		_, err := lockDatabase(filepath.Join(t.TempDir(), "missing", "ledger.db"), "serve", discardLogger())
		require.ErrorIs(t, err, os.ErrNotExist)
		require.NotErrorIs(t, err, errInUse)
		require.Equal(t, exitOther, exitStatus(err))
	})
}

// TestLocalCommandsRefuseHeldDatabase runs the commands in process while a
// service holds the database: those that advance, recover or migrate are
// refused with exit status 7 and change nothing; those that only read run.
func TestLocalCommandsRefuseHeldDatabase(t *testing.T) {
	db, id := evidenceRun(t)
	svc, err := openService(context.Background(), serviceConfig{Command: "serve", DBPath: db, Logger: discardLogger()})
	require.NoError(t, err)
	defer svc.Close()
	before, err := svc.store.FindRunByID(context.Background(), id)
	require.NoError(t, err)

	for name, args := range map[string][]string{
		"worker":  {"worker", "--db", db, "--until-idle"},
		"recover": {"recover", "--db", db},
		"migrate": {"migrate", "--db", db},
		"demo":    {"demo", "--keep", filepath.Dir(db)},
	} {
		t.Run("ErrInUse/"+name, func(t *testing.T) {
			_, _, err := runCLI(t, nil, args...)
			require.ErrorIs(t, err, errInUse)
			require.Equal(t, exitInUse, exitStatus(err))
			require.Contains(t, err.Error(), fmt.Sprintf("database %s is in use by another ledger process (pid %d, serve", db, os.Getpid()))
		})
	}
	t.Run("ReadersRun", func(t *testing.T) {
		out, _, err := runCLI(t, nil, "evidence", "verify", string(id), "--db", db)
		require.NoError(t, err, out)
		_, _, err = runCLI(t, nil, "simulator", "effects", "--store", db+".effects.db")
		require.NoError(t, err)
	})
	after, err := svc.store.FindRunByID(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, before.EventSeq, after.EventSeq, "the refused commands wrote nothing")

	require.NoError(t, svc.Close())
	_, _, err = runCLI(t, nil, "recover", "--db", db)
	require.NoError(t, err, "the lock is released with the service")
}

// TestOneProcessPerDatabase is the defect of two `ledger serve` on one
// file: process A holds a call of a query-only tool in flight; a second
// serve (or worker, recover, migrate, demo) on the same file used to take
// that call for an interrupted one and run the tool again. Now each is
// refused with exit status 7 and names A, A keeps serving, the call stays
// A's; once A is SIGKILLed, the next process starts and recovers it, with
// one effect in the tool's own store.
func TestOneProcessPerDatabase(t *testing.T) {
	bin := ledgerBinary(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	g := contracts.Guarantees{Query: true}
	run, action := approvedRun(t, db, g, ledger.BudgetLimits{})

	// A: serve, whose tool call (the first of this action) takes a minute.
	sim := `{"tools": {"cards.write": {"guarantees": {"query": true, "dedup": false, "cancel": false}, ` +
		`"faults": [{"kind": "slow", "calls": [1], "delay_ms": 60000}]}}}`
	token, entry, err := server.NewTokenLine("alice", "acme", []string{"submitter"})
	require.NoError(t, err)
	tokens, err := json.Marshal(server.TokensFile{Tokens: []server.TokenEntry{entry}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.json"), tokens, 0o600))
	a := exec.Command(bin, "serve", "--db", db, "--addr", "127.0.0.1:0", "--tokens", filepath.Join(dir, "tokens.json"))
	a.Dir = dir
	a.Env = append(cleanEnv(), envSimulatorConfig+"="+sim)
	logs := &syncBuffer{}
	a.Stdout, a.Stderr = logs, logs
	require.NoError(t, a.Start())
	exited := make(chan error, 1)
	go func() { exited <- a.Wait() }()
	aDone := false
	t.Cleanup(func() {
		if !aDone {
			_ = a.Process.Kill()
			<-exited
		}
	})
	var url string
	eventually(t, "A to listen", func() bool {
		url = listenURL(logs.String())
		return url != ""
	})
	getRun := func() server.Run {
		req, err := http.NewRequest(http.MethodGet, url+"/v1/runs/"+string(run), nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		var r server.Run
		require.NoError(t, json.NewDecoder(res.Body).Decode(&r))
		return r
	}
	inFlight := func(r server.Run) bool {
		for _, act := range r.Actions {
			if act.ID == action && act.State == ledger.ActionRunning {
				return len(act.Attempts) == 1 && act.Attempts[0].Status == ledger.AttemptStarted
			}
		}
		return false
	}
	eventually(t, "A's call to be in flight", func() bool { return inFlight(getRun()) })

	// B: every command that advances, recovers or migrates is refused.
	want := fmt.Sprintf("ledger: database %s is in use by another ledger process (pid %d, serve since ", db, a.Process.Pid)
	for name, args := range map[string][]string{
		"serve":   {"serve", "--db", db, "--addr", "127.0.0.1:0"},
		"worker":  {"worker", "--db", db, "--until-idle"},
		"recover": {"recover", "--db", db},
		"migrate": {"migrate", "--db", db},
		"demo":    {"demo", "--keep", dir},
	} {
		t.Run("ErrInUse/"+name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			b := exec.CommandContext(ctx, bin, args...)
			b.Dir = dir
			b.Env = append(cleanEnv(), envSimulatorConfig+"="+sim)
			out, err := b.CombinedOutput()
			require.Equal(t, exitInUse, exitOf(err), "B %s must be refused with exit status 7, not run:\n%s", name, out)
			require.Contains(t, string(out), want)
		})
	}

	// A is untouched: still serving, its call still its own, no effect yet,
	// no decision taken about it by anyone.
	res, err := http.Get(url + "/healthz")
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.True(t, inFlight(getRun()), "A's call is still in flight, with one attempt")
	out, _, err := runCLI(t, nil, "simulator", "effects", "--store", db+".effects.db", "--json")
	require.NoError(t, err)
	require.Empty(t, strings.TrimSpace(out), "no effect while A's call is held")
	out, _, err = runCLI(t, nil, "evidence", "verify", string(run), "--db", db)
	require.NoError(t, err, "readers run beside A: %s", out)

	// A dies mid-call; the kernel drops its lock, and B starts.
	require.NoError(t, a.Process.Kill())
	err = <-exited
	aDone = true
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit))
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "A was killed: %v", err)
	require.False(t, runWorker(t, db, crashEnv(t, g, "")), "B runs once A is gone")

	o := readOutcome(t, db, run, action)
	require.Equal(t, ledger.RunCompleted, o.run.State)
	require.Len(t, o.effects, 1, "one effect for one approved action")
	require.Len(t, o.attempts, 2, "A's interrupted attempt, queried (nothing happened), then B's")
	require.Equal(t, ledger.EffectNotHappened, o.attempts[0].Effect)
}
