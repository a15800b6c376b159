package faultmatrix

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// The write loop kills the real binary at every store write of a
// representative run, as SQLite's own I/O-error tests fail every I/O in
// turn: for i = 1, 2, … it starts `ledger serve` with the plan
// {"action": "kill", "write": i, "at": …}, drives one run as a client
// would (submit with an Idempotency-Key and send it again if the answer
// was lost; approve while the run waits for approval), lets the plan kill
// the process at its i-th write, starts it again without a plan, lets the
// run finish and checks what survived. The loop ends at the first i the
// run finishes without reaching: that run needed i-1 writes.

// WritePath is the representative run a write loop drives.
type WritePath string

// Write paths.
const (
	// WritePathApproval: default rules, so cards.write waits for a person,
	// who approves it over HTTP.
	WritePathApproval WritePath = "approval"
	// WritePathAuto: a --rules file approves cards.write, so the action and
	// its first attempt are recorded in one write.
	WritePathAuto WritePath = "auto"
)

// WriteOptions runs write loops.
type WriteOptions struct {
	// Binary is the `ledger` executable to start.
	Binary string
	// Dir holds one directory per crash; "" means a temporary directory,
	// removed afterwards unless a check failed.
	Dir string
	// Paths and Points choose the loops, one per pair; nil means both
	// paths and both points.
	Paths  []WritePath
	Points []ledger.WritePoint
	// Stride tests every Stride-th write (1, 1+Stride, …); 0 means 1,
	// every write. The loop still ends at the first write a run does not
	// reach.
	Stride int
	// MaxWrites bounds each loop, in case a run never ends; 0 means 200.
	MaxWrites int
	// Parallel is how many loops run at once; 0 means 2.
	Parallel int
	// StopAtFailure ends a loop at its first crash whose checks fail,
	// for a run that only has to show the loop can fail (a broken test
	// build): the crashes after it would cost time and prove nothing more.
	StopAtFailure bool
	// Env is added to every process (a simulator configuration, a broken
	// test build's LEDGER_BROKEN).
	Env []string
	// Progress gets one line per crash.
	Progress io.Writer
}

// WriteResult is one crash: where it struck and what the checks found.
type WriteResult struct {
	Path  WritePath         `json:"path"`
	At    ledger.WritePoint `json:"at"`
	Write int64             `json:"write"`
	// Killed is false for the write the run never reached: the loop's end.
	Killed     bool              `json:"killed"`
	RunID      ledger.RunID      `json:"run_id,omitempty"`
	State      ledger.RunState   `json:"state,omitempty"`
	StopReason ledger.StopReason `json:"stop_reason,omitempty"`
	Effects    int               `json:"effects"`
	Failures   []string          `json:"failures,omitempty"`
	Seconds    float64           `json:"seconds"`
	Dir        string            `json:"dir,omitempty"`
}

// WriteLoop is one (path, point) loop: how many writes its run took and
// every crash it made.
type WriteLoop struct {
	Path WritePath         `json:"path"`
	At   ledger.WritePoint `json:"at"`
	// Writes is the last write the plan struck at: with Stride 1, N, the
	// writes a run of this path needs.
	Writes  int64         `json:"writes"`
	Results []WriteResult `json:"results"`
}

// WriteReport is what RunWrites found.
type WriteReport struct {
	Loops   []WriteLoop `json:"loops"`
	Crashes int         `json:"crashes"`
	Failed  int         `json:"failed"`
	Seconds float64     `json:"seconds"`
}

// RunWrites runs the write loops. An error means a loop could not run at
// all; failed checks are in the report.
func RunWrites(ctx context.Context, o WriteOptions) (*WriteReport, error) {
	if _, err := os.Stat(o.Binary); err != nil {
		return nil, fmt.Errorf("faultmatrix: %w", err)
	}
	if o.Paths == nil {
		o.Paths = []WritePath{WritePathApproval, WritePathAuto}
	}
	if o.Points == nil {
		o.Points = ledger.WritePoints()
	}
	o.Stride, o.MaxWrites, o.Parallel = max(o.Stride, 1), positiveOr(o.MaxWrites, 200), positiveOr(o.Parallel, 2)
	dir, cleanup := o.Dir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "ledger-writes-")
		if err != nil {
			return nil, err
		}
		dir, cleanup = d, true
	}
	start := time.Now()
	type job struct {
		path WritePath
		at   ledger.WritePoint
	}
	var jobs []job
	for _, p := range o.Paths {
		for _, at := range o.Points {
			jobs = append(jobs, job{p, at})
		}
	}
	rep := &WriteReport{Loops: make([]WriteLoop, len(jobs))}
	sem := make(chan struct{}, o.Parallel)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for k, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			loop, err := writeLoop(ctx, o, j.path, j.at, filepath.Join(dir, string(j.path)+"-"+string(j.at)), &mu)
			mu.Lock()
			defer mu.Unlock()
			rep.Loops[k] = loop
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("write loop %s/%s: %w", j.path, j.at, err)
			}
		})
	}
	wg.Wait()
	for _, l := range rep.Loops {
		for _, r := range l.Results {
			rep.Crashes++
			if len(r.Failures) > 0 {
				rep.Failed++
			}
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	if cleanup && rep.Failed == 0 {
		_ = os.RemoveAll(dir)
	}
	return rep, firstErr
}

// positiveOr is v, or def where v is not positive (unlike cmp.Or, which
// keeps a negative v).
func positiveOr(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// writeLoop runs i = 1, 1+stride, … for one path and point until a run
// ends without reaching write i.
func writeLoop(ctx context.Context, o WriteOptions, path WritePath, at ledger.WritePoint, dir string, progress *sync.Mutex) (WriteLoop, error) {
	loop := WriteLoop{Path: path, At: at}
	for i := int64(1); i <= int64(o.MaxWrites); i += int64(o.Stride) {
		if err := ctx.Err(); err != nil {
			return loop, err
		}
		res := crashAtWrite(ctx, o, path, at, i, filepath.Join(dir, fmt.Sprint(i)))
		loop.Results = append(loop.Results, res)
		if o.Progress != nil {
			progress.Lock()
			verdict := "ok  "
			if len(res.Failures) > 0 {
				verdict = "FAIL"
			}
			what := "killed"
			if !res.Killed {
				what = "not reached: the end"
			}
			fmt.Fprintf(o.Progress, "%s write %-8s %-13s %3d %-22s %s/%s effects=%d %5.2fs %s\n", verdict, path, at, i, what,
				res.State, res.StopReason, res.Effects, res.Seconds, strings.Join(res.Failures, "; "))
			progress.Unlock()
		}
		if !res.Killed {
			return loop, nil
		}
		loop.Writes = i
		if o.StopAtFailure && len(res.Failures) > 0 {
			return loop, nil
		}
	}
	return loop, fmt.Errorf("the run still reached write %d: it never ends", o.MaxWrites)
}

// crashAtWrite is one crash: start serve with the plan, drive the run
// through the kill and the restart, then stop serve and check the files.
func crashAtWrite(ctx context.Context, o WriteOptions, path WritePath, at ledger.WritePoint, i int64, dir string) (res WriteResult) {
	start := time.Now()
	res = WriteResult{Path: path, At: at, Write: i, Dir: dir}
	fail := func(format string, args ...any) { res.Failures = append(res.Failures, fmt.Sprintf(format, args...)) }
	defer func() { res.Seconds = time.Since(start).Seconds() }()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fail("%v", err)
		return res
	}
	h := newHarness(o.Binary, dir)
	h.env = o.Env
	if path == WritePathAuto {
		rules := filepath.Join(dir, "rules.json")
		if err := os.WriteFile(rules, []byte(`{"schema_version":"1.0","rules":[{"tool":"cards.write","decision":"auto_approve"}]}`), 0o644); err != nil {
			fail("%v", err)
			return res
		}
		h.args = []string{"--rules", rules}
	}
	plan := fmt.Sprintf(`LEDGER_FAULT_PLAN={"action":"kill","write":%d,"at":%q}`, i, at)
	d := &writeDriver{h: h, ctx: ctx}
	if err := h.start(ctx, plan); err != nil {
		// The plan may strike before serve listens (a write at start-up).
		if !d.reap() {
			fail("start serve with the plan: %v", err)
			return res
		}
	}
	id, err := d.drive(path)
	res.RunID = id
	if err != nil {
		fail("%v", err)
	}
	// Stop serve for the checks. A process whose plan has not struck yet
	// may still reach write i on its way out; it is then started again,
	// without a plan, as after any other crash.
	for range 2 {
		killed, serr := stopServe(h)
		if serr != nil {
			fail("stop serve: %v", serr)
		}
		if !killed || id == "" || err != nil {
			break
		}
		d.killed = true
		if err := h.start(ctx); err != nil {
			fail("start serve after the crash: %v", err)
			break
		}
		if _, err := h.waitRun(id, wait, finished); err != nil {
			fail("after the crash on the way out: %v", err)
		}
	}
	res.Killed = d.killed
	if id == "" {
		return res
	}
	res.State, res.StopReason, res.Effects, res.Failures = checkWrites(ctx, h, id, path, res.Failures)
	return res
}

// stopServe stops serve gracefully (SIGTERM); killed reports that it had
// died, or died on the way, by SIGKILL: its fault plan's doing, not a
// failure.
func stopServe(h *harness) (killed bool, err error) {
	h.mu.Lock()
	proc, exited := h.proc, h.exited
	h.mu.Unlock()
	if proc == nil {
		return false, nil
	}
	select {
	case err = <-exited: // dead already
	default:
		_ = proc.Process.Signal(syscall.SIGTERM)
		select {
		case err = <-exited:
		case <-time.After(15 * time.Second):
			_ = proc.Process.Kill()
			<-exited
			return false, errors.New("serve ignored SIGTERM for 15s")
		}
	}
	exited <- err // for whoever looks next (harness.stop)
	if killedBySIGKILL(err) {
		return true, nil
	}
	return false, err
}

// writeDriver drives one run through a process that may die at any
// moment: after the death it starts serve again, without a plan, and
// carries on as a client whose request went unanswered.
type writeDriver struct {
	h      *harness
	ctx    context.Context
	killed bool
}

// reap reports whether the process has died; a death by SIGKILL (the
// plan) is noted and serve is started again without a plan. Any other
// death is left for stopServe to report.
func (d *writeDriver) reap() bool {
	d.h.mu.Lock()
	exited := d.h.exited
	d.h.mu.Unlock()
	var err error
	select {
	case err = <-exited:
		exited <- err
	default:
		return false
	}
	if !killedBySIGKILL(err) {
		return false
	}
	d.killed = true
	return d.h.start(d.ctx) == nil
}

// killedBySIGKILL reports whether a process's exit error is a death by
// SIGKILL.
func killedBySIGKILL(err error) bool {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	return false
}

// settle waits briefly for a process whose request failed to be reaped:
// a SIGKILL resets the connection a moment before the exit is seen.
func (d *writeDriver) settle() {
	d.h.mu.Lock()
	exited := d.h.exited
	d.h.mu.Unlock()
	select {
	case err := <-exited:
		exited <- err
	case <-time.After(500 * time.Millisecond):
	}
	d.reap()
}

// drive submits the run and approves it as the run asks, through the
// crash, until it is terminal or in review.
func (d *writeDriver) drive(path WritePath) (ledger.RunID, error) {
	const key = "write-crash-1"
	deadline := time.Now().Add(2 * wait)
	var (
		id   ledger.RunID
		last server.Run
	)
	for time.Now().Before(deadline) {
		d.reap()
		if id == "" {
			sub, _, err := d.h.submit(key, nil)
			if err != nil {
				d.settle() // the answer was lost: send it again once serve is back
				continue
			}
			id = sub.ID
			continue
		}
		r, err := d.h.run(id)
		if err != nil {
			d.settle()
			continue
		}
		last = r
		if finished(r) {
			return id, nil
		}
		if r.State == ledger.RunAwaitingApproval {
			if path == WritePathAuto {
				return id, fmt.Errorf("run %s awaits approval though a rule approves cards.write", id)
			}
			for _, a := range r.Actions {
				if a.State == ledger.ActionAwaitingApproval {
					if _, err := d.h.decide(a.ID, a.ActionDigest, "approve"); err != nil {
						d.settle() // lost, or already decided before a crash: look again
					}
				}
			}
			continue
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-d.ctx.Done():
			return id, d.ctx.Err()
		}
	}
	return id, fmt.Errorf("run %q stuck %s/%s for %s: %s", id, last.State, last.StopReason, 2*wait, d.h.tail())
}

// checkWrites holds what survived the crash to the invariants, reading the
// stopped process's files: `ledger evidence verify`, the store's read
// API for the state of every row against its events (all or nothing), and
// `ledger simulator effects` for the tool's own count.
func checkWrites(ctx context.Context, h *harness, id ledger.RunID, path WritePath, failures []string) (ledger.RunState, ledger.StopReason, int, []string) {
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	if out, code, err := h.cli("evidence", "verify", string(id), "--db", h.db); err != nil || code != 0 {
		fail("evidence verify exited %d (%v): %s", code, err, strings.TrimSpace(out))
	}
	effects, err := cliEffects(h)
	if err != nil {
		fail("simulator effects: %v", err)
	}
	store, err := sqlite.OpenStore(ctx, sqlite.Config{Path: h.db})
	if err != nil {
		fail("open the ledger: %v", err)
		return "", "", len(effects), failures
	}
	defer store.Close()
	f, err := readFacts(ctx, store, id)
	if err != nil {
		fail("read the run: %v", err)
		return "", "", len(effects), failures
	}
	for _, msg := range f.check(path, effects) {
		fail("%s", msg)
	}
	return f.run.State, f.run.StopReason, len(effects), failures
}

// cliEffects reads the tool's own effect store with `ledger simulator
// effects --json`: never through the ledger.
func cliEffects(h *harness) ([]simulator.Effect, error) {
	cmd := exec.Command(h.bin, "simulator", "effects", "--store", h.db+".effects.db", "--json")
	cmd.Env = cleanEnv()
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return nil, fmt.Errorf("%w: %s", err, exit.Stderr)
		}
		return nil, err
	}
	var effects []simulator.Effect
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var e simulator.Effect
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("effect %q: %w", sc.Text(), err)
		}
		effects = append(effects, e)
	}
	return effects, sc.Err()
}

// runFacts is everything the store holds about one run.
type runFacts struct {
	run       *ledger.Run
	actions   []*ledger.Action
	attempts  []*ledger.Attempt
	approvals []*ledger.Approval
	cancel    *ledger.Cancellation
	events    []*ledger.Event
}

func readFacts(ctx context.Context, s *ledger.DB, id ledger.RunID) (*runFacts, error) {
	f := &runFacts{}
	var err error
	if f.run, err = s.FindRunByID(ctx, id); err != nil {
		return nil, err
	}
	if f.actions, err = s.FindActions(ctx, ledger.ActionFilter{RunID: &id}); err != nil {
		return nil, err
	}
	if f.attempts, err = s.FindAttempts(ctx, ledger.AttemptFilter{RunID: &id}); err != nil {
		return nil, err
	}
	if f.approvals, err = s.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &id}); err != nil {
		return nil, err
	}
	if f.cancel, err = s.FindCancellation(ctx, id); err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return nil, err
	}
	if f.events, err = s.FindEvents(ctx, id); err != nil {
		return nil, err
	}
	return f, nil
}

// check is the invariants of a crashed and recovered run.
func (f *runFacts) check(path WritePath, effects []simulator.Effect) []string {
	var out []string
	fail := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	run := f.run
	if !finished(server.Run{State: run.State}) {
		fail("run %s is %s: stuck", run.ID, run.State)
	}

	// All or nothing: every row is in the state its last event put it in,
	// and every state change has its event.
	lastState := map[string]string{}  // entity id → to_state of its last transition
	lastEffect := map[string]string{} // attempt id → its last effect event
	for _, e := range f.events {
		switch {
		case strings.HasPrefix(e.Type, "attempt.effect_"):
			lastEffect[e.EntityID] = e.ToState
		case e.ToState != "":
			lastState[e.EntityID] = e.ToState
		}
	}
	same := func(kind, id, state string) {
		if got, ok := lastState[id]; !ok {
			fail("%s %s is %s without any event", kind, id, state)
		} else if got != state {
			fail("%s %s is %s but its last event says %s", kind, id, state, got)
		}
	}
	same("run", string(run.ID), string(run.State))
	for _, a := range f.actions {
		same("action", string(a.ID), string(a.State))
	}
	for _, at := range f.attempts {
		same("attempt", string(at.ID), string(at.Status))
		if want := lastEffect[string(at.ID)]; want == "" && at.Effect != ledger.EffectUnknown || want != "" && want != string(at.Effect) {
			fail("attempt %s has effect %s but its events say %q", at.ID, at.Effect, want)
		}
	}
	for _, ap := range f.approvals {
		same("approval", string(ap.ID), string(ap.State))
	}
	if f.cancel != nil {
		same("cancellation", string(f.cancel.ID), string(f.cancel.State))
	}
	if int(run.EventSeq) != len(f.events) {
		fail("the run's chain head is at %d but it has %d events", run.EventSeq, len(f.events))
	}

	// Budgets count exactly what was recorded.
	var steps, execUs int64
	for _, e := range f.events {
		var d struct {
			Steps       int64 `json:"steps"`
			ExecutionUs int64 `json:"execution_us"`
			DurationUs  int64 `json:"duration_us"`
		}
		usage := e.Type == "budget.usage"
		finish := e.EntityType == "attempt" && e.FromState == string(ledger.AttemptStarted)
		if !usage && !finish {
			continue
		}
		if err := json.Unmarshal(e.Data, &d); err != nil {
			fail("event %d (%s): %v", e.Seq, e.Type, err)
		}
		steps += d.Steps
		execUs += d.ExecutionUs + d.DurationUs
	}
	if run.Budget.Used.Attempts != int64(len(f.attempts)) {
		fail("the budget counts %d attempts, the run has %d", run.Budget.Used.Attempts, len(f.attempts))
	}
	if run.Budget.Used.Steps != steps {
		fail("the budget counts %d steps, its usage events %d", run.Budget.Used.Steps, steps)
	}
	if run.Budget.Used.Execution.Microseconds() != execUs {
		fail("the budget counts %dµs of execution, its events %dµs", run.Budget.Used.Execution.Microseconds(), execUs)
	}

	// Actions, attempts and approvals agree with each other.
	perAction := map[ledger.ActionID][]*ledger.Attempt{}
	for _, at := range f.attempts {
		perAction[at.ActionID] = append(perAction[at.ActionID], at)
		if at.Status == ledger.AttemptStarted && (run.State.Terminal() || run.State == ledger.RunNeedsReview) {
			fail("attempt %s is still started though the run is %s", at.ID, run.State)
		}
	}
	byKey := map[string]*ledger.Action{}
	for _, a := range f.actions {
		byKey[a.DedupKey] = a
		atts := perAction[a.ID]
		if a.AttemptCount != int64(len(atts)) {
			fail("action %s counts %d attempts, has %d", a.ID, a.AttemptCount, len(atts))
		}
		happened := false
		for _, at := range atts {
			happened = happened || at.Effect == ledger.EffectHappened
		}
		switch a.State {
		case ledger.ActionSucceeded:
			if a.Effect == ledger.EffectWrite && !happened {
				fail("write action %s succeeded with no attempt whose effect happened", a.ID)
			}
		case ledger.ActionNeedsReview:
			if n := len(atts); n == 0 || atts[n-1].Effect != ledger.EffectUnknown {
				fail("action %s is in review though its effect is known", a.ID)
			}
		}
		var granted, pending int
		for _, ap := range f.approvals {
			if ap.ActionID != a.ID {
				continue
			}
			if ap.ActionDigest != a.ActionDigest {
				fail("approval %s is bound to %s, its action's digest is %s", ap.ID, ap.ActionDigest, a.ActionDigest)
			}
			switch ap.State {
			case ledger.ApprovalGranted:
				granted++
			case ledger.ApprovalPending:
				pending++
			}
		}
		if (pending == 1) != (a.State == ledger.ActionAwaitingApproval) || pending > 1 {
			fail("action %s is %s with %d pending approvals", a.ID, a.State, pending)
		}
		ran := len(atts) > 0
		switch {
		case path == WritePathApproval && a.Effect == ledger.EffectWrite && ran && granted != 1:
			fail("write action %s ran with %d granted approvals", a.ID, granted)
		case path == WritePathAuto && len(f.approvals) > 0:
			fail("a rule approves cards.write, yet the run has %d approvals", len(f.approvals))
		}
	}
	if run.State == ledger.RunCompleted {
		for _, a := range f.actions {
			if a.State != ledger.ActionSucceeded {
				fail("run completed with action %s %s", a.ID, a.State)
			}
		}
	}

	// The tool's own store: at most one effect per dedup key, exactly one
	// for the write of a completed run, and none that the ledger lost.
	perKey := map[string]int{}
	for _, e := range effects {
		perKey[e.DedupKey]++
		a, ok := byKey[e.DedupKey]
		switch {
		case perKey[e.DedupKey] == 2:
			fail("two effects for dedup key %s", e.DedupKey)
		case !ok:
			fail("effect %s belongs to no action of the run", e.DedupKey)
		case a.State != ledger.ActionSucceeded && a.State != ledger.ActionNeedsReview:
			fail("action %s is %s though the tool acted", a.ID, a.State)
		}
	}
	if run.State == ledger.RunCompleted {
		for _, a := range f.actions {
			if a.Effect == ledger.EffectWrite && perKey[a.DedupKey] != 1 {
				fail("the run completed with %d effects for action %s", perKey[a.DedupKey], a.ID)
			}
		}
	}
	return out
}
