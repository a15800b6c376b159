package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	_ "github.com/mattn/go-sqlite3" // the "sqlite3" driver of the floor; gorm.io/driver/sqlite registers the same one
	"github.com/spf13/cobra"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// ledger bench measures the service in one process and one run, on fresh
// databases in one directory, and reports every figure beside the floor
// measured in that same run: a raw single-row SQLite commit on the same
// file system with the same synchronous setting (FULL). Machines differ by
// orders of magnitude in fsync cost, and shared machines drift from minute
// to minute; a ratio to a floor taken minutes apart on the same disk
// carries from machine to machine, an absolute figure does not.
// BENCHMARKS.md records a run and the method of each figure.

// Targets of the issue, as ratios on the reference machine (2 cores).
const (
	targetActionRatioC1 = 0.45 // durable action at concurrency 1, × floor commits/s
	targetScalingC32    = 3.0  // actions/s at concurrency 32 ÷ at concurrency 1
	targetRecoveryS     = 1.0  // seconds to scan 10,000 interrupted runs
	targetRecoveryRuns  = 10_000
	targetEvidenceMS    = 200.0 // ms to export a run of 10,000 events
	targetEvidenceN     = 10_000
)

// benchActionsPerRun is how many auto-approved actions each run of the
// action workload takes, as in engine/bench_test.go.
const benchActionsPerRun = 10

// benchConcurrency are the levels of the action workload.
var benchConcurrency = []int{1, 8, 32}

// benchOptions are the flags of ledger bench, defaults applied.
type benchOptions struct {
	dir          string // parent of the run's fresh directory; "" means a temporary one, removed after
	asJSON       bool
	quick        bool
	duration     time.Duration // per action level, per floor half, and for the round trips
	recoveryRuns int
	events       int
	minRoundTrip int // fewest approval round trips, even past duration
}

func newBenchCmd() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the ledger against a raw SQLite commit on the same disk, in one run",
		Long: `Measure, in this process and on fresh databases in a new directory, each figure of
BENCHMARKS.md beside the floor measured in the same run: raw single-row SQLite commits per
second on the same file system with synchronous=FULL.

  floor              raw committed one-row INSERTs, before and after the action workload
  durable action     runs of 10 auto-approved actions of an instant tool through engine.Advance,
                     from 1, 8 and 32 goroutines for --duration each (each action: model step,
                     record, start attempt, finish attempt, each durable before the next)
  approval           submit → approve → completed over the HTTP API on loopback (in-process
                     server, dev mode, the engine's worker pool), p50/p99, and the approve alone
  recovery           one start-up scan over --recovery-runs interrupted runs (query probe)
  evidence           evidence.Build + JSON of a run with --events events
  memory             peak RSS of this whole process, which acts as the server, after the
                     action workload

The table goes to stdout (--json: one JSON object with the machine), progress to stderr.
--quick is a smoke run (300ms levels, small N) that checks everything works; its figures
mean little.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			if o.quick {
				if !f.Changed("duration") {
					o.duration = 300 * time.Millisecond
				}
				if !f.Changed("recovery-runs") {
					o.recoveryRuns = 200
				}
				if !f.Changed("events") {
					o.events = 500
				}
				o.minRoundTrip = 3
			}
			if o.duration <= 0 || o.recoveryRuns < 1 || o.events < 10 {
				return ledger.Errorf(ledger.CodeInvalid, "bench: --duration must be positive, --recovery-runs at least 1, --events at least 10")
			}
			return runBench(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return ledger.Errorf(ledger.CodeInvalid, "%v", err)
	})
	cmd.Flags().StringVar(&o.dir, "dir", "", "make the run's directory in DIR and keep it (default: a temporary directory, removed after)")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print one JSON object instead of the table")
	cmd.Flags().BoolVar(&o.quick, "quick", false, "smoke run: 300ms per level, 200 recovery runs, 500 events")
	cmd.Flags().DurationVar(&o.duration, "duration", 5*time.Second, "how long each action level, each floor half and the round trips run")
	cmd.Flags().IntVar(&o.recoveryRuns, "recovery-runs", targetRecoveryRuns, "interrupted runs the recovery scan decides")
	cmd.Flags().IntVar(&o.events, "events", targetEvidenceN, "events of the exported run")
	o.minRoundTrip = 20
	return cmd
}

// benchFigure is one row of the table and one entry of the JSON.
type benchFigure struct {
	Key   string  `json:"key"`
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// RatioToFloor is, for a rate, value ÷ floor commits/s, and for a
	// time, value ÷ one floor commit's time; nil where neither makes sense.
	RatioToFloor *float64 `json:"ratio_to_floor"`
	Target       string   `json:"target,omitempty"`
	// Met is nil without a target, or when the run's N differs from the
	// target's.
	Met  *bool  `json:"met"`
	Note string `json:"note,omitempty"`
}

// benchMachine says where the figures were measured.
type benchMachine struct {
	NumCPU      int    `json:"nproc"`
	GOMAXPROCS  int    `json:"gomaxprocs"`
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	CPUModel    string `json:"cpu_model,omitempty"`
	MemTotalKiB int64  `json:"mem_total_kib,omitempty"`
	GoVersion   string `json:"go_version"`
	Dir         string `json:"dir"`
	Filesystem  string `json:"filesystem,omitempty"`
}

// benchSettings are the parameters of the run.
type benchSettings struct {
	Quick          bool    `json:"quick"`
	DurationS      float64 `json:"duration_s"`
	Synchronous    string  `json:"synchronous"`
	Concurrency    []int   `json:"concurrency"`
	ActionsPerRun  int     `json:"actions_per_run"`
	Driver         string  `json:"driver"`
	RecoveryRuns   int     `json:"recovery_runs"`
	Events         int     `json:"events"`
	RoundTrips     int     `json:"round_trips"`
	FloorBeforeCPS float64 `json:"floor_before_commits_per_s"`
	FloorAfterCPS  float64 `json:"floor_after_commits_per_s"`
}

// benchReport is what --json prints.
type benchReport struct {
	Machine  benchMachine  `json:"machine"`
	Settings benchSettings `json:"settings"`
	Figures  []benchFigure `json:"figures"`
	WallS    float64       `json:"wall_s"`
}

func runBench(ctx context.Context, o benchOptions, stdout, stderr io.Writer) error {
	start := time.Now()
	dir, cleanup, err := benchDir(o.dir)
	if err != nil {
		return err
	}
	defer cleanup()
	progress := func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }
	progress("directory %s (synchronous=FULL)", dir)

	rep := benchReport{Machine: machineInfo(dir), Settings: benchSettings{
		Quick: o.quick, DurationS: o.duration.Seconds(), Synchronous: "FULL", Concurrency: benchConcurrency,
		ActionsPerRun: benchActionsPerRun, Driver: "goroutines calling engine.Advance",
		RecoveryRuns: o.recoveryRuns, Events: o.events,
	}}

	// The floor, in two halves around the action workload, so that a slow
	// or fast spell of the disk during the workload shows in both.
	floor, err := openBenchFloor(ctx, dir)
	if err != nil {
		return err
	}
	defer floor.close()
	half := max(o.duration/2, 100*time.Millisecond)
	n1, d1, err := floor.measure(ctx, half)
	if err != nil {
		return err
	}
	rep.Settings.FloorBeforeCPS = float64(n1) / d1.Seconds()
	progress("floor (before): %d commits in %s, %.0f commits/s", n1, d1.Round(time.Millisecond), rep.Settings.FloorBeforeCPS)

	levels := make(map[int]float64, len(benchConcurrency))
	for _, c := range benchConcurrency {
		lv, err := benchActions(ctx, dir, c, o.duration)
		if err != nil {
			return fmt.Errorf("bench actions at concurrency %d: %w", c, err)
		}
		levels[c] = lv.perSecond()
		progress("durable action c=%d: %d actions (%d runs) in %s, %.1f actions/s", c, lv.actions, lv.runs,
			lv.elapsed.Round(time.Millisecond), lv.perSecond())
	}
	rssKiB, rssOK := peakRSSKiB()

	n2, d2, err := floor.measure(ctx, half)
	if err != nil {
		return err
	}
	rep.Settings.FloorAfterCPS = float64(n2) / d2.Seconds()
	progress("floor (after): %d commits in %s, %.0f commits/s", n2, d2.Round(time.Millisecond), rep.Settings.FloorAfterCPS)
	floorCPS := float64(n1+n2) / (d1 + d2).Seconds()
	floorMS := 1000 / floorCPS

	rt, err := benchRoundTrips(ctx, dir, o.duration, o.minRoundTrip, progress)
	if err != nil {
		return fmt.Errorf("bench approval round trip: %w", err)
	}
	rep.Settings.RoundTrips = len(rt.total)
	progress("approval round trip: %d runs, p50 %.1f ms, p99 %.1f ms; approve alone p50 %.1f ms",
		len(rt.total), ms(percentile(rt.total, 0.50)), ms(percentile(rt.total, 0.99)), ms(percentile(rt.approve, 0.50)))

	scan, err := benchRecovery(ctx, dir, o.recoveryRuns, progress)
	if err != nil {
		return fmt.Errorf("bench recovery: %w", err)
	}
	progress("recovery: %d runs scanned and decided in %s", o.recoveryRuns, scan.Round(time.Millisecond))

	export, err := benchEvidence(ctx, dir, o.events, o.quick, progress)
	if err != nil {
		return fmt.Errorf("bench evidence: %w", err)
	}
	progress("evidence: %d events exported in %.1f ms (build %.1f ms, JSON %.1f ms)", export.events,
		ms(export.build+export.render), ms(export.build), ms(export.render))

	// The figures.
	rate := func(v float64) *float64 { r := v / floorCPS; return &r }
	lat := func(msv float64) *float64 { r := msv / floorMS; return &r }
	one := 1.0
	figs := []benchFigure{
		{Key: "floor_commits_per_s", Name: "floor: raw 1-row commit", Value: floorCPS, Unit: "commits/s", RatioToFloor: &one,
			Note: fmt.Sprintf("before %.0f, after %.0f", rep.Settings.FloorBeforeCPS, rep.Settings.FloorAfterCPS)},
		{Key: "floor_commit_ms", Name: "floor: one commit", Value: floorMS, Unit: "ms", RatioToFloor: &one},
	}
	for _, c := range benchConcurrency {
		f := benchFigure{Key: fmt.Sprintf("action_c%d_per_s", c), Name: fmt.Sprintf("durable action, concurrency %d", c),
			Value: levels[c], Unit: "actions/s", RatioToFloor: rate(levels[c])}
		if c == 1 {
			f.Target = fmt.Sprintf("≥ %.2f× floor", targetActionRatioC1)
			f.Met = met(*f.RatioToFloor >= targetActionRatioC1)
		}
		figs = append(figs, f)
	}
	scaling := levels[32] / levels[1]
	figs = append(figs,
		benchFigure{Key: "action_scaling_c32_c1", Name: "durable action, c32 ÷ c1", Value: scaling, Unit: "×",
			Target: fmt.Sprintf("≥ %.0f×", targetScalingC32), Met: met(scaling >= targetScalingC32)},
		benchFigure{Key: "approval_round_trip_p50_ms", Name: "approval round trip p50", Value: ms(percentile(rt.total, 0.50)), Unit: "ms",
			RatioToFloor: lat(ms(percentile(rt.total, 0.50))), Note: "submit → approve → completed, HTTP on loopback"},
		benchFigure{Key: "approval_round_trip_p99_ms", Name: "approval round trip p99", Value: ms(percentile(rt.total, 0.99)), Unit: "ms",
			RatioToFloor: lat(ms(percentile(rt.total, 0.99)))},
		benchFigure{Key: "approve_request_p50_ms", Name: "approve request p50", Value: ms(percentile(rt.approve, 0.50)), Unit: "ms",
			RatioToFloor: lat(ms(percentile(rt.approve, 0.50)))},
		benchFigure{Key: "approve_request_p99_ms", Name: "approve request p99", Value: ms(percentile(rt.approve, 0.99)), Unit: "ms",
			RatioToFloor: lat(ms(percentile(rt.approve, 0.99)))},
	)
	recov := benchFigure{Key: "recovery_scan_s", Name: fmt.Sprintf("recovery: scan %d runs", o.recoveryRuns), Value: scan.Seconds(),
		Unit: "s", Target: fmt.Sprintf("< %.0f s for %d", targetRecoveryS, targetRecoveryRuns)}
	if o.recoveryRuns == targetRecoveryRuns {
		recov.Met = met(scan.Seconds() < targetRecoveryS)
	}
	perRun := ms(scan) / float64(o.recoveryRuns)
	figs = append(figs, recov,
		benchFigure{Key: "recovery_per_run_ms", Name: "recovery: per run", Value: perRun, Unit: "ms", RatioToFloor: lat(perRun)})
	exp := benchFigure{Key: "evidence_export_ms", Name: fmt.Sprintf("evidence: export %d events", export.events),
		Value: ms(export.build + export.render), Unit: "ms", RatioToFloor: lat(ms(export.build + export.render)),
		Target: fmt.Sprintf("< %.0f ms for %d", targetEvidenceMS, targetEvidenceN),
		Note:   fmt.Sprintf("build %.1f ms + JSON %.1f ms, median of %d", ms(export.build), ms(export.render), export.reps)}
	if o.events == targetEvidenceN {
		exp.Met = met(ms(export.build+export.render) < targetEvidenceMS)
	}
	figs = append(figs, exp)
	if rssOK {
		figs = append(figs, benchFigure{Key: "peak_rss_mib", Name: "memory: peak RSS", Value: float64(rssKiB) / 1024, Unit: "MiB",
			Note: "the whole bench process, acting as server, after the action workload"})
	}
	rep.Figures = figs
	rep.WallS = time.Since(start).Seconds()
	progress("done in %s", time.Since(start).Round(100*time.Millisecond))

	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printBench(stdout, rep)
}

func printBench(w io.Writer, rep benchReport) error {
	m := rep.Machine
	fmt.Fprintf(w, "ledger bench — %d CPUs (%s), %s/%s, %s, %s on %s\n", m.NumCPU, orDash(m.CPUModel), m.GOOS, m.GOARCH,
		m.GoVersion, orDash(m.Filesystem), m.Dir)
	fmt.Fprintf(w, "ratios: rates ÷ floor commits/s, times ÷ one floor commit; floor measured in this run, synchronous=FULL\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tUNIT\t×FLOOR\tTARGET\tMET")
	for _, f := range rep.Figures {
		ratio := "-"
		if f.RatioToFloor != nil {
			ratio = formatValue(*f.RatioToFloor) + "×"
		}
		ok := "-"
		switch {
		case f.Met != nil && *f.Met:
			ok = "yes"
		case f.Met != nil:
			ok = "NO"
		case f.Target != "":
			ok = "n/a (other N)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, formatValue(f.Value), f.Unit, ratio, orDash(f.Target), ok)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, f := range rep.Figures {
		if f.Note != "" {
			fmt.Fprintf(w, "  %s: %s\n", f.Name, f.Note)
		}
	}
	_, err := fmt.Fprintf(w, "  wall time %.1f s\n", rep.WallS)
	return err
}

func formatValue(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

func met(b bool) *bool { return &b }

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// percentile of durations by nearest rank; sorts ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := min(len(ds)-1, int(float64(len(ds))*p))
	return ds[i]
}

// benchDir makes the run's fresh directory: inside parent when given (and
// kept), else a temporary one removed by cleanup.
func benchDir(parent string) (dir string, cleanup func(), err error) {
	if parent != "" {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return "", nil, err
		}
		dir, err = os.MkdirTemp(parent, "ledger-bench-")
		return dir, func() {}, err
	}
	dir, err = os.MkdirTemp("", "ledger-bench-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}

// benchFloor is the yardstick: ledger/ledgertest.Floor duplicated, because
// that one takes a testing.TB. Keep the two alike: a SQLite file opened
// with database/sql and the Store's pragmas (WAL, synchronous=FULL, one
// connection, IMMEDIATE transactions) holding one small table; one commit
// is one row inserted in its own committed transaction, the least any
// durable write can cost on this file system.
type benchFloor struct {
	db *sql.DB
	n  int
}

func openBenchFloor(ctx context.Context, dir string) (*benchFloor, error) {
	dsn := "file:" + filepath.Join(dir, "floor.db") +
		"?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=5000&_foreign_keys=on&_txlock=immediate"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("open floor: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`); err != nil {
		return nil, errors.Join(fmt.Errorf("create floor table: %w", err), db.Close())
	}
	var syncMode int
	if err := db.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&syncMode); err != nil || syncMode != 2 {
		return nil, errors.Join(fmt.Errorf("floor synchronous = %d (%v), want 2 (FULL)", syncMode, err), db.Close())
	}
	return &benchFloor{db: db}, nil
}

func (f *benchFloor) close() { _ = f.db.Close() }

// commit inserts one row in its own committed transaction.
func (f *benchFloor) commit(ctx context.Context) error {
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("floor begin: %w", err)
	}
	f.n++
	if _, err := tx.ExecContext(ctx, `INSERT INTO t (id, v) VALUES (?, ?)`, f.n, "value"); err != nil {
		return errors.Join(fmt.Errorf("floor insert: %w", err), tx.Rollback())
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("floor commit: %w", err)
	}
	return nil
}

// measure commits for about d and returns how many and how long.
func (f *benchFloor) measure(ctx context.Context, d time.Duration) (int, time.Duration, error) {
	start := time.Now()
	n := 0
	for n < 20 || time.Since(start) < d {
		if err := f.commit(ctx); err != nil {
			return n, time.Since(start), err
		}
		n++
	}
	return n, time.Since(start), nil
}

// benchInstantTool answers at once and changes nothing anywhere, so what is
// measured is the ledger's cost per action (engine/bench_test.go's
// instantTool).
type benchInstantTool struct{ desc contracts.ToolDescriptor }

func (t benchInstantTool) Descriptor() contracts.ToolDescriptor { return t.desc }
func (t benchInstantTool) Execute(context.Context, engine.Call) (engine.Result, error) {
	return engine.Result{Output: json.RawMessage(`{"ok":true}`), Effect: ledger.EffectHappened}, nil
}

// benchLevel is one concurrency level's outcome.
type benchLevel struct {
	actions, runs int
	elapsed       time.Duration
}

func (l benchLevel) perSecond() float64 { return float64(l.actions) / l.elapsed.Seconds() }

// benchActions runs the action workload at concurrency c on a fresh
// database: c goroutines, each submitting runs of ten auto-approved write
// actions of the instant tool and driving each with engine.Advance until d
// has passed. A run started before the deadline is finished and counted;
// elapsed is the wall time until the last goroutine returns, submits
// included.
func benchActions(ctx context.Context, dir string, c int, d time.Duration) (benchLevel, error) {
	store, err := ledger.Open(ctx, ledger.Config{Path: filepath.Join(dir, fmt.Sprintf("actions-c%d.db", c))})
	if err != nil {
		return benchLevel{}, err
	}
	defer store.Close()
	desc := simulator.CardsWriteDescriptor()
	desc.Name = "bench.write"
	desc.Guarantees = contracts.Guarantees{}
	steps := make([]engine.Step, 0, benchActionsPerRun)
	for i := range benchActionsPerRun {
		steps = append(steps, engine.Step{Kind: engine.StepToolCall, Tool: desc.Name,
			Arguments: json.RawMessage(fmt.Sprintf(`{"title":"t","cards":[{"front":"q%d","back":"a"}]}`, i)),
			Usage:     &engine.Usage{InputTokens: 10, OutputTokens: 5}})
	}
	agent := engine.Agent{Name: "bench", Tools: []engine.Tool{benchInstantTool{desc}},
		NewModel: func(json.RawMessage) (engine.Model, error) { return simulator.NewScriptedModel(steps...), nil }}
	rules := &contracts.Rules{Rules: []contracts.Rule{{Tool: desc.Name, Decision: contracts.RuleDecisionAutoApprove}}}
	policy, err := approval.NewPolicy(rules, approval.Defaults{})
	if err != nil {
		return benchLevel{}, err
	}
	svc := approval.NewService(store, policy, nil, approval.Options{})
	eng, err := engine.New(engine.Config{Store: store, Approvals: svc, Agents: []engine.Agent{agent}, Logger: discardLogger()})
	if err != nil {
		return benchLevel{}, err
	}

	var (
		runs    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	fail := func(err error) { errOnce.Do(func() { first = err }) }
	start := time.Now()
	deadline := start.Add(d)
	for g := range c {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				res, err := store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: fmt.Sprintf("g%d-r%d", g, i),
					Principal: "bench", Agent: "bench", Input: json.RawMessage(`{}`)})
				if err != nil {
					fail(err)
					return
				}
				if err := eng.Advance(ctx, res.Run.ID); err != nil {
					fail(err)
					return
				}
				runs.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return benchLevel{}, first
	}
	if err := ctx.Err(); err != nil {
		return benchLevel{}, err
	}
	done, err := store.FindRuns(ctx, ledger.RunFilter{State: ptrTo(ledger.RunCompleted)})
	if err != nil {
		return benchLevel{}, err
	}
	if n := int(runs.Load()); len(done) != n {
		return benchLevel{}, fmt.Errorf("%d of %d runs completed", len(done), n)
	}
	n := int(runs.Load())
	return benchLevel{actions: n * benchActionsPerRun, runs: n, elapsed: elapsed}, nil
}

func ptrTo[T any](v T) *T { return &v }

// benchRoundTrip holds the approval round trips' latencies.
type benchRoundTrip struct {
	total   []time.Duration // submit → approve → completed
	approve []time.Duration // the approve request alone
}

// benchRoundTrips runs the whole service in this process: the wired
// service (openService, practice-cards agent, its simulator effect store)
// in dev mode behind server.New on an httptest server on loopback, with the
// engine's worker pool started. One round trip submits a run over HTTP,
// polls it until its write action awaits approval, approves that digest
// and polls until the run is completed. Round trips run one after another
// for d, and at least minN of them.
func benchRoundTrips(ctx context.Context, dir string, d time.Duration, minN int, progress func(string, ...any)) (benchRoundTrip, error) {
	var rt benchRoundTrip
	svc, err := openService(ctx, serviceConfig{DBPath: filepath.Join(dir, "approvals.db"), DevMode: true, Logger: discardLogger()})
	if err != nil {
		return rt, err
	}
	defer svc.Close()
	srv, err := server.New(server.Config{Store: svc.store, Engine: svc.engine, Approvals: svc.approvals, Redaction: svc.redactor})
	if err != nil {
		return rt, err
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	svc.engine.Start(ctx)
	defer svc.engine.Stop()

	title, markdown := simulator.SampleDocument()
	body, err := json.Marshal(map[string]any{"agent": simulator.AgentName, "input": map[string]string{"title": title, "markdown": markdown}})
	if err != nil {
		return rt, err
	}
	c := benchClient{base: ts.URL, http: client}
	start := time.Now()
	for i := 0; i < minN || time.Since(start) < d; i++ {
		if err := ctx.Err(); err != nil {
			return rt, err
		}
		t0 := time.Now()
		var sub server.SubmitResponse
		if err := c.do(ctx, http.MethodPost, "/v1/runs", "bench-"+strconv.Itoa(i), body, http.StatusCreated, &sub); err != nil {
			return rt, fmt.Errorf("submit: %w", err)
		}
		run, err := c.waitRun(ctx, sub.ID, ledger.RunAwaitingApproval)
		if err != nil {
			return rt, err
		}
		var pending *server.Action
		for j := range run.Actions {
			if run.Actions[j].State == ledger.ActionAwaitingApproval {
				pending = &run.Actions[j]
			}
		}
		if pending == nil {
			return rt, fmt.Errorf("run %s awaits approval but no action does", run.ID)
		}
		decision, err := json.Marshal(server.DecisionRequest{ActionDigest: pending.ActionDigest, Reason: "bench"})
		if err != nil {
			return rt, err
		}
		t1 := time.Now()
		if err := c.do(ctx, http.MethodPost, "/v1/actions/"+string(pending.ID)+"/approve", "", decision, http.StatusOK, nil); err != nil {
			return rt, fmt.Errorf("approve: %w", err)
		}
		rt.approve = append(rt.approve, time.Since(t1))
		if _, err := c.waitRun(ctx, sub.ID, ledger.RunCompleted); err != nil {
			return rt, err
		}
		rt.total = append(rt.total, time.Since(t0))
		if (i+1)%25 == 0 {
			progress("approval round trip: %d done", i+1)
		}
	}
	effects, err := svc.effects.Effects(ctx)
	if err != nil {
		return rt, err
	}
	if len(effects) != len(rt.total) {
		return rt, fmt.Errorf("%d effects for %d approved runs", len(effects), len(rt.total))
	}
	return rt, nil
}

// benchPoll is how long the round trip waits between two reads of a run.
const benchPoll = time.Millisecond

// benchClient calls the API in dev mode (no token).
type benchClient struct {
	base string
	http *http.Client
}

func (c benchClient) do(ctx context.Context, method, path, key string, body []byte, want int, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// waitRun reads the run until it is in state want; a terminal state that
// is not want is an error.
func (c benchClient) waitRun(ctx context.Context, id ledger.RunID, want ledger.RunState) (*server.Run, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var run server.Run
		if err := c.do(ctx, http.MethodGet, "/v1/runs/"+string(id), "", nil, http.StatusOK, &run); err != nil {
			return nil, err
		}
		if run.State == want {
			return &run, nil
		}
		if run.State.Terminal() {
			return nil, fmt.Errorf("run %s ended %s (%s), waiting for %s", id, run.State, run.StopReason, want)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("run %s still %s after 30s, waiting for %s", id, run.State, want)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(benchPoll):
		}
	}
}

// benchRecovery writes n interrupted runs (each: one approved write action
// whose attempt was started and never finished, as a crash leaves them)
// with synchronous=OFF, reopens the file with FULL and times one recovery
// scan with a tool that can be queried and answers "not happened" at once
// (recovery/bench_test.go's shape): per run a query decision, the
// observation, a continue decision, the attempt closed and the action back
// to approved, each durable.
func benchRecovery(ctx context.Context, dir string, n int, progress func(string, ...any)) (time.Duration, error) {
	path := filepath.Join(dir, "recovery.db")
	setup := time.Now()
	if err := interruptedRuns(ctx, path, n, progress); err != nil {
		return 0, err
	}
	progress("recovery: %d interrupted runs written (synchronous=OFF) in %s", n, time.Since(setup).Round(time.Millisecond))
	s, err := ledger.Open(ctx, ledger.Config{Path: path})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	var decided atomic.Int64
	stopTicker := make(chan struct{})
	tickerDone := make(chan struct{})
	go func() {
		defer close(tickerDone)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopTicker:
				return
			case <-t.C:
				progress("recovery: scanning, %d decisions recorded so far", decided.Load())
			}
		}
	}()
	r := recovery.New(recovery.Config{Store: s,
		Probes: func(string, string) (recovery.Probe, bool) {
			return recovery.Probe{Tool: recovery.Tool{Guarantees: contracts.Guarantees{Query: true}},
				QueryFunc: func(context.Context, string) (ledger.EffectFact, json.RawMessage, error) {
					return ledger.EffectNotHappened, nil, nil
				}}, true
		},
		OnDecision: func(recovery.Decision) { decided.Add(1) },
	})
	t0 := time.Now()
	rep, err := r.Scan(ctx)
	scan := time.Since(t0)
	close(stopTicker)
	<-tickerDone
	if err != nil {
		return 0, err
	}
	if rep.Actions != n || rep.Decisions[recovery.Continue] != n || len(rep.Errors) > 0 {
		return 0, fmt.Errorf("scan decided %d actions (%v), %d errors, want %d continues", rep.Actions, rep.Decisions, len(rep.Errors), n)
	}
	return scan, nil
}

// interruptedRuns writes n runs as a crash mid-attempt leaves them. One
// writer: the store has one writer connection, and four goroutines were
// no faster.
func interruptedRuns(ctx context.Context, path string, n int, progress func(string, ...any)) error {
	s, err := ledger.Open(ctx, ledger.Config{Path: path, Synchronous: "OFF"})
	if err != nil {
		return err
	}
	defer s.Close()
	step := max(n/5, 1000)
	for i := range n {
		if err := interruptedRun(ctx, s, i); err != nil {
			return err
		}
		if (i+1)%step == 0 && i+1 < n {
			progress("recovery: %d of %d interrupted runs written", i+1, n)
		}
	}
	return nil
}

// interruptedRun writes run i: submitted, running, one approved write
// action, its attempt started and never finished.
func interruptedRun(ctx context.Context, s *ledger.GormStore, i int) error {
	res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: fmt.Sprintf("k%d", i),
		Principal: "bench", Agent: "bench", Input: json.RawMessage(`{}`)})
	if err != nil {
		return err
	}
	if _, err := s.TransitionRun(ctx, ledger.RunTransition{ID: res.Run.ID, From: ledger.RunQueued, To: ledger.RunRunning}); err != nil {
		return err
	}
	a, err := s.CreateAction(ctx, ledger.CreateActionParams{RunID: res.Run.ID, IdempotencyKey: "step-1", Tool: "bench.write",
		ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"i":1}`), Gate: ledger.ActionApproved})
	if err != nil {
		return err
	}
	_, err = s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.Action.ID})
	return err
}

// benchExport is the evidence figure.
type benchExport struct {
	events        int
	build, render time.Duration // medians
	reps          int
}

// benchEvidence writes, with synchronous=OFF (reading does not care), a run
// with one approved write that ran once, and usage records up to n events,
// then times evidence.Build (every query, the chain verification,
// redaction of every event) and the JSON report (encoding and schema
// validation), the median of three exports (one with --quick).
func benchEvidence(ctx context.Context, dir string, n int, quick bool, progress func(string, ...any)) (benchExport, error) {
	var out benchExport
	s, err := ledger.Open(ctx, ledger.Config{Path: filepath.Join(dir, "evidence.db"), Synchronous: "OFF"})
	if err != nil {
		return out, err
	}
	defer s.Close()
	setup := time.Now()
	res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: "evidence", Principal: "bench",
		Agent: "bench", Input: json.RawMessage(`{"title":"t"}`)})
	if err != nil {
		return out, err
	}
	id := res.Run.ID
	if _, err := s.TransitionRun(ctx, ledger.RunTransition{ID: id, From: ledger.RunQueued, To: ledger.RunRunning}); err != nil {
		return out, err
	}
	a, err := s.CreateAction(ctx, ledger.CreateActionParams{RunID: id, IdempotencyKey: "step-1", Tool: "bench.write",
		ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"title":"t","cards":[{"front":"q","back":"a"}]}`),
		Gate: ledger.ActionApproved})
	if err != nil {
		return out, err
	}
	att, err := s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.Action.ID})
	if err != nil {
		return out, err
	}
	if _, err := s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded,
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened},
		Result:      json.RawMessage(`{"written":1}`), ActionState: ledger.ActionSucceeded}); err != nil {
		return out, err
	}
	chain, err := s.VerifyChain(ctx, id)
	if err != nil {
		return out, err
	}
	for i := chain.Events; i < n; i++ {
		if _, err := s.AddUsage(ctx, ledger.AddUsageParams{RunID: id, Steps: 1, Tokens: 42, Execution: time.Millisecond}); err != nil {
			return out, err
		}
	}
	if chain, err = s.VerifyChain(ctx, id); err != nil {
		return out, err
	}
	if !chain.OK || chain.Events < n {
		return out, fmt.Errorf("evidence run has %d events (chain ok: %t), want %d", chain.Events, chain.OK, n)
	}
	out.events = chain.Events
	progress("evidence: run of %d events written (synchronous=OFF) in %s", chain.Events, time.Since(setup).Round(time.Millisecond))

	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return out, err
	}
	r, err := redact.NewRedactor(key)
	if err != nil {
		return out, err
	}
	opts := evidence.Options{Redactor: r, Now: time.Now}
	out.reps = 3
	if quick {
		out.reps = 1
	}
	var builds, renders []time.Duration
	for range out.reps {
		t0 := time.Now()
		rep, err := evidence.Build(ctx, s, id, opts)
		if err != nil {
			return out, err
		}
		t1 := time.Now()
		if err := rep.JSON(io.Discard); err != nil {
			return out, err
		}
		builds, renders = append(builds, t1.Sub(t0)), append(renders, time.Since(t1))
		if len(rep.Timeline) < n || !rep.Chain.OK {
			return out, fmt.Errorf("report has %d timeline events (chain ok: %t), want %d", len(rep.Timeline), rep.Chain.OK, n)
		}
	}
	out.build, out.render = percentile(builds, 0.5), percentile(renders, 0.5)
	return out, nil
}

// machineInfo describes the machine; what cannot be read stays empty.
func machineInfo(dir string) benchMachine {
	m := benchMachine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH,
		GoVersion: runtime.Version(), Dir: dir}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	if v := procField("/proc/meminfo", "MemTotal"); v != "" {
		m.MemTotalKiB, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
	}
	m.Filesystem = filesystemOf(dir)
	return m
}

// procField is the value of the first "name: value" line of a /proc file.
func procField(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// filesystemOf is the type of the file system holding dir, from the
// longest mount point of /proc/self/mounts that contains it ("" where
// there is no such file).
func filesystemOf(dir string) string {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	best, fstype := -1, ""
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mnt := f[1]
		if (dir == mnt || strings.HasPrefix(dir, strings.TrimSuffix(mnt, "/")+"/")) && len(mnt) > best {
			best, fstype = len(mnt), f[2]
		}
	}
	return fstype
}
