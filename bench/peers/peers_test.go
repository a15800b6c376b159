// Package peers compares the ledger with a peer durable-execution library on
// the same workload, the same disk and the same synchronous setting. It is a
// module of its own so the peer's dependencies never reach the product's
// go.mod.
package peers

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	_ "github.com/dbos-inc/dbos-transact-golang/dbos/driver/sqlite" // registers modernc.org/sqlite ("sqlite") for DBOS

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/perf"
)

// stepsPerRun is N: one ledger run is N write actions, one DBOS workflow is
// N steps, and one op of the benchmark is one of each plus N floor commits.
const stepsPerRun = perf.ActionsPerRun

// The ledger side is perf.Actions, engine/bench_test.go's and `ledger
// bench`'s action workload: a Store on a real file with synchronous=FULL,
// an agent whose scripted model asks for N writes of perf.InstantTool (it
// answers at once and changes nothing anywhere, so what is measured is each
// side's cost per step), and a rule that auto-approves them. The DBOS side
// calls the same tool with the same arguments (perf.StepArguments).

// dbosSide is DBOS Transact on its SQLite system database, opened by us so
// that synchronous is FULL: with a DatabaseURL DBOS opens the file itself
// and sets synchronous=NORMAL on its connections.
type dbosSide struct {
	db   *sql.DB
	dctx dbos.Context
	wf   dbos.Workflow[string, int]
	runs int
}

// dbosDSN is modernc.org/sqlite's DSN: each _pragma is run on every new
// connection of the pool. The pragmas are those DBOS sets on the pools it
// opens itself (WAL, foreign keys, busy timeout, IMMEDIATE transactions),
// except synchronous, which is FULL like the ledger's.
func dbosDSN(path string) string {
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)" +
		"&_pragma=busy_timeout(5000)&_pragma=foreign_keys(ON)&_txlock=immediate"
}

func newDBOSSide(b *testing.B, dir string, tool perf.InstantTool) *dbosSide {
	ctx := context.Background()
	db, err := sql.Open("sqlite", dbosDSN(filepath.Join(dir, "dbos.db")))
	if err != nil {
		b.Fatal(err)
	}
	// DBOS's own pool sizes for the SQLite pools it opens.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(4)
	db.SetConnMaxLifetime(time.Hour)
	checkPragmas(b, db, 4)

	d := &dbosSide{db: db}
	d.dctx, err = dbos.NewContext(ctx, dbos.Config{
		AppName:        "ledger-peers-bench",
		SQLiteSystemDB: db,
		// Warnings and errors still show; DBOS's info lines would drown the
		// benchmark's output.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		_ = db.Close()
		b.Fatal(err)
	}
	// The workflow: N steps, each calling the instant tool with the same
	// arguments the ledger's actions carry; DBOS checkpoints each output.
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
		_ = db.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := dbos.Shutdown(d.dctx, 10*time.Second); err != nil {
			b.Logf("dbos shutdown: %v", err)
		}
		_ = db.Close()
	})
	return d
}

// checkPragmas holds n connections of the pool at once and checks each runs
// with synchronous=FULL (2) and journal_mode=wal.
func checkPragmas(b *testing.B, db *sql.DB, n int) {
	ctx := context.Background()
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
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
func (d *dbosSide) run(b *testing.B) time.Duration {
	d.runs++
	t0 := time.Now()
	h, err := dbos.RunWorkflow(d.dctx, d.wf, "{}", dbos.WithWorkflowID(fmt.Sprintf("run-%d", d.runs)))
	if err != nil {
		b.Fatal(err)
	}
	n, err := h.GetResult()
	if err != nil || n != stepsPerRun {
		b.Fatalf("dbos workflow: %d steps (%v)", n, err)
	}
	return time.Since(t0)
}

func (d *dbosSide) check(b *testing.B) {
	ctx := context.Background()
	var done, steps int
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM workflow_status WHERE status = 'SUCCESS'`).Scan(&done); err != nil || done != d.runs {
		b.Fatalf("dbos: %d of %d workflows succeeded (%v)", done, d.runs, err)
	}
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM operation_outputs`).Scan(&steps); err != nil || steps != d.runs*stepsPerRun {
		b.Fatalf("dbos: %d step outputs recorded, want %d (%v)", steps, d.runs*stepsPerRun, err)
	}
	checkPragmas(b, d.db, 4)
}

// BenchmarkPeers runs, in one process and on files in one temp dir, the
// ledger (runs of N auto-approved write actions through Engine.Advance),
// DBOS Transact (workflows of N steps), and the raw commit floor, all with
// synchronous=FULL and WAL, interleaved op by op so drift in the disk's
// speed hits all three alike. One op is one ledger run, one DBOS workflow
// and N floor commits.
func BenchmarkPeers(b *testing.B) {
	ctx := b.Context()
	dir := b.TempDir()
	led, err := perf.OpenActions(ctx, filepath.Join(dir, "ledger.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = led.Close() })
	dbs := newDBOSSide(b, dir, perf.NewInstantTool())
	floor, err := perf.OpenFloor(ctx, dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = floor.Close() })

	b.Log("guarantees: DBOS checkpoints a step's output after the step runs: a crash mid-step leaves nothing on record " +
		"that the step started, and recovery re-runs it (at-least-once calls). The ledger records the attempt before it calls " +
		"the tool, then the outcome: after a crash recovery knows the call may have happened, treats its effect as unknown, " +
		"and queries, resends with the dedup key, cancels or hands it to a person by the tool's guarantees, never a blind re-run.")
	b.Logf("sqlite: ledger and floor on mattn/go-sqlite3 (cgo) %s; DBOS on modernc.org/sqlite (pure Go) %s; all WAL, synchronous=FULL",
		sqliteVersion(b, "sqlite3"), sqliteVersion(b, "sqlite"))
	b.Log("timing: ledger = SubmitRun + Engine.Advance (2 commits per action: step usage, action and attempt start in one; the outcome in the other; plus a few per run); " +
		"DBOS = RunWorkflow + GetResult (1 commit per step, plus 2 per workflow); floor = one-row commits")

	var ledgerTime, advanceTime, dbosTime, floorTime time.Duration
	steps := 0
	for b.Loop() {
		// The submit is timed too (it is one commit), as DBOS's RunWorkflow
		// timing includes recording the workflow; advance alone is the
		// figure engine/bench_test.go reports.
		submit, advance, err := led.Run(ctx)
		if err != nil {
			b.Fatal(err)
		}
		ledgerTime += submit + advance
		advanceTime += advance
		dbosTime += dbs.run(b)
		commits, err := floor.Commits(ctx, stepsPerRun)
		if err != nil {
			b.Fatal(err)
		}
		floorTime += commits
		steps += stepsPerRun
	}
	b.StopTimer()
	if err := led.CheckCompleted(ctx); err != nil {
		b.Fatalf("ledger: %v", err)
	}
	dbs.check(b)

	ledgerPerSec := float64(steps) / ledgerTime.Seconds()
	dbosPerSec := float64(steps) / dbosTime.Seconds()
	floorPerSec := float64(steps) / floorTime.Seconds()
	b.ReportMetric(ledgerPerSec, "ledger_actions/s")
	b.ReportMetric(float64(steps)/advanceTime.Seconds(), "ledger_advance_actions/s")
	b.ReportMetric(dbosPerSec, "dbos_steps/s")
	b.ReportMetric(ledgerPerSec/dbosPerSec, "ratio")
	b.ReportMetric(floorPerSec, "floor_commits/s")
	b.ReportMetric(ledgerPerSec/floorPerSec, "ledger_ratio_to_floor")
	b.ReportMetric(dbosPerSec/floorPerSec, "dbos_ratio_to_floor")
}
