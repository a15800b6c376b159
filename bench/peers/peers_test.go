// Package peers compares the ledger with a peer durable-execution library on
// the same workload, the same disk and the same durability setting, on
// SQLite and on PostgreSQL, at concurrency 1 and 32. It is a module of its
// own so the peer's dependencies never reach the product's go.mod.
package peers

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	_ "github.com/dbos-inc/dbos-transact-golang/dbos/driver/sqlite" // registers modernc.org/sqlite ("sqlite") for DBOS
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
	"github.com/actionledger/ledger/perf"
)

// stepsPerRun is N: one ledger run is N write actions, one DBOS workflow is
// N steps, and one op of the benchmark is one of each (c of each at
// concurrency c) plus N floor commits.
const stepsPerRun = perf.ActionsPerRun

// levels are the concurrencies compared: c goroutines each running
// ledger runs, c each running DBOS workflows.
var levels = []int{1, 32}

// The ledger side is perf.Actions, engine/bench_test.go's and `ledger
// bench`'s action workload: a Store on a real file with synchronous=FULL
// or on a PostgreSQL database, an agent whose scripted model asks for N
// writes of perf.InstantTool (it answers at once and changes nothing
// anywhere, so what is measured is each side's cost per step), and a rule
// that auto-approves them. The DBOS side calls the same tool with the same
// arguments (perf.StepArguments).

// dbosSide is DBOS Transact on its system database, opened by us in both
// cases so that each connection's durability can be checked: on SQLite
// synchronous FULL (with a DatabaseURL DBOS opens the file itself and sets
// synchronous=NORMAL on its connections), on PostgreSQL a pgx pool sized
// as DBOS sizes its own, on the server's synchronous_commit (on).
type dbosSide struct {
	db     *sql.DB       // SQLite: the system database; PostgreSQL: a handle for the checks
	pool   *pgxpool.Pool // PostgreSQL only: DBOS's pool
	tables string        // prefix of DBOS's tables: "" on SQLite, "dbos." on PostgreSQL
	dctx   dbos.Context
	wf     dbos.Workflow[string, int]
	runs   atomic.Int64
}

// dbosDSN is modernc.org/sqlite's DSN: each _pragma is run on every new
// connection of the pool. The pragmas are those DBOS sets on the pools it
// opens itself (WAL, foreign keys, busy timeout, IMMEDIATE transactions),
// except synchronous, which is FULL like the ledger's.
func dbosDSN(path string) string {
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)" +
		"&_pragma=busy_timeout(5000)&_pragma=foreign_keys(ON)&_txlock=immediate"
}

// newDBOSSQLite is DBOS on a SQLite file in dir.
func newDBOSSQLite(b *testing.B, dir string, tool perf.InstantTool) *dbosSide {
	db, err := sql.Open("sqlite", dbosDSN(filepath.Join(dir, "dbos.db")))
	if err != nil {
		b.Fatal(err)
	}
	// DBOS's own pool sizes for the SQLite pools it opens.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(4)
	db.SetConnMaxLifetime(time.Hour)
	d := &dbosSide{db: db}
	d.checkDurable(b, 4)
	d.launch(b, dbos.Config{SQLiteSystemDB: db}, tool)
	return d
}

// newDBOSPostgres is DBOS on the PostgreSQL database dsn, which is new:
// its own pool with the settings DBOS gives the pool it makes from a
// DatabaseURL (internal/sysdb: 20 connections at most, none kept open,
// an hour's lifetime, five minutes idle).
func newDBOSPostgres(b *testing.B, dsn string, tool perf.InstantTool) *dbosSide {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 20, 0
	cfg.MaxConnLifetime, cfg.MaxConnIdleTime = time.Hour, 5*time.Minute
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		pool.Close()
		b.Fatal(err)
	}
	d := &dbosSide{db: db, pool: pool, tables: "dbos."}
	d.checkDurable(b, 4)
	d.launch(b, dbos.Config{SystemDBPool: pool}, tool)
	return d
}

// launch starts DBOS with cfg and registers the workflow: N steps, each
// calling the instant tool with the arguments the ledger's actions carry;
// DBOS checkpoints each output.
func (d *dbosSide) launch(b *testing.B, cfg dbos.Config, tool perf.InstantTool) {
	ctx := context.Background()
	cfg.AppName = "ledger-peers-bench"
	// Warnings and errors still show; DBOS's info lines would drown the
	// benchmark's output.
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var err error
	d.dctx, err = dbos.NewContext(ctx, cfg)
	if err != nil {
		d.close()
		b.Fatal(err)
	}
	d.wf = func(wctx dbos.Context, _ string) (int, error) {
		for i := range stepsPerRun {
			args := perf.StepArguments(i)
			_, err := dbos.RunAsStep(wctx, func(sctx context.Context) (string, error) {
				res, err := tool.Execute(sctx, engine.Call{Attempt: 1, Arguments: args})
				return string(res.Output), err
			}, dbos.WithStepName(tool.Desc.Name))
			if err != nil {
				return i, err
			}
		}
		return stepsPerRun, nil
	}
	dbos.RegisterWorkflow(d.dctx, d.wf, dbos.WithWorkflowName("bench.run"))
	if err := dbos.Launch(d.dctx); err != nil {
		d.close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := dbos.Shutdown(d.dctx, 10*time.Second); err != nil {
			b.Logf("dbos shutdown: %v", err)
		}
		d.close()
	})
}

func (d *dbosSide) close() {
	if d.pool != nil {
		d.pool.Close()
	}
	_ = d.db.Close()
}

// checkDurable holds n connections of DBOS's pool at once and checks each
// commits durably: on SQLite synchronous=FULL (2) and journal_mode=wal, on
// PostgreSQL synchronous_commit and fsync on.
func (d *dbosSide) checkDurable(b *testing.B, n int) {
	ctx := context.Background()
	if d.pool != nil {
		conns := make([]*pgxpool.Conn, 0, n)
		defer func() {
			for _, c := range conns {
				c.Release()
			}
		}()
		for range n {
			c, err := d.pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
			var syncCommit, fsync string
			if err := c.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('fsync')`).Scan(&syncCommit, &fsync); err != nil ||
				syncCommit != "on" || fsync != "on" {
				b.Fatalf("dbos connection synchronous_commit = %s, fsync = %s (%v), want both on", syncCommit, fsync, err)
			}
		}
		return
	}
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := d.db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		var sync int
		var mode string
		if err := c.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync); err != nil || sync != 2 {
			b.Fatalf("dbos connection synchronous = %d (%v), want 2 (FULL)", sync, err)
		}
		if err := c.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
			b.Fatalf("dbos connection journal_mode = %q (%v), want wal", mode, err)
		}
	}
}

// sqliteVersion is the SQLite library version behind a database/sql driver.
func sqliteVersion(b *testing.B, driver string) string {
	db, err := sql.Open(driver, ":memory:")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var v string
	if err := db.QueryRow(`SELECT sqlite_version()`).Scan(&v); err != nil {
		b.Fatal(err)
	}
	return v
}

// run starts one workflow and waits for its result: N steps.
func (d *dbosSide) run() error {
	h, err := dbos.RunWorkflow(d.dctx, d.wf, "{}", dbos.WithWorkflowID(fmt.Sprintf("run-%d", d.runs.Add(1))))
	if err != nil {
		return err
	}
	n, err := h.GetResult()
	if err != nil || n != stepsPerRun {
		return fmt.Errorf("dbos workflow: %d steps (%w)", n, err)
	}
	return nil
}

// runs runs c workflows at once, one per goroutine, and returns the wall
// time until the last has its result.
func (d *dbosSide) runAll(c int) (time.Duration, error) {
	t0 := time.Now()
	if c == 1 {
		err := d.run()
		return time.Since(t0), err
	}
	errs := make([]error, c)
	var wg sync.WaitGroup
	for i := range c {
		wg.Go(func() { errs[i] = d.run() })
	}
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

func (d *dbosSide) check(b *testing.B) {
	ctx := context.Background()
	var done, steps int64
	runs := d.runs.Load()
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM `+d.tables+`workflow_status WHERE status = 'SUCCESS'`).Scan(&done); err != nil || done != runs {
		b.Fatalf("dbos: %d of %d workflows succeeded (%v)", done, runs, err)
	}
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM `+d.tables+`operation_outputs`).Scan(&steps); err != nil || steps != runs*stepsPerRun {
		b.Fatalf("dbos: %d step outputs recorded, want %d (%v)", steps, runs*stepsPerRun, err)
	}
	d.checkDurable(b, 4)
}

// BenchmarkPeers runs, in one process, the ledger (runs of N auto-approved
// write actions through Engine.Advance), DBOS Transact (workflows of N
// steps) and the raw commit floor, interleaved op by op so drift in the
// disk's speed hits all three alike: on SQLite (files in one temp dir,
// WAL, synchronous=FULL) and on PostgreSQL (each on a fresh database of
// the pgtest server, synchronous_commit on; skipped when none is
// reachable), at concurrency 1 (one op: one ledger run, one DBOS workflow,
// N floor commits) and 32 (one op: 32 ledger runs from 32 goroutines, then
// 32 DBOS workflows from 32 goroutines, then N floor commits, one after
// another: the floor is one connection's commits at every level).
func BenchmarkPeers(b *testing.B) {
	for _, driver := range []string{"sqlite", "postgres"} {
		for _, c := range levels {
			b.Run(fmt.Sprintf("%s/c=%d", driver, c), func(b *testing.B) { benchPeers(b, driver, c) })
		}
	}
}

func benchPeers(b *testing.B, driver string, c int) {
	ctx := b.Context()
	tool := perf.NewInstantTool()
	var (
		led   *perf.Actions
		dbs   *dbosSide
		floor *perf.Floor
		err   error
	)
	switch driver {
	case "sqlite":
		dir := b.TempDir()
		if led, err = perf.OpenActions(ctx, filepath.Join(dir, "ledger.db")); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = led.Close() })
		dbs = newDBOSSQLite(b, dir, tool)
		if floor, err = perf.OpenFloor(ctx, dir); err != nil {
			b.Fatal(err)
		}
		if c == 1 {
			b.Logf("sqlite: ledger and floor on mattn/go-sqlite3 (cgo) %s; DBOS on modernc.org/sqlite (pure Go) %s; all WAL, synchronous=FULL",
				sqliteVersion(b, "sqlite3"), sqliteVersion(b, "sqlite"))
		}
	case "postgres":
		ledDB, dbosDB, floorDB := pgtest.NewDatabase(b), pgtest.NewDatabase(b), pgtest.NewDatabase(b)
		if led, err = perf.OpenActions(ctx, ledDB); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = led.Close() })
		dbs = newDBOSPostgres(b, dbosDB, tool)
		if floor, err = perf.OpenPostgresFloor(ctx, floorDB); err != nil {
			b.Fatal(err)
		}
		if c == 1 {
			b.Log("postgres: three fresh databases on one server (ledger: GORM + pgx, a pool of 16, SERIALIZABLE writes; " +
				"DBOS: its pgx pool of 20; floor: database/sql + pgx, one connection), synchronous_commit on")
		}
	}
	b.Cleanup(func() { _ = floor.Close() })
	if driver == "sqlite" && c == 1 {
		b.Log("guarantees: DBOS checkpoints a step's output after the step runs: a crash mid-step leaves nothing on record " +
			"that the step started, and recovery re-runs it (at-least-once calls). The ledger records the attempt before it calls " +
			"the tool, then the outcome: after a crash recovery knows the call may have happened, treats its effect as unknown, " +
			"and queries, resends with the dedup key, cancels or hands it to a person by the tool's guarantees, never a blind re-run.")
		b.Log("timing: ledger = SubmitRun + Engine.Advance (2 commits per action: step usage, action and attempt start in one; the outcome in the other; plus a few per run); " +
			"DBOS = RunWorkflow + GetResult (1 commit per step, plus 2 per workflow); floor = one-row commits")
	}

	var ledgerTime, advanceTime, dbosTime, floorTime time.Duration
	var ledgerSteps, dbosSteps, floorSteps int
	var ledgerErr error
	for b.Loop() {
		// The submit is timed too (it is one commit), as DBOS's RunWorkflow
		// timing includes recording the workflow; advance alone is the
		// figure engine/bench_test.go reports (at c=1).
		switch {
		case ledgerErr != nil: // the ledger failed: DBOS and the floor go on, to be reported beside the failure
		case c == 1:
			submit, advance, err := led.Run(ctx)
			if err != nil {
				ledgerErr = err
				break
			}
			ledgerTime += submit + advance
			advanceTime += advance
			ledgerSteps += stepsPerRun
		default:
			lv, err := led.Drive(ctx, c, c, 0)
			if err != nil {
				ledgerErr = err
				break
			}
			ledgerTime += lv.Elapsed
			ledgerSteps += lv.Actions
		}
		d, err := dbs.runAll(c)
		if err != nil {
			b.Fatalf("dbos: %v", err)
		}
		dbosTime += d
		dbosSteps += c * stepsPerRun
		commits, err := floor.Commits(ctx, stepsPerRun)
		if err != nil {
			b.Fatal(err)
		}
		floorTime += commits
		floorSteps += stepsPerRun
	}
	b.StopTimer()
	dbs.check(b)

	dbosPerSec := float64(dbosSteps) / dbosTime.Seconds()
	floorPerSec := float64(floorSteps) / floorTime.Seconds()
	if ledgerErr == nil {
		ledgerErr = led.CheckCompleted(ctx)
	}
	if ledgerErr != nil {
		b.Logf("dbos_steps/s %.1f, floor_commits/s %.1f, dbos_ratio_to_floor %.3f; the ledger failed after %d actions",
			dbosPerSec, floorPerSec, dbosPerSec/floorPerSec, ledgerSteps)
		b.Fatalf("ledger at c=%d on %s: %v", c, driver, ledgerErr)
	}
	ledgerPerSec := float64(ledgerSteps) / ledgerTime.Seconds()
	b.ReportMetric(ledgerPerSec, "ledger_actions/s")
	if c == 1 {
		b.ReportMetric(float64(ledgerSteps)/advanceTime.Seconds(), "ledger_advance_actions/s")
	}
	b.ReportMetric(dbosPerSec, "dbos_steps/s")
	b.ReportMetric(ledgerPerSec/dbosPerSec, "ratio")
	b.ReportMetric(floorPerSec, "floor_commits/s")
	b.ReportMetric(ledgerPerSec/floorPerSec, "ledger_ratio_to_floor")
	b.ReportMetric(dbosPerSec/floorPerSec, "dbos_ratio_to_floor")
}
