package main

import (
	"bufio"
	"context"
	"crypto/rand"
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
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/stores"
	"github.com/actionledger/ledger/perf"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/server"
)

// ledger bench measures the service in one process and one run, on fresh
// databases in one directory, and reports every figure beside the floor
// measured in that same run: a raw single-row SQLite commit on the same
// file system with the same synchronous setting (FULL). Machines differ by
// orders of magnitude in fsync cost, and shared machines drift from minute
// to minute; a ratio to a floor taken minutes apart on the same disk
// carries from machine to machine, an absolute figure does not.
// BENCHMARKS.md records a run and the method of each figure. The
// workloads are package perf's, the same the Go benchmarks run; this file
// has the flags, the progress, the figures and their table.
//
// With --postgres (or $LEDGER_BENCH_POSTGRES) every workload runs a second
// time on PostgreSQL, each on a fresh database created on that server and
// dropped at the end, beside a PostgreSQL floor measured in the same run
// (perf.OpenPostgresFloor); each figure is a ratio to its own driver's
// floor, and the table shows both drivers side by side.

// Targets of the issue, as ratios on the reference machine (2 cores).
const (
	targetActionRatioC1 = 0.25 // durable action at concurrency 1, × floor commits/s
	targetScalingC32    = 3.0  // actions/s at concurrency 32 ÷ at concurrency 1
	targetRecoveryS     = 1.0  // seconds to scan 10,000 interrupted runs
	targetRecoveryRuns  = 10_000
	targetEvidenceMS    = 200.0 // ms to export a run of 10,000 events
	targetEvidenceN     = 10_000
	targetProtocolP50MS = 3.0   // ms per agent protocol call at concurrency 1, p50
	targetProtocolC32   = 500.0 // agent protocol calls/s at concurrency 32
)

// The idle event streams' workload: this many streams on a run of this
// many events (--quick: fewer of both), and at least this many unrelated
// requests at each level.
const (
	benchStreams      = 100
	benchStreamEvents = 3000
	benchStreamProbes = 5
)

// benchConcurrency are the levels of the action workload.
var benchConcurrency = []int{1, 8, 32}

// envBenchPostgres names the PostgreSQL server of --postgres when the flag
// is not given.
const envBenchPostgres = "LEDGER_BENCH_POSTGRES"

// The drivers a figure is measured on (benchFigure.Driver).
const (
	driverSQLite   = "sqlite"
	driverPostgres = "postgres"
)

// benchOptions are the flags of ledger bench, defaults applied.
type benchOptions struct {
	dir          string // parent of the run's fresh directory; "" means a temporary one, removed after
	asJSON       bool
	quick        bool
	duration     time.Duration // per action level, per floor half, and for the round trips
	recoveryRuns int
	events       int
	minRoundTrip int // fewest approval round trips, even past duration
	// streams idle event streams on a run of streamEvents events.
	streams, streamEvents int
	// postgres is the URL of a PostgreSQL server to run every workload on
	// a second time; "" runs SQLite alone.
	postgres string
	// mcpCalls is the MCP gateway workload's timed read calls each way.
	mcpCalls int
	// only are the workload families to run (benchFamilies); none means
	// all. The floor is always measured.
	only []string
}

// benchFamilies are the workload families --only may name, in the order
// they run; each figure belongs to one (familyOf).
var benchFamilies = []string{"action", "approval", "protocol", "mcp", "recovery", "evidence", "streams"}

// runs reports whether the pass runs the workload family f.
func (o benchOptions) runs(f string) bool { return len(o.only) == 0 || slices.Contains(o.only, f) }

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
  mcp gateway        --mcp-calls read calls to an MCP server in this process (streamable HTTP on
                     loopback) each way, taking turns: directly; through a proxy with no ledger;
                     through the MCP gateway (ledger mcp's ServeStdio on in-memory pipes, the
                     engine on a fresh database): p50/p99 each, the gateway's added p50/p99
                     (gateway − direct), and the Store's writes, commits and reads per call
  recovery           one start-up scan over --recovery-runs interrupted runs (query probe)
  evidence           evidence.Build + JSON of a run with --events events
  idle streams       100 Server-Sent Event streams open on a running run of 3,000 events, each
                     with nothing left to read, beside none: the process's CPU per second while
                     nothing else happens, then an unrelated GET /v1/runs/{id}'s p50/p99
  memory             peak RSS of this whole process, which acts as the server, after the
                     action workload

With --postgres URL (or $LEDGER_BENCH_POSTGRES) every workload but memory runs again on
PostgreSQL, each on a fresh database this run creates on that server and drops at the end,
beside a PostgreSQL floor (raw one-row INSERTs over pgx, synchronous_commit on) measured in
the same run. Each figure is a ratio to its own driver's floor; the table puts the drivers side
by side. The URL's user must be allowed to create databases. At concurrency 32 on PostgreSQL
the writes share the driver's connection pool; there is no group commit there.

--only FAMILY[,FAMILY] runs those workload families alone, beside the floor: action, approval,
protocol, mcp, recovery, evidence, streams (memory comes with action).

The table goes to stdout (--json: one JSON object with the machine), progress to stderr.
--quick is a smoke run (300ms levels, small N) that checks everything works; its figures
mean little (it opens 20 streams on a run of 300 events, and makes 50 MCP calls each way).`,
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
				if !f.Changed("mcp-calls") {
					o.mcpCalls = 50
				}
				o.minRoundTrip = 3
				o.streams, o.streamEvents = 20, 300
			}
			for _, fam := range o.only {
				if !slices.Contains(benchFamilies, fam) {
					return ledger.Errorf(ledger.CodeInvalid, "bench: --only takes %s, not %q", strings.Join(benchFamilies, ", "), fam)
				}
			}
			if !f.Changed("postgres") {
				o.postgres = os.Getenv(envBenchPostgres)
			}
			if o.postgres != "" && !stores.IsPostgres(o.postgres) {
				return ledger.Errorf(ledger.CodeInvalid, "bench: --postgres must be a postgres:// URL")
			}
			if o.duration <= 0 || o.recoveryRuns < 1 || o.events < 10 || o.mcpCalls < 1 {
				return ledger.Errorf(ledger.CodeInvalid, "bench: --duration must be positive, --recovery-runs and --mcp-calls at least 1, --events at least 10")
			}
			return runBench(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
		Example: `  ledger bench --quick
  ledger bench --duration 10s --json > bench.json
  ledger bench --only mcp --mcp-calls 3000
  ledger bench --duration 3s --postgres 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'`,
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return ledger.Errorf(ledger.CodeInvalid, "%v", err)
	})
	cmd.Flags().StringVar(&o.dir, "dir", "", "make the run's directory in DIR and keep it (default: a temporary directory, removed after)")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print one JSON object instead of the table")
	cmd.Flags().BoolVar(&o.quick, "quick", false, "smoke run: 300ms per level, 200 recovery runs, 500 events, 20 streams on 300 events")
	cmd.Flags().DurationVar(&o.duration, "duration", 5*time.Second, "how long each action level, each floor half and the round trips run")
	cmd.Flags().IntVar(&o.recoveryRuns, "recovery-runs", targetRecoveryRuns, "interrupted runs the recovery scan decides")
	cmd.Flags().IntVar(&o.events, "events", targetEvidenceN, "events of the exported run")
	cmd.Flags().IntVar(&o.mcpCalls, "mcp-calls", benchMCPCalls, "timed read calls each way of the MCP gateway workload")
	cmd.Flags().StringSliceVar(&o.only, "only", nil, "run only these workload families, beside the floor: "+strings.Join(benchFamilies, ", "))
	cmd.Flags().StringVar(&o.postgres, "postgres", "", "also run every workload on fresh databases on this PostgreSQL server, a postgres:// URL (env "+envBenchPostgres+")")
	o.minRoundTrip = 20
	o.streams, o.streamEvents = benchStreams, benchStreamEvents
	return cmd
}

// benchFigure is one row of the table and one entry of the JSON.
type benchFigure struct {
	Key string `json:"key"`
	// Driver is the storage driver the figure was measured on: "sqlite"
	// or "postgres".
	Driver string  `json:"driver"`
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	// RatioToFloor is, for a rate, value ÷ floor commits/s, and for a
	// time, value ÷ one floor commit's time, the floor being the figure's
	// own driver's; nil where neither makes sense.
	RatioToFloor *float64 `json:"ratio_to_floor"`
	Target       string   `json:"target,omitempty"`
	// Met is nil without a target, or when the run's N differs from the
	// target's.
	Met  *bool  `json:"met"`
	Note string `json:"note,omitempty"`
	// Error, when set, is why the figure could not be measured: its
	// workload failed on this driver. Value is then 0, RatioToFloor and
	// Met nil.
	Error string `json:"error,omitempty"`
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
	// LoadStart and LoadEnd are /proc/loadavg's 1, 5 and 15 minute load
	// averages when the run started and ended: other work on the machine.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// benchSettings are the parameters of the run.
type benchSettings struct {
	Quick         bool    `json:"quick"`
	DurationS     float64 `json:"duration_s"`
	Synchronous   string  `json:"synchronous"`
	Concurrency   []int   `json:"concurrency"`
	ActionsPerRun int     `json:"actions_per_run"`
	Driver        string  `json:"driver"`
	RecoveryRuns  int     `json:"recovery_runs"`
	Events        int     `json:"events"`
	RoundTrips    int     `json:"round_trips"`
	// Streams idle event streams on a run of StreamEvents events.
	Streams        int     `json:"streams"`
	StreamEvents   int     `json:"stream_events"`
	FloorBeforeCPS float64 `json:"floor_before_commits_per_s"`
	FloorAfterCPS  float64 `json:"floor_after_commits_per_s"`
	// MCPCalls are the MCP gateway workload's timed read calls each way,
	// MCPWarm its untimed ones before them, MCPBlock the calls a side
	// makes in a row.
	MCPCalls int `json:"mcp_calls"`
	MCPWarm  int `json:"mcp_warm_calls"`
	MCPBlock int `json:"mcp_block"`
	// Only are the workload families run; empty means all.
	Only []string `json:"only,omitempty"`
	// Drivers are the drivers the workloads ran on, in order.
	Drivers []string `json:"drivers"`
	// Postgres is the PostgreSQL pass's, nil without --postgres.
	Postgres *benchPostgres `json:"postgres,omitempty"`
}

// benchPostgres are the parameters of the run on PostgreSQL; the fields
// above (Synchronous, FloorBeforeCPS, FloorAfterCPS) are SQLite's.
type benchPostgres struct {
	Server            string  `json:"server"` // the URL, its password hidden
	ServerVersion     string  `json:"server_version"`
	SynchronousCommit string  `json:"synchronous_commit"`
	PoolConns         int     `json:"pool_conns"` // the ledger's connection pool per Store
	FloorBeforeCPS    float64 `json:"floor_before_commits_per_s"`
	FloorAfterCPS     float64 `json:"floor_after_commits_per_s"`
	// DatabasePrefix starts the name of every database the run made (and
	// dropped) on the server.
	DatabasePrefix string `json:"database_prefix"`
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
	progress := perf.Progress(func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) })
	progress("directory %s (synchronous=FULL)", dir)

	rep := benchReport{Machine: machineInfo(dir), Settings: benchSettings{
		Quick: o.quick, DurationS: o.duration.Seconds(), Synchronous: "FULL", Concurrency: benchConcurrency,
		ActionsPerRun: perf.ActionsPerRun, Driver: "goroutines calling engine.Advance",
		RecoveryRuns: o.recoveryRuns, Events: o.events, Drivers: []string{driverSQLite},
		Streams: o.streams, StreamEvents: o.streamEvents, MCPCalls: o.mcpCalls, MCPWarm: benchMCPWarm, MCPBlock: benchMCPBlock,
		Only: o.only,
	}}
	lite := benchTarget{driver: driverSQLite, dir: dir,
		newDB:     func(_ context.Context, name string) (string, error) { return filepath.Join(dir, name+".db"), nil },
		openFloor: func(ctx context.Context) (*perf.Floor, error) { return perf.OpenFloor(ctx, dir) }}
	figs, floor, err := benchOn(ctx, o, lite, progress)
	if err != nil {
		return err
	}
	rep.Settings.FloorBeforeCPS, rep.Settings.FloorAfterCPS = floor.before, floor.after
	rep.Settings.RoundTrips = floor.roundTrips
	rep.Figures = figs

	if o.postgres != "" {
		srv, err := perf.NewPostgresServer(ctx, o.postgres)
		if err != nil {
			return err
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if err := srv.Close(ctx); err != nil {
				progress("postgres: %v", err)
			}
		}()
		progress("postgres: server %s (PostgreSQL %s), a fresh database per workload, dropped at the end", srv.Shown(), srv.Version())
		// Database names may not hold "-"; the files' names do.
		newDB := func(ctx context.Context, name string) (string, error) {
			return srv.CreateDatabase(ctx, strings.ReplaceAll(name, "-", "_"))
		}
		pg := benchTarget{driver: driverPostgres, dir: dir, newDB: newDB,
			openFloor: func(ctx context.Context) (*perf.Floor, error) {
				db, err := newDB(ctx, "floor")
				if err != nil {
					return nil, err
				}
				return perf.OpenPostgresFloor(ctx, db)
			}}
		figs, floor, err := benchOn(ctx, o, pg, progress)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		rep.Settings.Drivers = append(rep.Settings.Drivers, driverPostgres)
		rep.Settings.Postgres = &benchPostgres{Server: srv.Shown(), ServerVersion: srv.Version(), SynchronousCommit: "on",
			PoolConns: postgres.DefaultMaxConns, FloorBeforeCPS: floor.before, FloorAfterCPS: floor.after,
			DatabasePrefix: srv.Prefix()}
		rep.Figures = append(rep.Figures, figs...)
	}
	rep.WallS = time.Since(start).Seconds()
	rep.Machine.LoadEnd = loadAverage()
	progress("done in %s", time.Since(start).Round(100*time.Millisecond))

	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = printBench(stdout, rep)
	}
	if err != nil {
		return err
	}
	var unmeasured []string
	for _, f := range rep.Figures {
		if f.Error != "" {
			unmeasured = append(unmeasured, f.Driver+" "+f.Key)
		}
	}
	if len(unmeasured) > 0 {
		return fmt.Errorf("bench: %d figures could not be measured, their workloads failed: %s", len(unmeasured), strings.Join(unmeasured, ", "))
	}
	return nil
}

// benchTarget is a driver the workloads run on: where each one's fresh
// database is, and the floor beside them.
type benchTarget struct {
	driver string // driverSQLite or driverPostgres
	dir    string // the run's directory: SQLite's files, the simulator's effect stores
	// newDB names a fresh database for the workload name ("actions-c1"): a
	// file in dir, or a database created on the server.
	newDB     func(ctx context.Context, name string) (string, error)
	openFloor func(ctx context.Context) (*perf.Floor, error)
}

// benchFloors are a pass's floor halves and round trips, for the
// settings.
type benchFloors struct {
	before, after float64 // commits/s
	roundTrips    int
}

// benchOn runs every workload on t's driver and returns its figures, each
// a ratio to t's floor measured in this pass.
func benchOn(ctx context.Context, o benchOptions, t benchTarget, progress0 perf.Progress) ([]benchFigure, benchFloors, error) {
	var fl benchFloors
	progress := progress0
	if t.driver != driverSQLite {
		progress = func(format string, args ...any) { progress0(t.driver+": "+format, args...) }
	}
	// The floor, in two halves around the action workload, so that a slow
	// or fast spell of the disk during the workload shows in both.
	floor, err := t.openFloor(ctx)
	if err != nil {
		return nil, fl, err
	}
	defer floor.Close()
	half := max(o.duration/2, 100*time.Millisecond)
	n1, d1, err := floor.Measure(ctx, half)
	if err != nil {
		return nil, fl, err
	}
	fl.before = float64(n1) / d1.Seconds()
	progress("floor (before): %d commits in %s, %.0f commits/s", n1, d1.Round(time.Millisecond), fl.before)

	// A workload that fails is reported as failed, and the others still
	// run: on one driver a level may fail where it runs on the other.
	failed := map[string]error{}
	fail := func(workload, what string, err error) {
		failed[workload] = err
		progress("%s: FAILED: %v", what, err)
	}
	levels := make(map[int]float64, len(benchConcurrency))
	for _, c := range benchConcurrency {
		if !o.runs("action") {
			break
		}
		lv, err := benchActions(ctx, t, c, o.duration)
		if err != nil {
			fail(fmt.Sprintf("action_c%d", c), fmt.Sprintf("durable action c=%d", c), err)
			continue
		}
		levels[c] = lv.PerSecond()
		progress("durable action c=%d: %d actions (%d runs) in %s, %.1f actions/s", c, lv.Actions, lv.Runs,
			lv.Elapsed.Round(time.Millisecond), lv.PerSecond())
	}
	rssKiB, rssOK := peakRSSKiB()
	rssOK = rssOK && t.driver == driverSQLite && o.runs("action") // the peak of the whole process: the first pass's

	n2, d2, err := floor.Measure(ctx, half)
	if err != nil {
		return nil, fl, err
	}
	fl.after = float64(n2) / d2.Seconds()
	progress("floor (after): %d commits in %s, %.0f commits/s", n2, d2.Round(time.Millisecond), fl.after)
	floorCPS := float64(n1+n2) / (d1 + d2).Seconds()
	floorMS := 1000 / floorCPS

	var rt perf.RoundTripLatencies
	if o.runs("approval") {
		rt, err = benchRoundTrips(ctx, t, o.duration, o.minRoundTrip, progress)
		fl.roundTrips = len(rt.Total)
		if err != nil {
			fail("approval", "approval round trip", err)
		} else {
			progress("approval round trip: %d runs, p50 %.1f ms, p99 %.1f ms; approve alone p50 %.1f ms",
				len(rt.Total), ms(perf.Percentile(rt.Total, 0.50)), ms(perf.Percentile(rt.Total, 0.99)), ms(perf.Percentile(rt.Approve, 0.50)))
		}
	}

	proto := make(map[int]perf.ProtocolLevel, 2)
	for _, c := range []int{1, 32} {
		if !o.runs("protocol") {
			break
		}
		lv, err := benchProtocol(ctx, t, c, o.duration)
		if err != nil {
			fail(fmt.Sprintf("protocol_c%d", c), fmt.Sprintf("agent protocol c=%d", c), err)
			continue
		}
		proto[c] = lv
		progress("agent protocol c=%d: %d tool calls in %s, %.1f calls/s, p50 %.2f ms, p99 %.2f ms", c, lv.Calls,
			lv.Elapsed.Round(time.Millisecond), lv.PerSecond(), ms(lv.P(0.50)), ms(lv.P(0.99)))
	}

	var mcpr mcpRun
	if o.runs("mcp") {
		if mcpr, err = benchMCP(ctx, t, o.mcpCalls, progress); err != nil {
			fail("mcp", "mcp gateway", err)
		}
	}

	var scan time.Duration
	if o.runs("recovery") {
		if scan, err = benchRecovery(ctx, t, o.recoveryRuns, progress); err != nil {
			fail("recovery", "recovery", err)
		} else {
			progress("recovery: %d runs scanned and decided in %s", o.recoveryRuns, scan.Round(time.Millisecond))
		}
	}

	var export perf.Export
	var reps int
	if o.runs("evidence") {
		if export, reps, err = benchEvidence(ctx, t, o.events, o.quick, progress); err != nil {
			fail("evidence", "evidence", err)
		} else {
			progress("evidence: %d events exported in %.1f ms (build %.1f ms, JSON %.1f ms)", export.Events,
				ms(export.Total()), ms(export.Build), ms(export.Render))
		}
	}

	var none, open perf.StreamsLevel
	if o.runs("streams") {
		if none, open, err = benchIdleStreams(ctx, t, o, progress); err != nil {
			fail("streams", "idle streams", err)
		}
	}

	// The figures.
	rate := func(v float64) *float64 { r := v / floorCPS; return &r }
	lat := func(msv float64) *float64 { r := msv / floorMS; return &r }
	one := 1.0
	figs := []benchFigure{
		{Key: "floor_commits_per_s", Name: "floor: raw 1-row commit", Value: floorCPS, Unit: "commits/s", RatioToFloor: &one,
			Note: fmt.Sprintf("before %.0f, after %.0f", fl.before, fl.after)},
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
		benchFigure{Key: "approval_round_trip_p50_ms", Name: "approval round trip p50", Value: ms(perf.Percentile(rt.Total, 0.50)), Unit: "ms",
			RatioToFloor: lat(ms(perf.Percentile(rt.Total, 0.50))), Note: "submit → approve → completed, HTTP on loopback"},
		benchFigure{Key: "approval_round_trip_p99_ms", Name: "approval round trip p99", Value: ms(perf.Percentile(rt.Total, 0.99)), Unit: "ms",
			RatioToFloor: lat(ms(perf.Percentile(rt.Total, 0.99)))},
		benchFigure{Key: "approve_request_p50_ms", Name: "approve request p50", Value: ms(perf.Percentile(rt.Approve, 0.50)), Unit: "ms",
			RatioToFloor: lat(ms(perf.Percentile(rt.Approve, 0.50)))},
		benchFigure{Key: "approve_request_p99_ms", Name: "approve request p99", Value: ms(perf.Percentile(rt.Approve, 0.99)), Unit: "ms",
			RatioToFloor: lat(ms(perf.Percentile(rt.Approve, 0.99)))},
	)
	for _, c := range []int{1, 32} {
		lv := proto[c]
		p50 := benchFigure{Key: fmt.Sprintf("protocol_call_c%d_p50_ms", c), Name: fmt.Sprintf("agent protocol call, concurrency %d, p50", c),
			Value: ms(lv.P(0.50)), Unit: "ms", RatioToFloor: lat(ms(lv.P(0.50))),
			Note: "propose + begin + complete of an auto-approved read, HTTP on loopback"}
		perS := benchFigure{Key: fmt.Sprintf("protocol_call_c%d_per_s", c), Name: fmt.Sprintf("agent protocol calls, concurrency %d", c),
			Value: lv.PerSecond(), Unit: "calls/s", RatioToFloor: rate(lv.PerSecond())}
		if c == 1 {
			p50.Target, p50.Met = fmt.Sprintf("≤ %.0f ms", targetProtocolP50MS), met(ms(lv.P(0.50)) <= targetProtocolP50MS)
		} else {
			perS.Target, perS.Met = fmt.Sprintf("≥ %.0f calls/s", targetProtocolC32), met(lv.PerSecond() >= targetProtocolC32)
		}
		figs = append(figs, p50,
			benchFigure{Key: fmt.Sprintf("protocol_call_c%d_p99_ms", c), Name: fmt.Sprintf("agent protocol call, concurrency %d, p99", c),
				Value: ms(lv.P(0.99)), Unit: "ms", RatioToFloor: lat(ms(lv.P(0.99)))},
			perS)
	}
	figs = append(figs, mcpFigures(mcpr, lat)...)
	recov := benchFigure{Key: "recovery_scan_s", Name: fmt.Sprintf("recovery: scan %d runs", o.recoveryRuns), Value: scan.Seconds(),
		Unit: "s", Target: fmt.Sprintf("< %.0f s for %d", targetRecoveryS, targetRecoveryRuns)}
	if o.recoveryRuns == targetRecoveryRuns {
		recov.Met = met(scan.Seconds() < targetRecoveryS)
	}
	perRun := ms(scan) / float64(o.recoveryRuns)
	figs = append(figs, recov,
		benchFigure{Key: "recovery_per_run_ms", Name: "recovery: per run", Value: perRun, Unit: "ms", RatioToFloor: lat(perRun)})
	exp := benchFigure{Key: "evidence_export_ms", Name: fmt.Sprintf("evidence: export %d events", export.Events),
		Value: ms(export.Total()), Unit: "ms", RatioToFloor: lat(ms(export.Total())),
		Target: fmt.Sprintf("< %.0f ms for %d", targetEvidenceMS, targetEvidenceN),
		Note:   fmt.Sprintf("build %.1f ms + JSON %.1f ms, median of %d", ms(export.Build), ms(export.Render), reps)}
	if o.events == targetEvidenceN {
		exp.Met = met(ms(export.Total()) < targetEvidenceMS)
	}
	figs = append(figs, exp)
	figs = append(figs, streamFigures(o, none, open, lat)...)
	if rssOK {
		figs = append(figs, benchFigure{Key: "peak_rss_mib", Name: "memory: peak RSS", Value: float64(rssKiB) / 1024, Unit: "MiB",
			Note: "the whole bench process, acting as server, after the action workload"})
	}
	figs = slices.DeleteFunc(figs, func(f benchFigure) bool { fam := familyOf(f.Key); return fam != "floor" && !o.runs(fam) })
	for i := range figs {
		figs[i].Driver = t.driver
		if err := failedFigure(figs[i].Key, failed); err != nil {
			figs[i].Value, figs[i].RatioToFloor, figs[i].Met, figs[i].Note = 0, nil, nil, ""
			figs[i].Error = err.Error()
		}
	}
	return figs, fl, nil
}

// familyOf is the workload family of the figure key (benchFamilies), or
// "floor".
func familyOf(key string) string {
	switch {
	case strings.HasPrefix(key, "action_"), key == "peak_rss_mib":
		return "action"
	case strings.HasPrefix(key, "approv"):
		return "approval"
	case strings.HasPrefix(key, "protocol_"):
		return "protocol"
	case strings.HasPrefix(key, "mcp_"):
		return "mcp"
	case strings.HasPrefix(key, "recovery_"):
		return "recovery"
	case strings.HasPrefix(key, "evidence_"):
		return "evidence"
	case strings.HasPrefix(key, "streams_"):
		return "streams"
	}
	return "floor"
}

// failedFigure is why the figure key could not be measured, from the
// workloads that failed, or nil.
func failedFigure(key string, failed map[string]error) error {
	switch {
	case strings.HasPrefix(key, "mcp_"):
		return failed["mcp"]
	case key == "action_scaling_c32_c1":
		return errors.Join(failed["action_c1"], failed["action_c32"])
	case strings.HasPrefix(key, "action_c"):
		return failed[strings.TrimSuffix(key, "_per_s")]
	case strings.HasPrefix(key, "approv"):
		return failed["approval"]
	case strings.HasPrefix(key, "protocol_call_c"):
		c, _, _ := strings.Cut(strings.TrimPrefix(key, "protocol_call_c"), "_")
		return failed["protocol_c"+c]
	case strings.HasPrefix(key, "recovery_"):
		return failed["recovery"]
	case strings.HasPrefix(key, "evidence_"):
		return failed["evidence"]
	case strings.HasPrefix(key, "streams_"):
		return failed["streams"]
	}
	return nil
}

func printBench(w io.Writer, rep benchReport) error {
	m := rep.Machine
	fmt.Fprintf(w, "ledger bench — %d CPUs (%s), %s/%s, %s, %s on %s\n", m.NumCPU, orDash(m.CPUModel), m.GOOS, m.GOARCH,
		m.GoVersion, orDash(m.Filesystem), m.Dir)
	if m.LoadStart != "" {
		fmt.Fprintf(w, "load average (1, 5, 15 min): %s at the start, %s at the end\n", m.LoadStart, orDash(m.LoadEnd))
	}
	if pg := rep.Settings.Postgres; pg != nil {
		fmt.Fprintf(w, "PostgreSQL %s at %s: synchronous_commit=%s, a pool of %d connections per store, no group commit\n",
			pg.ServerVersion, pg.Server, pg.SynchronousCommit, pg.PoolConns)
		fmt.Fprintf(w, "ratios: rates ÷ the floor commits/s of the figure's own driver, times ÷ one of its floor commits; "+
			"floors measured in this run (SQLite synchronous=FULL, PostgreSQL synchronous_commit=on)\n\n")
		if err := printBenchSideBySide(w, rep.Figures); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(w, "ratios: rates ÷ floor commits/s, times ÷ one floor commit; floor measured in this run, synchronous=FULL\n\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "FIGURE\tVALUE\tUNIT\t×FLOOR\tTARGET\tMET")
		for _, f := range rep.Figures {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, valueCell(f), f.Unit, ratioCell(f), orDash(f.Target), metCell(f))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	lastErr := ""
	for _, f := range rep.Figures {
		note := f.Note
		if f.Error != "" {
			note = "FAILED: " + f.Error
			if f.Error == lastErr {
				continue // the figures of one failed workload: said once
			}
		}
		lastErr = f.Error
		if note == "" {
			continue
		}
		if rep.Settings.Postgres != nil {
			fmt.Fprintf(w, "  %s, %s: %s\n", f.Name, f.Driver, note)
		} else {
			fmt.Fprintf(w, "  %s: %s\n", f.Name, note)
		}
	}
	_, err := fmt.Fprintf(w, "  wall time %.1f s\n", rep.WallS)
	return err
}

// printBenchSideBySide prints one row per figure key, SQLite's value and
// ratio beside PostgreSQL's, in the order the figures were measured.
func printBenchSideBySide(w io.Writer, figs []benchFigure) error {
	type row struct{ byDriver map[string]benchFigure }
	var keys []string
	rows := map[string]*row{}
	for _, f := range figs {
		r, ok := rows[f.Key]
		if !ok {
			r = &row{byDriver: map[string]benchFigure{}}
			rows[f.Key] = r
			keys = append(keys, f.Key)
		}
		r.byDriver[f.Driver] = f
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tUNIT\tSQLITE\t×FLOOR\tMET\tPOSTGRES\t×FLOOR\tMET\tTARGET")
	for _, k := range keys {
		r := rows[k]
		var name, unit, target string
		cells := make([]string, 0, 6)
		for _, d := range []string{driverSQLite, driverPostgres} {
			f, ok := r.byDriver[d]
			if !ok {
				cells = append(cells, "-", "-", "-")
				continue
			}
			name, unit, target = f.Name, f.Unit, f.Target
			cells = append(cells, valueCell(f), ratioCell(f), metCell(f))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, unit, strings.Join(cells, "\t"), orDash(target))
	}
	return tw.Flush()
}

// valueCell is a figure's value as the table shows it.
func valueCell(f benchFigure) string {
	if f.Error != "" {
		return "FAILED"
	}
	return formatValue(f.Value)
}

// ratioCell is a figure's ratio to its floor as the table shows it.
func ratioCell(f benchFigure) string {
	if f.RatioToFloor == nil {
		return "-"
	}
	return formatValue(*f.RatioToFloor) + "×"
}

// metCell is whether a figure met its target, as the table shows it.
func metCell(f benchFigure) string {
	switch {
	case f.Error != "":
		return "-"
	case f.Met != nil && *f.Met:
		return "yes"
	case f.Met != nil:
		return "NO"
	case f.Target != "":
		return "n/a (other N)"
	}
	return "-"
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

// benchActions runs the action workload (perf.Actions) at concurrency c on
// a fresh database for d.
func benchActions(ctx context.Context, t benchTarget, c int, d time.Duration) (perf.Level, error) {
	db, err := t.newDB(ctx, fmt.Sprintf("actions-c%d", c))
	if err != nil {
		return perf.Level{}, err
	}
	a, err := perf.OpenActions(ctx, db)
	if err != nil {
		return perf.Level{}, err
	}
	defer a.Close()
	return a.Drive(ctx, c, 0, d)
}

// benchRoundTrips runs the whole service in this process: the wired
// service (openService, practice-cards agent, its simulator effect store)
// in dev mode behind server.New on an httptest server on loopback, with the
// engine's worker pool started, and makes perf.RoundTrip's round trips one
// after another for d, and at least minN of them.
func benchRoundTrips(ctx context.Context, t benchTarget, d time.Duration, minN int, progress perf.Progress) (perf.RoundTripLatencies, error) {
	var rt perf.RoundTripLatencies
	db, err := t.newDB(ctx, "approvals")
	if err != nil {
		return rt, err
	}
	svc, err := openService(ctx, serviceConfig{DBPath: db, EffectsPath: filepath.Join(t.dir, "approvals-"+t.driver+".effects.db"),
		DevMode: true, Logger: discardLogger()})
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

	if rt, err = (perf.RoundTrip{URL: ts.URL, Client: client}).Repeat(ctx, d, minN, progress); err != nil {
		return rt, err
	}
	effects, err := svc.effects.Effects(ctx)
	if err != nil {
		return rt, err
	}
	if len(effects) != len(rt.Total) {
		return rt, fmt.Errorf("%d effects for %d approved runs", len(effects), len(rt.Total))
	}
	return rt, nil
}

// benchProtocol drives the agent protocol's workload (perf.Protocol) from c
// agents at once on a fresh database for d.
func benchProtocol(ctx context.Context, t benchTarget, c int, d time.Duration) (perf.ProtocolLevel, error) {
	db, err := t.newDB(ctx, fmt.Sprintf("protocol-c%d", c))
	if err != nil {
		return perf.ProtocolLevel{}, err
	}
	p, err := perf.OpenProtocol(ctx, db)
	if err != nil {
		return perf.ProtocolLevel{}, err
	}
	defer p.Close()
	return p.Drive(ctx, c, 0, d)
}

// benchRecovery writes n interrupted runs with synchronous=OFF
// (perf.WriteInterruptedRuns), then times one recovery scan of them on the
// same database opened with FULL (perf.ScanRecovery).
func benchRecovery(ctx context.Context, t benchTarget, n int, progress perf.Progress) (time.Duration, error) {
	db, err := t.newDB(ctx, "recovery")
	if err != nil {
		return 0, err
	}
	setup := time.Now()
	if err := perf.WriteInterruptedRuns(ctx, db, n, progress); err != nil {
		return 0, err
	}
	progress("recovery: %d interrupted runs written (synchronous=OFF) in %s", n, time.Since(setup).Round(time.Millisecond))
	return perf.ScanRecovery(ctx, db, n, progress)
}

// benchEvidence writes a run of n events (perf.EvidenceRun) and times its
// export, build and JSON, with a redactor of a random key: the median of
// three exports (one with --quick).
func benchEvidence(ctx context.Context, t benchTarget, n int, quick bool, progress perf.Progress) (perf.Export, int, error) {
	db, err := t.newDB(ctx, "evidence")
	if err != nil {
		return perf.Export{}, 0, err
	}
	setup := time.Now()
	s, id, events, err := perf.EvidenceRun(ctx, db, n)
	if err != nil {
		return perf.Export{}, 0, err
	}
	defer s.Close()
	progress("evidence: run of %d events written (synchronous=OFF) in %s", events, time.Since(setup).Round(time.Millisecond))
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return perf.Export{}, 0, err
	}
	r, err := redact.NewRedactor(key)
	if err != nil {
		return perf.Export{}, 0, err
	}
	reps := 3
	if quick {
		reps = 1
	}
	export, err := perf.ExportMedian(ctx, s, id, evidence.Options{Redactor: r, Now: time.Now}, n, reps)
	export.Events = events
	return export, reps, err
}

// benchIdleStreams writes a running run of o.streamEvents events
// (perf.OpenStreams, synchronous=OFF: setup) and measures the server with
// no event stream open, then with o.streams idle ones on that run: the
// process's CPU over half of --duration, then unrelated requests for the
// other half, and at least benchStreamProbes of them.
func benchIdleStreams(ctx context.Context, t benchTarget, o benchOptions, progress perf.Progress) (none, open perf.StreamsLevel, err error) {
	db, err := t.newDB(ctx, "streams")
	if err != nil {
		return none, open, err
	}
	setup := time.Now()
	s, err := perf.OpenStreams(ctx, db, o.streamEvents)
	if err != nil {
		return none, open, err
	}
	defer s.Close()
	progress("idle streams: run of %d events written (synchronous=OFF) in %s", s.Events, time.Since(setup).Round(time.Millisecond))
	half := max(o.duration/2, 100*time.Millisecond)
	for _, lv := range []struct {
		n   int
		out *perf.StreamsLevel
	}{{0, &none}, {o.streams, &open}} {
		if *lv.out, err = s.Measure(ctx, lv.n, half, half, benchStreamProbes); err != nil {
			return none, open, fmt.Errorf("%d streams: %w", lv.n, err)
		}
		progress("idle streams: %d open: CPU %.3f cores; unrelated GET p50 %.2f ms, p99 %.2f ms (%d requests)", lv.n,
			lv.out.Cores(), ms(lv.out.P(0.50)), ms(lv.out.P(0.99)), len(lv.out.Latencies))
	}
	return none, open, nil
}

// streamFigures are the idle streams' figures: CPU and the unrelated
// request's latency with none and with o.streams open, and their ratios;
// lat is a time's ratio to the floor.
func streamFigures(o benchOptions, none, open perf.StreamsLevel, lat func(ms float64) *float64) []benchFigure {
	with := fmt.Sprintf("%d idle streams on %d events", o.streams, o.streamEvents)
	// The ratios divide by the level without streams; a CPU time too small
	// to be read counts as 0.1 ms a second.
	ratio := func(a, b float64) float64 { return a / max(b, 1e-4) }
	p := func(l perf.StreamsLevel, q float64) float64 { return ms(l.P(q)) }
	return []benchFigure{
		{Key: "streams_none_cpu_cores", Name: "idle server, no streams: CPU", Value: none.Cores(), Unit: "cores",
			Note: "process CPU time ÷ wall time, nothing asked of the server"},
		{Key: "streams_open_cpu_cores", Name: with + ": CPU", Value: open.Cores(), Unit: "cores"},
		{Key: "streams_cpu_ratio", Name: "CPU, streams ÷ none", Value: ratio(open.Cores(), none.Cores()), Unit: "×"},
		{Key: "streams_none_other_p50_ms", Name: "unrelated GET, no streams, p50", Value: p(none, 0.50), Unit: "ms",
			RatioToFloor: lat(p(none, 0.50)), Note: "GET /v1/runs/{another run}, one after another, HTTP on loopback"},
		{Key: "streams_none_other_p99_ms", Name: "unrelated GET, no streams, p99", Value: p(none, 0.99), Unit: "ms",
			RatioToFloor: lat(p(none, 0.99))},
		{Key: "streams_open_other_p50_ms", Name: "unrelated GET beside " + with + ", p50", Value: p(open, 0.50), Unit: "ms",
			RatioToFloor: lat(p(open, 0.50))},
		{Key: "streams_open_other_p99_ms", Name: "unrelated GET beside " + with + ", p99", Value: p(open, 0.99), Unit: "ms",
			RatioToFloor: lat(p(open, 0.99))},
		{Key: "streams_other_p50_ratio", Name: "unrelated GET p50, streams ÷ none", Value: ratio(p(open, 0.50), p(none, 0.50)), Unit: "×"},
		{Key: "streams_other_p99_ratio", Name: "unrelated GET p99, streams ÷ none", Value: ratio(p(open, 0.99), p(none, 0.99)), Unit: "×"},
	}
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
	m.LoadStart = loadAverage()
	return m
}

// loadAverage is the 1, 5 and 15 minute load averages of /proc/loadavg,
// "" where there is no such file.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
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
