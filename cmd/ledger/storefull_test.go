package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// storeFullSim holds each first call of the write tool for a second, so
// the calls the approvals start are still running when the disk fills: the
// tool acts (or fails to), and recording the outcome fails.
const storeFullSim = `{"tools": {"cards.write": {"guarantees": {"query": true, "dedup": false, "cancel": false}, ` +
	`"faults": [{"kind": "slow", "calls": [1], "delay_ms": 1000}]}}}`

// fullDisk is a way to fill and free the disk under a running serve.
type fullDisk struct {
	cmd        *exec.Cmd // serve, not started yet
	fill, free func(t *testing.T)
	// effects returns a path the effect store can be read at.
	effects func(t *testing.T) string
}

// TestStoreFull is the full disk of issue 11 through the real binary.
// While the disk is full the workers back off instead of spinning (a bound
// on error log lines the old code broke by orders of magnitude), /readyz
// answers 503 and ledger_store_errors_total counts the failures; a submit
// is refused with 500 and acknowledged nowhere. Once the disk is freed,
// /readyz is 200 again and every acknowledged run completes with exactly
// one effect in the tool's own store.
func TestStoreFull(t *testing.T) {
	t.Parallel()
	bin := ledgerBinary(t)
	// FaultPlan: every store write of serve fails while a file exists
	// (fault plan store_full).
	t.Run("FaultPlan", func(t *testing.T) {
		dir := t.TempDir()
		db := filepath.Join(dir, "ledger.db")
		flag := filepath.Join(dir, "disk-full")
		cmd := exec.Command(bin, "serve", "--db", db, "--addr", "127.0.0.1:0")
		cmd.Dir = dir
		cmd.Env = append(cleanEnv(), envSimulatorConfig+"="+storeFullSim,
			envFaultPlan+`={"action": "store_full", "while_file": "`+flag+`"}`)
		testStoreFull(t, fullDisk{cmd: cmd,
			fill:    func(t *testing.T) { require.NoError(t, os.WriteFile(flag, nil, 0o644)) },
			free:    func(t *testing.T) { require.NoError(t, os.Remove(flag)) },
			effects: func(*testing.T) string { return db + ".effects.db" },
		})
	})
	// RealDisk: serve's database (and the tool's effect store) on an 8 MiB
	// tmpfs of its own mount namespace, filled by a file to the last byte.
	t.Run("RealDisk", func(t *testing.T) {
		probe := exec.Command("unshare", "-rm", "sh", "-c", `mount -t tmpfs -o size=1m tmpfs "$0"`, t.TempDir())
		if out, err := probe.CombinedOutput(); err != nil {
			t.Skipf("needs unshare(1) and a tmpfs mount in a user namespace: %v %s", err, out)
		}
		dir := t.TempDir()
		cmd := exec.Command("unshare", "-rm", "sh", "-c",
			`mount -t tmpfs -o size=8m tmpfs "$0" && exec "$1" serve --db "$0/ledger.db" --addr 127.0.0.1:0`, dir, bin)
		cmd.Env = append(cleanEnv(), envSimulatorConfig+"="+storeFullSim)
		// The tmpfs is seen through the process's root (unshare execs, so
		// the pid is serve's).
		root := func() string { return fmt.Sprintf("/proc/%d/root%s", cmd.Process.Pid, dir) }
		testStoreFull(t, fullDisk{cmd: cmd,
			fill: func(t *testing.T) {
				f, err := os.Create(filepath.Join(root(), "filler"))
				require.NoError(t, err)
				_, err = io.Copy(f, zeros{})
				require.ErrorIs(t, err, syscall.ENOSPC, "the filler fills the disk")
				require.NoError(t, f.Close())
			},
			free: func(t *testing.T) { require.NoError(t, os.Remove(filepath.Join(root(), "filler"))) },
			effects: func(t *testing.T) string {
				// Read a copy: SQLite does not find the WAL's content
				// through /proc/PID/root.
				out := t.TempDir()
				for _, suffix := range []string{"", "-wal", "-shm"} {
					data, err := os.ReadFile(filepath.Join(root(), "ledger.db.effects.db"+suffix))
					require.NoError(t, err)
					require.NoError(t, os.WriteFile(filepath.Join(out, "effects.db"+suffix), data, 0o644))
				}
				return filepath.Join(out, "effects.db")
			},
		})
	})
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func testStoreFull(t *testing.T, disk fullDisk) {
	cmd := disk.cmd
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	var url string
	eventually(t, "serve to listen", func() bool {
		url = listenURL(logs.String())
		return url != ""
	})
	api := &storeFullAPI{t: t, url: url}

	// Three acknowledged runs, each waiting for its approval.
	var runs []ledger.RunID
	for _, key := range []string{"full-1", "full-2", "full-3"} {
		code, sr := api.submit(key)
		require.Equal(t, http.StatusCreated, code)
		runs = append(runs, sr.ID)
	}
	for _, id := range runs {
		eventually(t, "run "+string(id)+" to await approval", func() bool { return api.run(id).State == ledger.RunAwaitingApproval })
	}
	// Approve all three (acknowledged: 200), then fill the disk while
	// their calls are in flight.
	for _, id := range runs {
		a := lastAction(api.run(id))
		require.Equal(t, http.StatusOK, api.post("/v1/actions/"+string(a.ID)+"/approve", server.DecisionRequest{ActionDigest: a.ActionDigest}, nil))
	}
	disk.fill(t)

	// The failures begin; then nothing but the workers runs for 3 s (no
	// request of ours, which would log too), and we count error lines.
	eventually(t, "a store error to be logged", func() bool { return countErrorLines(logs.String()) > 0 })
	before, failed := countErrorLines(logs.String()), sum(api.storeErrors())
	<-time.After(3 * time.Second)
	during := countErrorLines(logs.String()) - before
	require.Less(t, during, 20, "error lines logged in 3 s while every write fails (the workers must back off):\n%s", lastLines(logs.String(), 20))
	require.Contains(t, logs.String(), `"msg":"store writes failing"`)
	errs := api.storeErrors()
	require.Contains(t, errs, "finish_attempt", "ledger_store_errors_total is exported")
	require.Greater(t, sum(errs), failed, "the workers kept trying meanwhile: %v", errs)

	// Not ready while writes fail; the failures are counted by operation.
	require.Equal(t, http.StatusServiceUnavailable, api.status("/readyz"))
	require.Positive(t, errs["finish_attempt"]+errs["start_attempt"], "the attempts' writes failed: %v", errs)
	// A submit now is refused and acknowledged nowhere.
	code, _ := api.submit("full-4")
	require.Equal(t, http.StatusInternalServerError, code)
	require.Greater(t, api.storeErrors()["submit_run"], errs["submit_run"], "the HTTP handler's store error is counted")
	require.Equal(t, http.StatusServiceUnavailable, api.status("/readyz"))

	// Free the disk.
	disk.free(t)
	eventually(t, "readyz to be 200 again", func() bool { return api.status("/readyz") == http.StatusOK })
	code, sr := api.submit("full-4")
	require.Equal(t, http.StatusCreated, code, "the refused submit left nothing behind: its key is a new run")
	eventually(t, "run full-4 to await approval", func() bool { return api.run(sr.ID).State == ledger.RunAwaitingApproval })
	a := lastAction(api.run(sr.ID))
	require.Equal(t, http.StatusOK, api.post("/v1/actions/"+string(a.ID)+"/approve", server.DecisionRequest{ActionDigest: a.ActionDigest}, nil))
	runs = append(runs, sr.ID)

	keys := map[string]bool{}
	for _, id := range runs {
		eventually(t, "run "+string(id)+" to complete", func() bool { return api.run(id).State == ledger.RunCompleted })
		keys[lastAction(api.run(id)).DedupKey] = true
	}
	out, _, err := runCLI(t, nil, "simulator", "effects", "--store", disk.effects(t), "--json")
	require.NoError(t, err)
	var effects []simulator.Effect
	for line := range strings.Lines(strings.TrimSpace(out)) {
		var e simulator.Effect
		require.NoError(t, json.Unmarshal([]byte(line), &e))
		effects = append(effects, e)
	}
	require.Len(t, effects, len(runs), "exactly one effect per acknowledged run:\n%s", out)
	for _, e := range effects {
		require.True(t, keys[e.DedupKey], "effect %s belongs to one of the runs", e.DedupKey)
		delete(keys, e.DedupKey)
	}
	require.Contains(t, logs.String(), "store writes succeed again")

	// Idle, one write fails, the disk is freed, and nothing else writes:
	// the pool's probe write makes the process ready again by itself.
	disk.fill(t)
	code, _ = api.submit("full-5")
	require.Equal(t, http.StatusInternalServerError, code)
	require.Equal(t, http.StatusServiceUnavailable, api.status("/readyz"))
	disk.free(t)
	eventually(t, "readyz of an idle process to be 200 again", func() bool { return api.status("/readyz") == http.StatusOK })

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-exited, "a clean exit on SIGTERM")
	stopped = true
}

// storeFullAPI is the few HTTP calls TestStoreFull makes, in dev mode.
type storeFullAPI struct {
	t   *testing.T
	url string
}

func (a *storeFullAPI) post(path string, body, out any) int {
	a.t.Helper()
	data, err := json.Marshal(body)
	require.NoError(a.t, err)
	req, err := http.NewRequest(http.MethodPost, a.url+path, bytes.NewReader(data))
	require.NoError(a.t, err)
	req.Header.Set("Content-Type", "application/json")
	if key, ok := body.(submitWithKey); ok {
		req.Header.Set(server.HeaderIdempotencyKey, key.key)
	}
	return a.do(req, out)
}

func (a *storeFullAPI) do(req *http.Request, out any) int {
	a.t.Helper()
	res, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	require.NoError(a.t, err)
	if out != nil && res.StatusCode/100 == 2 {
		require.NoError(a.t, json.Unmarshal(data, out), "%s", data)
	}
	return res.StatusCode
}

// submitWithKey is a submit body with its Idempotency-Key.
type submitWithKey struct {
	server.SubmitRequest
	key string
}

func (s submitWithKey) MarshalJSON() ([]byte, error) { return json.Marshal(s.SubmitRequest) }

func (a *storeFullAPI) submit(key string) (int, server.SubmitResponse) {
	a.t.Helper()
	title, md := simulator.SampleDocument()
	input, err := json.Marshal(map[string]string{"title": title, "markdown": md})
	require.NoError(a.t, err)
	var sr server.SubmitResponse
	code := a.post("/v1/runs", submitWithKey{SubmitRequest: server.SubmitRequest{Agent: simulator.AgentName, Input: input}, key: key}, &sr)
	return code, sr
}

func (a *storeFullAPI) run(id ledger.RunID) server.Run {
	a.t.Helper()
	req, err := http.NewRequest(http.MethodGet, a.url+"/v1/runs/"+string(id), nil)
	require.NoError(a.t, err)
	var r server.Run
	require.Equal(a.t, http.StatusOK, a.do(req, &r))
	return r
}

func (a *storeFullAPI) status(path string) int {
	a.t.Helper()
	req, err := http.NewRequest(http.MethodGet, a.url+path, nil)
	require.NoError(a.t, err)
	return a.do(req, nil)
}

// storeErrors reads ledger_store_errors_total by op from /metrics.
func (a *storeFullAPI) storeErrors() map[string]float64 {
	a.t.Helper()
	res, err := http.Get(a.url + "/metrics")
	require.NoError(a.t, err)
	defer res.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), `ledger_store_errors_total{op="`)
		if !ok {
			continue
		}
		op, val, ok := strings.Cut(rest, `"} `)
		require.True(a.t, ok, sc.Text())
		v, err := strconv.ParseFloat(val, 64)
		require.NoError(a.t, err)
		out[op] = v
	}
	require.NoError(a.t, sc.Err())
	return out
}

func sum(m map[string]float64) float64 {
	var n float64
	for _, v := range m {
		n += v
	}
	return n
}

// countErrorLines counts the log lines (JSON) at level ERROR.
func countErrorLines(log string) int {
	return strings.Count(log, `"level":"ERROR"`)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// lastAction is the run's current action.
func lastAction(r server.Run) server.Action { return r.Actions[len(r.Actions)-1] }
