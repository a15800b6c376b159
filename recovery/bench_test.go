package recovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/recovery"
)

// benchRuns is how many interrupted runs BenchmarkRecoveryScan recovers:
// LEDGER_BENCH_RECOVERY_RUNS, default 1000 so the CI smoke run stays
// short; the closing notes quote 10000.
func benchRuns(b *testing.B) int {
	if v := os.Getenv("LEDGER_BENCH_RECOVERY_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("LEDGER_BENCH_RECOVERY_RUNS=%q", v)
		}
		return n
	}
	return 1000
}

// interruptedRuns writes n runs, each with one approved write action whose
// attempt was started and never finished, as a crash leaves them. Setup
// runs with synchronous=OFF; the scan is measured on a FULL store.
func interruptedRuns(b *testing.B, path string, n int) {
	ctx := context.Background()
	s, err := ledger.Open(ctx, ledger.Config{Path: path, Synchronous: "OFF"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: fmt.Sprintf("k%d", i),
			Principal: "bench", Agent: "bench", Input: json.RawMessage(`{}`)})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.TransitionRun(ctx, ledger.RunTransition{ID: res.Run.ID, From: ledger.RunQueued, To: ledger.RunRunning}); err != nil {
			b.Fatal(err)
		}
		a, err := s.CreateAction(ctx, ledger.CreateActionParams{RunID: res.Run.ID, IdempotencyKey: "step-1", Tool: "bench.write",
			ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"i":1}`), Gate: ledger.ActionApproved})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.Action.ID}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecoveryScan times one start-up scan over many interrupted runs
// of a tool that can be queried (instantly, answering "not happened"): per
// run, a query decision, the observation, a continue decision, the attempt
// closed and the action back to approved — each durable. Reported beside
// the raw commit floor of the same file system.
func BenchmarkRecoveryScan(b *testing.B) {
	n := benchRuns(b)
	ctx := context.Background()
	var scan time.Duration
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		path := filepath.Join(dir, "ledger.db")
		interruptedRuns(b, path, n)
		s, err := ledger.Open(ctx, ledger.Config{Path: path})
		if err != nil {
			b.Fatal(err)
		}
		r := recovery.New(recovery.Config{Store: s, Probes: func(string, string) (recovery.Probe, bool) {
			return recovery.Probe{Tool: recovery.Tool{Guarantees: contracts.Guarantees{Query: true}},
				QueryFunc: func(context.Context, string) (ledger.EffectFact, json.RawMessage, error) {
					return ledger.EffectNotHappened, nil, nil
				}}, true
		}})
		b.StartTimer()
		t0 := time.Now()
		rep, err := r.Scan(ctx)
		scan += time.Since(t0)
		b.StopTimer()
		if err != nil || rep.Actions != n || rep.Decisions[recovery.Continue] != n {
			b.Fatalf("scan: %+v, %v", rep, err)
		}
		floor := ledgertest.OpenFloor(b, dir)
		t0 = time.Now()
		for range 200 {
			floor.Commit(b)
		}
		floorPerSec := 200 / time.Since(t0).Seconds()
		_ = s.Close()
		perRun := scan.Seconds() / float64(n)
		b.ReportMetric(float64(n), "runs")
		b.ReportMetric(scan.Seconds(), "scan_s")
		b.ReportMetric(perRun*1e3, "ms/run")
		b.ReportMetric(perRun*floorPerSec, "floor_commits/run")
		scan = 0
		b.StartTimer()
	}
}
