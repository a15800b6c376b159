package faultmatrix

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// Options runs the matrix.
type Options struct {
	// Binary is the `ledger` executable to start; the runner builds nothing.
	Binary string
	// Dir holds one working directory per scenario; "" means a new
	// temporary directory, removed afterwards unless a scenario failed.
	Dir string
	// Filter keeps the scenarios whose name equals it or starts with it
	// followed by "/"; "" keeps all.
	Filter string
	// Seed orders the scenarios (the same seed, the same order).
	Seed uint64
	// Parallel is how many scenarios run at once; 0 means 3.
	Parallel int
	// Env is added to every process the runner starts (for example a broken
	// test build's LEDGER_BROKEN).
	Env []string
	// Progress gets one line per finished scenario.
	Progress io.Writer
	// Python is the interpreter of the client-driven scenarios' agent; ""
	// means python3 on PATH. Without one they are skipped.
	Python string
	// PythonClient is the directory holding the ledger_client package
	// (the repository's clients/python); "" means found upward from the
	// working directory or from Binary. Without it they are skipped.
	PythonClient string
	// Postgres is the PostgreSQL server of the replica cells, a postgres://
	// URL of any database on it whose user may create databases; "" means
	// PostgresServer's default. Where it cannot be reached they are
	// skipped.
	Postgres string
}

// Result is one scenario's verdict.
type Result struct {
	Name       string               `json:"name"`
	Guarantees contracts.Guarantees `json:"guarantees"`
	Fault      string               `json:"fault"`
	Expect     Expectation          `json:"expect"`
	Observed   Observed             `json:"observed"`
	Passed     bool                 `json:"passed"`
	// Skipped says why the scenario did not run (it then neither passed
	// nor failed).
	Skipped  string   `json:"skipped,omitempty"`
	Failures []string `json:"failures,omitempty"`
	Seconds  float64  `json:"seconds"`
	Dir      string   `json:"dir,omitempty"`
}

// Observed is what the scenario ended with, read from the server and from
// the simulator's own effect store.
type Observed struct {
	RunID      ledger.RunID      `json:"run_id,omitempty"`
	State      ledger.RunState   `json:"state,omitempty"`
	StopReason ledger.StopReason `json:"stop_reason,omitempty"`
	Effects    int               `json:"effects"`
	Attempts   int               `json:"attempts"`
	Reviews    int               `json:"reviews"`
	ChainOK    bool              `json:"chain_ok"`

	// A replica cell's (replicas.go), about its runs together: Effects and
	// Attempts are then the most of any one action, Reviews the actions in
	// review, ChainOK every run's chain.

	// Replicas is how many serve processes shared the database.
	Replicas int `json:"replicas,omitempty"`
	// Runs is how many runs the database held at the end.
	Runs int `json:"runs,omitempty"`
	// SettleMS is how long after the fault every run was settled (a
	// client-gone cell's: its one run, in review).
	SettleMS int64 `json:"settle_ms,omitempty"`
	// Interrupted is how many actions had an attempt a survivor found
	// interrupted and recovered.
	Interrupted int `json:"interrupted,omitempty"`
	// StaleHolders is how many stale_holder observations were recorded:
	// late outcomes of a replica that had lost the run's lease.
	StaleHolders int `json:"stale_holders,omitempty"`
	// ReadyMS is how long after SIGCONT a frozen replica answered /readyz
	// 200 (stop cells).
	ReadyMS int64 `json:"ready_ms,omitempty"`
	// Fenced is how many calls the effect store refused by their fencing
	// token (the stop cell at before_tool_call).
	Fenced int `json:"fenced,omitempty"`
}

// Report is the machine-readable result (contracts faultmatrix_report).
type Report struct {
	SchemaVersion string    `json:"schema_version"`
	Seed          uint64    `json:"seed"`
	StartedAt     time.Time `json:"started_at"`
	Seconds       float64   `json:"seconds"`
	Total         int       `json:"total"`
	Passed        int       `json:"passed"`
	Failed        int       `json:"failed"`
	Skipped       int       `json:"skipped,omitempty"`
	Scenarios     []Result  `json:"scenarios"`
}

// Select returns the catalogue's scenarios the filter keeps, in the seed's
// order.
func Select(filter string, seed uint64) []*Scenario {
	var out []*Scenario
	for _, sc := range Catalogue() {
		if filter == "" || sc.Name == filter || strings.HasPrefix(sc.Name, filter+"/") {
			out = append(out, sc)
		}
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// Run runs the selected scenarios and returns the report. An error means
// the matrix could not run at all; failed expectations are in the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Binary == "" {
		return nil, fmt.Errorf("faultmatrix: no ledger binary")
	}
	if _, err := os.Stat(o.Binary); err != nil {
		return nil, fmt.Errorf("faultmatrix: %w", err)
	}
	scenarios := Select(o.Filter, o.Seed)
	if len(scenarios) == 0 {
		return nil, fmt.Errorf("faultmatrix: no scenario matches %q", o.Filter)
	}
	dir, cleanup := o.Dir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "ledger-faultmatrix-")
		if err != nil {
			return nil, err
		}
		dir, cleanup = d, true
	}
	if o.Parallel <= 0 {
		o.Parallel = 3
	}
	rep := &Report{SchemaVersion: "1.0", Seed: o.Seed, StartedAt: time.Now().UTC(), Total: len(scenarios)}
	results := make([]Result, len(scenarios))
	sem := make(chan struct{}, o.Parallel)
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for i, sc := range scenarios {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			res := runOne(ctx, o, sc, filepath.Join(dir, fmt.Sprintf("%02d-%s", i, strings.ReplaceAll(sc.Name, "/", "_"))))
			results[i] = res
			if o.Progress != nil {
				mu.Lock()
				verdict, detail := "ok  ", strings.Join(res.Failures, "; ")
				switch {
				case res.Skipped != "":
					verdict, detail = "skip", res.Skipped
				case !res.Passed:
					verdict = "FAIL"
				}
				fmt.Fprintf(o.Progress, "%s %-58s %6.2fs %s\n", verdict, res.Name, res.Seconds, detail)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(results, func(a, b Result) int { return strings.Compare(a.Name, b.Name) })
	rep.Scenarios = results
	for _, r := range results {
		if r.Skipped != "" {
			rep.Skipped++
			continue
		}
		if r.Passed {
			rep.Passed++
		} else {
			rep.Failed++
		}
	}
	rep.Seconds = time.Since(rep.StartedAt).Seconds()
	if cleanup && rep.Failed == 0 {
		_ = os.RemoveAll(dir)
	}
	return rep, nil
}

// runOne drives one scenario in its own directory and checks it.
func runOne(ctx context.Context, o Options, sc *Scenario, dir string) (res Result) {
	start := time.Now()
	res = Result{Name: sc.Name, Guarantees: sc.Guarantees, Fault: sc.Fault, Expect: sc.Expect, Dir: dir}
	defer func() {
		res.Seconds = time.Since(start).Seconds()
		res.Passed = len(res.Failures) == 0 && res.Skipped == ""
	}()
	if sc.replica != nil {
		replicaRun(ctx, o, sc, dir, &res)
		return res
	}
	h := newHarness(o.Binary, dir)
	h.env = o.Env
	if sc.python {
		py, client, err := findPython(o.Python, o.PythonClient, o.Binary)
		if err != nil {
			res.Skipped, res.Dir = err.Error(), ""
			return res
		}
		h.python, h.pyClient = py, client
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		res.Failures = append(res.Failures, err.Error())
		return res
	}
	if sc.AutoApprove {
		rules := filepath.Join(dir, "rules.json")
		if err := os.WriteFile(rules, []byte(`{"schema_version":"1.0","rules":[{"tool":"cards.write","decision":"auto_approve"}]}`), 0o644); err != nil {
			res.Failures = append(res.Failures, err.Error())
			return res
		}
		h.args = []string{"--rules", rules}
	}
	defer func() {
		if err := h.stop(); err != nil {
			res.Failures = append(res.Failures, "stop: "+err.Error())
		}
	}()
	id, err := sc.drive(ctx, h, sc)
	if err != nil {
		res.Failures = append(res.Failures, err.Error())
		if id == "" {
			return res
		}
	}
	res.Observed, res.Failures = check(ctx, h, sc, id, res.Failures)
	return res
}

// check reads the outcome and holds it to the invariants and to the
// scenario's expectation.
func check(ctx context.Context, h *harness, sc *Scenario, id ledger.RunID, failures []string) (Observed, []string) {
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	obs := Observed{RunID: id, SettleMS: h.settle.Milliseconds()}
	run, err := h.run(id)
	if err != nil {
		fail("read run: %v", err)
		return obs, failures
	}
	obs.State, obs.StopReason = run.State, run.StopReason
	effects, err := h.effects(ctx)
	if err != nil {
		fail("read the effect store: %v", err)
		return obs, failures
	}
	obs.Effects = len(effects)
	tl, err := h.timeline(id)
	if err != nil {
		fail("read timeline: %v", err)
		return obs, failures
	}
	obs.ChainOK = tl.Chain.OK

	for _, a := range run.Actions {
		obs.Attempts += len(a.Attempts)
		if a.State == ledger.ActionNeedsReview {
			obs.Reviews++
		}
	}
	// Never two effects for one action: the tool's own store, keyed by
	// dedup key, is the witness.
	perKey := map[string]int{}
	for _, e := range effects {
		if perKey[e.DedupKey]++; perKey[e.DedupKey] == 2 {
			fail("two effects for action with dedup key %s", e.DedupKey)
		}
	}
	failures = append(failures, runInvariants(run, tl, effects)...)
	switch {
	case sc.Expect.Tampered && tl.Chain.OK:
		fail("the chain verifies although an event was edited")
	case !sc.Expect.Tampered && !tl.Chain.OK:
		fail("the chain is broken at event %d: %s", tl.Chain.BrokenSeq, tl.Chain.Reason)
	}
	// The expectation of the recovery table.
	e := sc.Expect
	if obs.State != e.State {
		fail("run is %s (%s), want %s", obs.State, obs.StopReason, e.State)
	}
	if e.StopReason != "" && obs.StopReason != e.StopReason {
		fail("stop reason %s, want %s", obs.StopReason, e.StopReason)
	}
	if obs.Effects != e.Effects {
		fail("%d effects in the tool's store, want %d", obs.Effects, e.Effects)
	}
	if obs.Attempts != e.Attempts {
		fail("%d attempts, want %d", obs.Attempts, e.Attempts)
	}
	return obs, failures
}

// runInvariants holds one run to what must hold whatever the fault: no
// effect the tool made (effects, those of the run's actions) is lost,
// every unknown effect is in review with a recorded rationale, and an
// attempt keeps an unknown effect only where the action's fate is settled
// otherwise. Two effects for one action are the caller's to count: the
// effects may be a shared store's.
func runInvariants(run server.Run, tl server.Timeline, effects []simulator.Effect) []string {
	var failures []string
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	actions := map[string]server.Action{}
	for _, a := range run.Actions {
		actions[a.DedupKey] = a
	}
	for _, e := range effects {
		// No effect the tool made is lost: its action is succeeded or in
		// review, never failed, cancelled or forgotten.
		a, ok := actions[e.DedupKey]
		switch {
		case !ok:
			fail("an effect (%s) belongs to no action of the run", e.DedupKey)
		case a.State != ledger.ActionSucceeded && a.State != ledger.ActionNeedsReview:
			fail("action %s is %s though the tool acted", a.ID, a.State)
		}
	}
	// Every unknown effect ends in review, with a rationale.
	reviewed := map[string]bool{}
	for _, e := range tl.Events {
		var d struct{ Decision, Rationale string }
		if e.Type == "recovery.decision" && json.Unmarshal(e.Data, &d) == nil && d.Decision == "review" {
			if d.Rationale == "" {
				fail("a review decision without a rationale (event %d)", e.Seq)
			}
			reviewed[e.EntityID] = true
		}
	}
	for _, a := range run.Actions {
		if a.State != ledger.ActionNeedsReview {
			continue
		}
		if !reviewed[string(a.ID)] {
			fail("action %s is in review without a recorded review decision", a.ID)
		}
		if n := len(a.Attempts); n == 0 || a.Attempts[n-1].Effect != ledger.EffectUnknown {
			fail("action %s is in review though its effect is known", a.ID)
		}
	}
	for _, a := range run.Actions {
		for _, at := range a.Attempts {
			// An attempt may keep an unknown effect only where the action's
			// fate is settled otherwise: in review, or succeeded once
			// through the tool's dedup.
			if at.Effect == ledger.EffectUnknown && a.State != ledger.ActionNeedsReview && a.State != ledger.ActionSucceeded {
				fail("attempt %s of action %s (%s) has an unknown effect outside review", at.ID, a.ID, a.State)
			}
		}
	}
	return failures
}

// WriteTable prints the final table: one line per scenario and the totals.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tRESULT\tRUN\tEFFECTS\tATTEMPTS\tREVIEWS\tCHAIN\tSECONDS")
	for _, s := range r.Scenarios {
		verdict := "pass"
		switch {
		case s.Skipped != "":
			verdict = "skip"
		case !s.Passed:
			verdict = "FAIL"
		}
		state := string(s.Observed.State)
		if s.Observed.StopReason != "" {
			state += "/" + string(s.Observed.StopReason)
		}
		chain := "ok"
		if !s.Observed.ChainOK {
			chain = "broken"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%.2f\n", s.Name, verdict, state, s.Observed.Effects, s.Observed.Attempts,
			s.Observed.Reviews, chain, s.Seconds)
	}
	skipped := ""
	if r.Skipped > 0 {
		skipped = fmt.Sprintf(", %d skipped", r.Skipped)
	}
	fmt.Fprintf(tw, "\n%d scenarios: %d passed, %d failed%s in %.1fs (seed %d)\n", r.Total, r.Passed, r.Failed, skipped, r.Seconds, r.Seed)
	for _, s := range r.Scenarios {
		if s.Skipped != "" {
			fmt.Fprintf(tw, "skipped: %s\n", s.Skipped)
			break
		}
	}
	return tw.Flush()
}

// ValidateReport checks a report document against its schema.
func ValidateReport(doc []byte) error {
	return contracts.Validate(contracts.SchemaFaultMatrixReport, doc)
}
