package faultmatrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// The replica cells (replica/…) run two or three `serve` processes on one
// fresh PostgreSQL database, sharing one effect store, with short run
// leases, under load: several runs in flight on each. One of them, the
// victim, carries a fault plan that strikes at an attempt point:
//
//   - kill: it SIGKILLs itself. It is not started again: its runs must be
//     claimed by a surviving replica and recovered there. With two
//     replicas the survivor sees at once that the victim's process is gone
//     (same host); the three replicas are named (LEDGER_LEASE_OWNER), as
//     replicas on different hosts are, so the survivors wait until the
//     victim's leases lapse.
//   - stop: it SIGSTOPs itself, holding its runs' leases. A surviving
//     replica takes them over once the leases lapse and settles every run;
//     only then is the victim sent SIGCONT, and whatever it still does is
//     refused by the fence (or kept as a stale_holder observation): nothing
//     it writes changes a run, no call of its makes a second effect. At
//     before_tool_call the victim is frozen between its lease check and its
//     call, and its tool ignores the caller's deadline, as a remote service
//     that already has the request would: woken, the victim makes the call,
//     and only the call's fencing token can refuse it (the effect store
//     records it fenced).
//
// Every cell then holds every run to the invariants: never two effects for
// one action (the shared effect store is the witness), every run a submit
// was answered 2xx for is in the database, every run settled (terminal or
// in review) within replicaSettle, every chain verified, and the
// invariants of runInvariants. The expectation of a replica cell is about
// its runs together: State is what the runs whose attempt the fault
// interrupted end in (the others complete), Effects and Attempts the most
// any one action may have.

// replicaCell is how a replica cell runs.
type replicaCell struct {
	replicas int
	point    engine.FaultPoint
	// stop freezes the victim (SIGSTOP, then SIGCONT) instead of killing it.
	stop bool
	// fenceOnly gives the tool simulator.ToolConfig.IgnoreDeadline: the
	// woken victim's calls are refused by their fencing token or not at
	// all, and the cell requires a call recorded fenced.
	fenceOnly bool
}

// named reports whether the cell's replicas are named lease owners, whose
// death another replica cannot see from the pid: the three-replica kill
// cells, where the takeover waits for the victim's leases to lapse.
func (c *replicaCell) named() bool { return !c.stop && c.replicas == 3 }

const (
	// replicaLeaseTTL is the replicas' --lease-ttl: short, so that a
	// frozen replica's leases lapse soon.
	replicaLeaseTTL = 1500 * time.Millisecond
	// replicaToolTimeout is cards.write's call timeout in the replica
	// cells: the engine calls the tool only while its lease outlasts the
	// call by a third of the TTL, so a longer timeout would stretch the
	// leases of the runs whose calls are out.
	replicaToolTimeout = 500
	// replicaCallDelay is how long each call takes in the stop cells.
	replicaCallDelay = 200 * time.Millisecond
	// replicaRuns is how many runs each replica is sent in a burst.
	replicaRuns = 3
	// replicaSettle bounds the time every run has to settle.
	replicaSettle = 45 * time.Second
	// replicaReady bounds the time a woken replica takes to be ready: a
	// lease's renewal, and the store health's hold of 2 s after a failed
	// write should one have failed, with room to spare.
	replicaReady = 8 * time.Second
)

// replicaScenarios are the replica cells: SIGKILL with two and three
// replicas at each attempt point (tool with every guarantee), and where a
// tool without any guarantee makes the difference (after the attempt was
// recorded, after the tool acted: recovery must hand the run to a person,
// never call again); SIGSTOP with two replicas at each attempt point, with
// a tool that does not deduplicate, so that a second call would show as a
// second effect; and SIGSTOP between the lease check and the call, with a
// tool that cannot see the caller's deadline, so that only the fencing
// token stands between the woken victim's call and a second effect.
func replicaScenarios() []*Scenario {
	none := contracts.Guarantees{}
	noDedup := contracts.Guarantees{Query: true, Cancel: true}
	var out []*Scenario
	for _, n := range []int{2, 3} {
		for _, p := range engine.FaultPoints() {
			out = append(out, replicaScenario(replicaCell{replicas: n, point: p}, allOn))
		}
		for _, p := range []engine.FaultPoint{engine.FaultAfterAttemptRecorded, engine.FaultAfterToolCall} {
			out = append(out, replicaScenario(replicaCell{replicas: n, point: p}, none))
		}
	}
	for _, p := range engine.FaultPoints() {
		out = append(out, replicaScenario(replicaCell{replicas: 2, point: p, stop: true}, noDedup))
	}
	return append(out, replicaScenario(replicaCell{replicas: 2, point: engine.FaultBeforeToolCall, stop: true, fenceOnly: true}, noDedup))
}

func replicaScenario(c replicaCell, g contracts.Guarantees) *Scenario {
	kind, fault := "kill", fmt.Sprintf("one of %d replicas on PostgreSQL SIGKILLs itself at %s under load; the others take its runs over", c.replicas, c.point)
	if c.stop {
		kind = "stop"
		fault = fmt.Sprintf("one of %d replicas on PostgreSQL SIGSTOPs itself at %s under load, past its leases; another takes its runs over, then it gets SIGCONT", c.replicas, c.point)
	}
	if c.fenceOnly {
		fault += "; the tool ignores the caller's deadline, so only the fencing token refuses its late call"
	}
	expect := Expectation{State: ledger.RunCompleted, StopReason: ledger.StopCompleted, Effects: 1, Attempts: 2}
	if !g.Query && !g.Dedup && !g.Cancel {
		// Never called again: a person decides.
		expect = Expectation{State: ledger.RunNeedsReview, Effects: 1, Attempts: 1}
	}
	tool := simulator.ToolConfig{TimeoutMS: ptr(int64(replicaToolTimeout))}
	if c.stop {
		// Every call takes a while, so that the victim is frozen with calls
		// of its other runs out, woken past their deadline: none may act.
		tool.Faults = []simulator.Fault{{Kind: simulator.FaultSlow, Delay: replicaCallDelay}}
	}
	tool.IgnoreDeadline = c.fenceOnly
	return &Scenario{Name: fmt.Sprintf("replica/%s/%d/%s/%s", kind, c.replicas, c.point, comboName(g)), Guarantees: g, Fault: fault,
		Expect: expect, AutoApprove: true, tool: tool, replica: &c}
}

// replicaRun is a replica cell: it sets up the database and the replicas,
// drives the load and the fault, and checks the outcome into res.
func replicaRun(ctx context.Context, o Options, sc *Scenario, dir string, res *Result) {
	c := sc.replica
	if c.stop && runtime.GOOS != "linux" {
		res.Skipped, res.Dir = "the SIGSTOP cells read a process's state in /proc (Linux only)", ""
		return
	}
	db, err := newPGDatabase(ctx, PostgresServer(o.Postgres))
	if errors.Is(err, postgres.ErrUnreachable) {
		res.Skipped, res.Dir = err.Error(), ""
		return
	}
	if err != nil {
		res.Failures = append(res.Failures, err.Error())
		return
	}
	r := &replicaDrive{sc: sc, cell: c, db: db, dir: dir, opts: o, acked: map[ledger.RunID]bool{}}
	defer func() {
		r.stopAll(res)
		if len(res.Failures) == 0 {
			if err := db.drop(context.WithoutCancel(ctx)); err != nil {
				res.Failures = append(res.Failures, err.Error())
			}
			return
		}
		res.Failures = append(res.Failures, "database kept: "+db.shown())
	}()
	if err := r.setUp(ctx); err != nil {
		res.Failures = append(res.Failures, err.Error())
		return
	}
	if err := r.drive(ctx); err != nil {
		res.Failures = append(res.Failures, err.Error())
	}
	res.Observed, res.Failures = r.check(ctx, res.Failures)
}

// replicaDrive is one replica cell's state.
type replicaDrive struct {
	sc   *Scenario
	cell *replicaCell
	db   *pgDatabase
	dir  string
	opts Options
	// hs are the replicas; hs[0] is the victim.
	hs []*harness

	mu    sync.Mutex
	acked map[ledger.RunID]bool // every run a submit was answered 2xx for
	keys  int
	// inflight are the submits still out.
	inflight sync.WaitGroup

	faultAt, settledAt time.Time
	// before is what the runs were when the victim was woken (stop cells).
	before map[ledger.RunID]string
	// woke says the victim went on from the point once sent SIGCONT, and
	// readyAfter how long after it the victim answered /readyz 200.
	woke       bool
	readyAfter time.Duration
}

// survivor is a replica that is never struck, to read from.
func (r *replicaDrive) survivor() *harness { return r.hs[1] }

func (r *replicaDrive) setUp(ctx context.Context) error {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return err
	}
	rules := filepath.Join(r.dir, "rules.json")
	if err := os.WriteFile(rules, []byte(`{"schema_version":"1.0","rules":[{"tool":"cards.write","decision":"auto_approve"}]}`), 0o644); err != nil {
		return err
	}
	effects := filepath.Join(r.dir, "effects.db")
	// The schema once, before the replicas start.
	m := newHarness(r.opts.Binary, r.dir)
	m.env = r.opts.Env
	if out, code, err := m.cli("migrate", "--db", r.db.URL); err != nil || code != 0 {
		return fmt.Errorf("migrate %s: exit %d (%v): %s", r.db.shown(), code, err, out)
	}
	for i := range r.cell.replicas {
		d := filepath.Join(r.dir, fmt.Sprintf("replica-%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		h := newHarness(r.opts.Binary, d)
		h.db, h.effectsPath, h.env = r.db.URL, effects, slices.Clone(r.opts.Env)
		if r.cell.named() {
			h.env = append(h.env, fmt.Sprintf("LEDGER_LEASE_OWNER=replica-%d", i))
		}
		// No rate limit: the checks read every run's timeline, often.
		h.args = []string{"--rules", rules, "--effects", effects, "--lease-ttl", replicaLeaseTTL.String(), "--rate-limit", "0"}
		r.hs = append(r.hs, h)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(r.hs))
	for i, h := range r.hs {
		var env []string
		if i == 0 {
			action := ""
			if r.cell.stop {
				action = "stop"
			}
			env = append(env, planEnv(r.cell.point, action))
		}
		wg.Go(func() {
			if err := startScenario(ctx, h, r.sc, env...); err != nil {
				errs[i] = fmt.Errorf("replica %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// submit sends n runs to h, each with a key of its own, without waiting
// for the answers; a run answered 2xx is acknowledged.
func (r *replicaDrive) submit(h *harness, n int) {
	for range n {
		r.mu.Lock()
		r.keys++
		key := fmt.Sprintf("replica-%d", r.keys)
		r.mu.Unlock()
		r.inflight.Go(func() {
			sub, code, err := h.submit(key, nil)
			if err == nil && code/100 == 2 && sub.ID != "" {
				r.mu.Lock()
				r.acked[sub.ID] = true
				r.mu.Unlock()
			}
		})
	}
}

// drive loads the replicas until the victim's fault strikes, then lets
// the survivors settle every run (and, in a stop cell, wakes the victim
// once they have).
func (r *replicaDrive) drive(ctx context.Context) error {
	victim := r.hs[0]
	struck := false
	for burst := 0; burst < 5 && !struck; burst++ {
		// The victim first, so that its pool, woken by its own submits,
		// takes runs before the others poll; then the others, so that they
		// have runs of their own in flight when it is struck.
		r.submit(victim, replicaRuns)
		for _, h := range r.hs[1:] {
			r.submit(h, replicaRuns)
		}
		var err error
		if struck, err = r.waitStruck(ctx, 5*time.Second); err != nil {
			return err
		}
	}
	if !struck {
		return fmt.Errorf("the fault plan did not strike the victim (%s) within 5 bursts of runs", r.cell.point)
	}
	r.faultAt = time.Now()
	if !r.cell.stop {
		r.inflight.Wait() // the victim's answers are lost; the others come
		return r.settle(ctx)
	}
	// Frozen: the others take its runs over once its leases lapse, and
	// settle every run that exists.
	if err := r.settle(ctx); err != nil {
		return fmt.Errorf("while the victim was frozen: %w", err)
	}
	var err error
	if r.before, err = r.snapshot(); err != nil {
		return err
	}
	victim.mu.Lock()
	from := victim.logs.Len()
	victim.mu.Unlock()
	if err := victim.proc.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT: %w", err)
	}
	woken := time.Now()
	// Woken, it goes on from the point (the plan says so in its log): its
	// next write is fenced (or, an idempotent replay, writes nothing), its
	// call is not made for want of a lease (at before_tool_call, the lease
	// checked already, it is made: the tool refuses it by its fencing
	// token, or by its deadline, passed by then), and its next renewal no
	// longer returns the leases it held. It is given a lease's TTL to do
	// what it still would; all of it is checked against the runs as they
	// were.
	deadline := time.Now().Add(15 * time.Second)
	for !r.woke && time.Now().Before(deadline) {
		victim.mu.Lock()
		r.woke = strings.Contains(victim.logs.String()[from:], "fault plan: woken")
		victim.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	// Woken, it is soon ready again: the write its frozen session held,
	// which the server ended, runs again on a new session and meets the
	// lost lease, rather than marking its store failing.
	if err := r.waitReady(ctx, victim, woken); err != nil {
		return err
	}
	select {
	case <-time.After(max(0, replicaLeaseTTL-time.Since(woken))):
	case <-ctx.Done():
		return ctx.Err()
	}
	if r.cell.fenceOnly {
		// Its call reaches the tool, which refuses it by its token.
		if err := r.waitFenced(ctx, deadline); err != nil {
			return err
		}
	}
	if r.cell.point == engine.FaultAfterToolCall || r.cell.point == engine.FaultBeforeToolCall {
		// Its call's outcome arrives after the takeover: kept as evidence.
		if err := r.waitStaleHolder(ctx, deadline); err != nil {
			return err
		}
	}
	// Submits it answered once woken add runs; they are settled too.
	r.inflight.Wait()
	return r.settle(ctx)
}

// waitReady waits until h answers /readyz 200, at most replicaReady after
// since.
func (r *replicaDrive) waitReady(ctx context.Context, h *harness, since time.Time) error {
	for {
		code, err := h.do(http.MethodGet, "/readyz", nil, nil, nil)
		if err == nil && code == http.StatusOK {
			r.readyAfter = time.Since(since)
			return nil
		}
		if time.Since(since) > replicaReady {
			return fmt.Errorf("the woken replica was not ready within %s of SIGCONT (last /readyz: %d, %v)", replicaReady, code, err)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitStruck waits up to d for the victim to be killed (kill cells) or
// frozen (stop cells).
func (r *replicaDrive) waitStruck(ctx context.Context, d time.Duration) (bool, error) {
	victim := r.hs[0]
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if r.cell.stop {
			if stopped, err := Stopped(victim.proc.Process.Pid); err == nil && stopped {
				return true, nil
			}
		}
		select {
		case err := <-victim.exited:
			victim.exited <- err
			var exit *exec.ExitError
			if !r.cell.stop && errors.As(err, &exit) {
				if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
					return true, nil
				}
			}
			return false, fmt.Errorf("the victim exited (%v) without its fault plan: %s", err, victim.tail())
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false, nil
}

// Stopped reports whether the process pid is stopped by a signal
// (SIGSTOP; state T in /proc/PID/stat, so Linux only): how the replica
// cells, and the fault plan's own tests, see that a stop plan struck.
func Stopped(pid int) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, err
	}
	// pid (comm) state …: comm may hold spaces, so read after the last ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) == 0 {
		return false, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return fields[0] == "T", nil
}

// listRuns lists every run of the database, through a survivor.
func (r *replicaDrive) listRuns() ([]server.RunSummary, error) {
	var out []server.RunSummary
	cursor := ""
	for {
		path := "/v1/runs?limit=100"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		var page server.RunList
		if _, err := r.survivor().do(http.MethodGet, path, nil, nil, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Runs...)
		if page.NextCursor == "" {
			return out, nil
		}
		cursor = page.NextCursor
	}
}

// settle waits until every run of the database is terminal or in review.
func (r *replicaDrive) settle(ctx context.Context) error {
	deadline := time.Now().Add(replicaSettle)
	for {
		runs, err := r.listRuns()
		if err == nil {
			open := ""
			for _, s := range runs {
				if !s.State.Terminal() && s.State != ledger.RunNeedsReview {
					open = fmt.Sprintf("run %s is still %s", s.ID, s.State)
					break
				}
			}
			if open == "" {
				r.settledAt = time.Now()
				return nil
			}
			err = errors.New(open)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled within %s of the fault: %w", replicaSettle, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// snapshot is what each run is: its state and each action's state and
// attempts, as a string to compare.
func (r *replicaDrive) snapshot() (map[ledger.RunID]string, error) {
	runs, err := r.listRuns()
	if err != nil {
		return nil, err
	}
	out := map[ledger.RunID]string{}
	for _, s := range runs {
		run, err := r.survivor().run(s.ID)
		if err != nil {
			return nil, err
		}
		out[s.ID] = snapshotOf(run)
	}
	return out, nil
}

// staleHolders counts the stale_holder observations of a timeline.
func staleHolders(tl server.Timeline) int {
	n := 0
	for _, e := range tl.Events {
		var d struct{ Source string }
		if e.Type == "observation.recorded" && json.Unmarshal(e.Data, &d) == nil && d.Source == string(ledger.ObservedStaleHolder) {
			n++
		}
	}
	return n
}

// waitStaleHolder waits until some run has a stale_holder observation.
func (r *replicaDrive) waitStaleHolder(ctx context.Context, deadline time.Time) error {
	for {
		runs, err := r.listRuns()
		if err != nil {
			return err
		}
		for _, s := range runs {
			if tl, err := r.survivor().timeline(s.ID); err == nil && staleHolders(tl) > 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("the woken victim's late call outcome was not kept as a stale_holder observation")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// fencedCalls are the calls the effect store refused by their fencing
// token.
func (r *replicaDrive) fencedCalls(ctx context.Context) (int, error) {
	calls, err := r.survivor().calls(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range calls {
		if c.Outcome == simulator.CallFenced {
			n++
		}
	}
	return n, nil
}

// waitFenced waits until the effect store has refused a call by its
// fencing token, or (a build without the token check) has a second effect
// for one action, which check reports.
func (r *replicaDrive) waitFenced(ctx context.Context, deadline time.Time) error {
	for {
		n, err := r.fencedCalls(ctx)
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		effects, err := r.survivor().effects(ctx)
		if err != nil {
			return err
		}
		keys := map[string]bool{}
		for _, e := range effects {
			if keys[e.DedupKey] {
				return nil
			}
			keys[e.DedupKey] = true
		}
		if time.Now().After(deadline) {
			return errors.New("the woken victim's call was not refused by its fencing token (no call recorded fenced)")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopAll ends every replica still running (a frozen one is woken first).
func (r *replicaDrive) stopAll(res *Result) {
	for i, h := range r.hs {
		h.mu.Lock()
		proc := h.proc
		h.mu.Unlock()
		if proc == nil {
			continue
		}
		if i == 0 && r.cell.stop {
			_ = proc.Process.Signal(syscall.SIGCONT)
		}
		if i == 0 && !r.cell.stop {
			continue // killed by its plan (or reported already)
		}
		if err := h.stop(); err != nil {
			res.Failures = append(res.Failures, fmt.Sprintf("stop replica %d: %v", i, err))
		}
	}
	// Each replica's log, to look into should the cell fail.
	for _, h := range r.hs {
		h.mu.Lock()
		logs := append([]byte(nil), h.logs.Bytes()...)
		h.mu.Unlock()
		_ = os.WriteFile(filepath.Join(h.dir, "serve.log"), logs, 0o644)
	}
}

// check holds every run of the database to the invariants and the cell's
// expectation.
func (r *replicaDrive) check(ctx context.Context, failures []string) (Observed, []string) {
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	obs := Observed{Replicas: r.cell.replicas, ChainOK: true}
	if !r.faultAt.IsZero() && !r.settledAt.IsZero() {
		obs.SettleMS = r.settledAt.Sub(r.faultAt).Milliseconds()
		obs.ReadyMS = r.readyAfter.Milliseconds()
	}
	summaries, err := r.listRuns()
	if err != nil {
		fail("list runs: %v", err)
		return obs, failures
	}
	effects, err := r.survivor().effects(ctx)
	if err != nil {
		fail("read the effect store: %v", err)
		return obs, failures
	}
	obs.Runs = len(summaries)
	listed := map[ledger.RunID]bool{}
	for _, s := range summaries {
		listed[s.ID] = true
	}
	r.mu.Lock()
	for id := range r.acked {
		if !listed[id] {
			fail("run %s was acknowledged (2xx) but is not in the database", id)
		}
	}
	r.mu.Unlock()

	// Never two effects for one action: the shared store is the witness.
	perKey := map[string][]simulator.Effect{}
	for _, e := range effects {
		perKey[e.DedupKey] = append(perKey[e.DedupKey], e)
		if len(perKey[e.DedupKey]) == 2 {
			fail("two effects for action with dedup key %s", e.DedupKey)
		}
		obs.Effects = max(obs.Effects, len(perKey[e.DedupKey]))
	}
	owned := map[string]bool{}
	none := !r.sc.Guarantees.Query && !r.sc.Guarantees.Dedup && !r.sc.Guarantees.Cancel
	states := map[ledger.RunState]int{}
	for _, s := range summaries {
		run, err := r.survivor().run(s.ID)
		if err != nil {
			fail("read run %s: %v", s.ID, err)
			continue
		}
		tl, err := r.survivor().timeline(s.ID)
		if err != nil {
			fail("read the timeline of %s: %v", s.ID, err)
			continue
		}
		states[run.State]++
		if !run.State.Terminal() && run.State != ledger.RunNeedsReview {
			fail("run %s is stuck %s", run.ID, run.State)
		}
		if !tl.Chain.OK {
			obs.ChainOK = false
			fail("the chain of run %s is broken at event %d: %s", run.ID, tl.Chain.BrokenSeq, tl.Chain.Reason)
		}
		obs.StaleHolders += staleHolders(tl)
		var mine []simulator.Effect
		for _, a := range run.Actions {
			owned[a.DedupKey] = true
			mine = append(mine, perKey[a.DedupKey]...)
			obs.Attempts = max(obs.Attempts, len(a.Attempts))
			if a.State == ledger.ActionNeedsReview {
				obs.Reviews++
			}
			interrupted := slices.ContainsFunc(a.Attempts, func(at server.Attempt) bool {
				return at.Error != nil && at.Error.Code == "interrupted"
			})
			if interrupted {
				obs.Interrupted++
				// Recovered by a survivor: with no guarantee never called
				// again, with some settled.
				switch {
				case none && (a.State != ledger.ActionNeedsReview || len(a.Attempts) != 1):
					fail("action %s, interrupted, of a tool without guarantees is %s after %d attempts, want needs_review after 1",
						a.ID, a.State, len(a.Attempts))
				case !none && a.State != ledger.ActionSucceeded:
					fail("action %s, interrupted, is %s, want succeeded", a.ID, a.State)
				}
			}
			if a.Tool == simulator.CardsWriteTool && run.State == ledger.RunCompleted && len(perKey[a.DedupKey]) != 1 {
				fail("run %s completed with %d effects for its action %s", run.ID, len(perKey[a.DedupKey]), a.ID)
			}
		}
		for _, f := range runInvariants(run, tl, mine) {
			fail("run %s: %s", run.ID, f)
		}
		if r.before != nil {
			if was, ok := r.before[run.ID]; ok {
				if now := snapshotOf(run); now != was {
					fail("run %s changed after the frozen replica woke: %s, then %s", run.ID, was, now)
				}
			}
		}
	}
	for key := range perKey {
		if !owned[key] {
			fail("an effect (%s) belongs to no action of any run", key)
		}
	}
	// The runs together: all completed, or, where a person must decide, some
	// in review and the rest completed.
	switch {
	case states[ledger.RunNeedsReview] > 0:
		obs.State = ledger.RunNeedsReview
	case states[ledger.RunCompleted] == len(summaries) && len(summaries) > 0:
		obs.State, obs.StopReason = ledger.RunCompleted, ledger.StopCompleted
	default:
		for st := range states {
			if st != ledger.RunCompleted {
				obs.State = st
			}
		}
	}
	if n := states[ledger.RunCompleted] + states[ledger.RunNeedsReview]; n != len(summaries) {
		fail("%d of %d runs neither completed nor in review: %v", len(summaries)-n, len(summaries), states)
	}
	e := r.sc.Expect
	if obs.State != e.State {
		fail("the runs end %s, want %s (%v)", obs.State, e.State, states)
	}
	if obs.Effects > e.Effects {
		fail("an action has %d effects, want at most %d", obs.Effects, e.Effects)
	}
	if obs.Attempts > e.Attempts {
		fail("an action has %d attempts, want at most %d", obs.Attempts, e.Attempts)
	}
	// Under load: at least a burst's runs in the database when the victim
	// was struck. Not one per replica: the victim may be struck on a run
	// another replica took in, before its own submits were written.
	if obs.Runs < replicaRuns {
		fail("only %d runs: not under load", obs.Runs)
	}
	switch r.cell.point {
	case engine.FaultAfterAttemptRecorded, engine.FaultBeforeToolCall, engine.FaultAfterToolCall:
		// The struck attempt was left started: a survivor recovered it.
		if obs.Interrupted == 0 {
			fail("no interrupted attempt was recovered: the victim's run was not taken over")
		}
	}
	if r.cell.stop {
		if !r.woke {
			fail("the frozen replica did not go on within 15s of SIGCONT")
		}
		if (r.cell.point == engine.FaultAfterToolCall || r.cell.point == engine.FaultBeforeToolCall) && obs.StaleHolders == 0 {
			fail("the woken replica's late outcome was not kept as a stale_holder observation")
		}
	}
	if r.cell.fenceOnly {
		n, err := r.fencedCalls(ctx)
		switch {
		case err != nil:
			fail("read the effect store's calls: %v", err)
		case n == 0:
			fail("no call was refused by its fencing token: the woken replica's call was not fenced")
		}
		obs.Fenced = n
	}
	return obs, failures
}

// snapshotOf is snapshot's string for one run.
func snapshotOf(run server.Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s", run.State, run.StopReason)
	for _, a := range run.Actions {
		fmt.Fprintf(&b, " %s:%s", a.ID, a.State)
		for _, at := range a.Attempts {
			fmt.Fprintf(&b, ",%s=%s/%s", at.ID, at.Status, at.Effect)
		}
	}
	return b.String()
}
