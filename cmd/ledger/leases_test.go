package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// slowFirstCall is a simulator config whose cards.write (query only) takes
// a minute on its first call, within its 90 s timeout.
const slowFirstCall = `{"tools": {"cards.write": {"guarantees": {"query": true, "dedup": false, "cancel": false}, "timeout_ms": 90000, ` +
	`"faults": [{"kind": "slow", "calls": [1], "delay_ms": 60000}]}}}`

// TestSeveralProcessesOneDatabase is what the database lock used to
// prevent: process A holds a call of a query-only tool in flight, and a
// second process on the same file (worker, recover, migrate, serve) would
// take that call for an interrupted one and run the tool again. Now each
// runs, and leaves A's run alone, since A holds its lease: no decision,
// no second call, no effect. Once A is SIGKILLed, the next process takes
// A's runs over at once (A no longer exists on this host) and recovers
// the call, with one effect in the tool's own store.
func TestSeveralProcessesOneDatabase(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	g := contracts.Guarantees{Query: true}
	run, action := approvedRun(t, db, g, ledger.BudgetLimits{})

	// A's call (the first of this action) takes a minute, within the
	// tool's timeout: A's lease is extended to outlast it.
	env := []string{envSimulatorConfig + "=" + slowFirstCall}
	a := startServeProcessEnv(t, bin, env, "--db", db)
	inFlight := func() bool {
		o := readOutcome(t, db, run, action)
		return o.action.State == ledger.ActionRunning && len(o.attempts) == 1 && o.attempts[0].Status == ledger.AttemptStarted
	}
	eventually(t, "A's call to be in flight", inFlight)
	before := readOutcome(t, db, run, action)

	// B: every command that advances, recovers or migrates runs, beside A.
	b := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		cmd.Env = append(cleanEnv(), env...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "B %s runs beside A:\n%s", args[0], out)
		return string(out)
	}
	require.Contains(t, b("worker", "--db", db, "--until-idle"), "idle after 0 advances")
	var rep recovery.ScanReport
	require.NoError(t, json.Unmarshal([]byte(b("recover", "--db", db, "--json")), &rep))
	require.Equal(t, 1, rep.Held, "A's run is A's to recover")
	require.Zero(t, rep.Actions)
	require.Contains(t, b("migrate", "--db", db), "schema version")
	other := startServeProcessEnv(t, bin, env, "--db", db)
	res, err := http.Get(other.url + "/readyz")
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode)
	other.stop(t)

	// A is untouched: its call still its own, no effect, no decision by
	// anyone, and A still serves.
	require.True(t, inFlight(), "A's call is still in flight, with one attempt")
	after := readOutcome(t, db, run, action)
	require.Empty(t, after.effects, "no effect while A's call is held")
	require.Equal(t, before.events, after.events, "nobody decided anything about A's run, nor wrote to it")
	res, err = http.Get(a.url + "/healthz")
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode)

	// A dies mid-call; B takes its run over without waiting out the lease.
	require.NoError(t, a.cmd.Process.Kill())
	err = <-a.exited
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit))
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "A was killed: %v", err)
	started := time.Now()
	require.False(t, runWorker(t, db, crashEnv(t, g, "")), "B runs once A is gone")
	require.Less(t, time.Since(started), 20*time.Second, "A's lease, extended for a 90 s call, was not waited out")

	o := readOutcome(t, db, run, action)
	require.Equal(t, ledger.RunCompleted, o.run.State)
	require.Len(t, o.effects, 1, "one effect for one approved action")
	require.Len(t, o.attempts, 2, "A's interrupted attempt, queried (nothing happened), then B's")
	require.Equal(t, ledger.EffectNotHappened, o.attempts[0].Effect)
}

// TestTwoServesUnderLoad: two `ledger serve` processes on one SQLite file
// take runs submitted to either; one of them is SIGKILLed halfway and the
// other carries on. Every action's effect is in the simulator's own effect
// store exactly once (the tool does not dedup, so a second call would add
// a second effect), every run completes, and no lease is left held.
func TestTwoServesUnderLoad(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	rules := writeFile(t, dir, "rules.json", `{"schema_version": "1.0", "rules": [{"tool": "cards.write", "decision": "auto_approve"}]}`)
	env := []string{
		// Every call takes 300 ms: calls are in flight while the other
		// process looks for work.
		envSimulatorConfig + `={"tools": {"cards.write": {"guarantees": {"query": true, "dedup": false, "cancel": false}, ` +
			`"faults": [{"kind": "slow", "delay_ms": 300}]}}}`,
		envLeaseTTL + "=900ms", // leases renewed, and lapsing, often
	}
	a := startServeProcessEnv(t, bin, env, "--db", db, "--rules", rules)
	b := startServeProcessEnv(t, bin, env, "--db", db, "--rules", rules)

	const n = 40
	submit := func(url string, i int) ledger.RunID {
		title, md := simulator.SampleDocument()
		input, err := json.Marshal(map[string]string{"title": fmt.Sprintf("%s %d", title, i), "markdown": md})
		require.NoError(t, err)
		body, err := json.Marshal(server.SubmitRequest{Agent: simulator.AgentName, Input: input})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, url+"/v1/runs", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(server.HeaderIdempotencyKey, fmt.Sprintf("load-%d", i))
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusCreated, res.StatusCode)
		var sr server.SubmitResponse
		require.NoError(t, json.NewDecoder(res.Body).Decode(&sr))
		return sr.ID
	}
	runs := make([]ledger.RunID, n)
	var wg sync.WaitGroup
	for i := range n / 2 {
		wg.Go(func() { runs[i] = submit([]string{a.url, b.url}[i%2], i) })
	}
	wg.Wait()
	// A dies with whatever it holds; B goes on, and takes more.
	require.NoError(t, a.cmd.Process.Kill())
	<-a.exited
	for i := n / 2; i < n; i++ {
		wg.Go(func() { runs[i] = submit(b.url, i) })
	}
	wg.Wait()

	store, err := sqlite.OpenStore(context.Background(), sqlite.Config{Path: db})
	require.NoError(t, err)
	defer store.Close()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range runs {
		for {
			r, err := store.FindRunByID(ctx, id)
			require.NoError(t, err)
			if r.State.Terminal() {
				require.Equal(t, ledger.RunCompleted, r.State, "run %s", id)
				break
			}
			require.True(t, time.Now().Before(deadline), "run %s stuck in %s\nB's log:\n%s", id, r.State, tail(b.logs.String()))
			time.Sleep(50 * time.Millisecond)
		}
	}
	b.stop(t)

	effects, err := simulator.OpenEffectStore(ctx, db+".effects.db", nil)
	require.NoError(t, err)
	defer effects.Close()
	got, err := effects.Effects(ctx)
	require.NoError(t, err)
	perKey := map[string]int{}
	for _, e := range got {
		perKey[e.DedupKey]++
	}
	writes := 0
	for _, id := range runs {
		acts, err := store.FindActions(ctx, ledger.ActionFilter{RunID: &id})
		require.NoError(t, err)
		for _, act := range acts {
			if act.Tool != simulator.CardsWriteTool {
				continue
			}
			writes++
			require.Equal(t, ledger.ActionSucceeded, act.State)
			require.Equal(t, 1, perKey[act.DedupKey], "the effect of %s exactly once", act.ID)
		}
		rep, err := store.VerifyChain(ctx, id)
		require.NoError(t, err)
		require.True(t, rep.OK, "%+v", rep)
		l, err := store.FindRunLease(ctx, id)
		require.NoError(t, err)
		require.Empty(t, l.Owner, "no lease left held by a process that is gone")
	}
	require.GreaterOrEqual(t, writes, n)
	require.Len(t, got, writes, "no effect of anything else")
}

// tail is the last lines of a log, for a failure's message.
func tail(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

// TestMigrateConcurrently: several `ledger migrate` at once on a new file
// all succeed, and the schema is applied once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	db := filepath.Join(t.TempDir(), "ledger.db")
	var wg sync.WaitGroup
	outs := make([][]byte, 4)
	errs := make([]error, 4)
	for i := range outs {
		wg.Go(func() {
			cmd := exec.Command(bin, "migrate", "--db", db, "--json")
			cmd.Env = cleanEnv()
			outs[i], errs[i] = cmd.CombinedOutput()
		})
	}
	wg.Wait()
	for i := range outs {
		require.NoError(t, errs[i], "%s", outs[i])
		var v struct {
			SchemaVersion int `json:"schema_version"`
		}
		require.NoError(t, json.Unmarshal(outs[i], &v), "%s", outs[i])
		require.Equal(t, sqlite.SchemaVersion(), v.SchemaVersion)
	}
	_, err := os.Stat(db + ".lock")
	require.ErrorIs(t, err, os.ErrNotExist, "no lock file any more")
}

// TestNamedLeaseOwner: LEDGER_LEASE_OWNER names the replica in the leases
// it takes (name, pid, a random part), and a name that could not be shown
// as one is refused before anything starts.
func TestNamedLeaseOwner(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	g := contracts.Guarantees{Query: true}
	run, action := approvedRun(t, db, g, ledger.BudgetLimits{})
	a := startServeProcessEnv(t, bin, []string{envSimulatorConfig + "=" + slowFirstCall, envLeaseOwner + "=pod/a"}, "--db", db)
	eventually(t, "the call to be in flight", func() bool {
		o := readOutcome(t, db, run, action)
		return o.action.State == ledger.ActionRunning && len(o.attempts) == 1
	})
	raw, err := sql.Open("sqlite3", "file:"+db+"?_busy_timeout=5000")
	require.NoError(t, err)
	defer raw.Close()
	var owner string
	require.NoError(t, raw.QueryRow(`SELECT lease_owner FROM runs WHERE id = ?`, string(run)).Scan(&owner))
	require.Regexp(t, fmt.Sprintf(`^pod_a/%d/[0-9a-f]{8}$`, a.cmd.Process.Pid), owner)
	a.stop(t)

	for _, bad := range []string{"two words", strings.Repeat("x", 101)} {
		cmd := exec.Command(bin, "worker", "--db", db, "--until-idle")
		cmd.Env = append(cleanEnv(), envLeaseOwner+"="+bad)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%q refused: %s", bad, out)
		require.Equal(t, 2, exit.ExitCode(), "%s", out)
		require.Contains(t, string(out), envLeaseOwner+" must be")
	}
}
