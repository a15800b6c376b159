package recovery_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/actionledger/ledger/perf"
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

// BenchmarkRecoveryScan times one start-up scan over many interrupted runs
// of a tool that can be queried (instantly, answering "not happened"): per
// run, a query decision, the observation, a continue decision, the attempt
// closed and the action back to approved — durable together, in one
// transaction per run, commits shared between runs. Reported beside
// the raw commit floor of the same file system. The workload is perf's,
// the one `ledger bench` runs: perf.WriteInterruptedRuns writes the runs
// (synchronous=OFF), perf.ScanRecovery times the scan on a FULL store.
func BenchmarkRecoveryScan(b *testing.B) {
	n := benchRuns(b)
	ctx := b.Context()
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		path := filepath.Join(dir, "ledger.db")
		if err := perf.WriteInterruptedRuns(ctx, path, n, nil); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		scan, err := perf.ScanRecovery(ctx, path, n, nil)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		floor, err := perf.OpenFloor(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = floor.Close() })
		commits, err := floor.Commits(ctx, 200)
		if err != nil {
			b.Fatal(err)
		}
		floorPerSec := 200 / commits.Seconds()
		perRun := scan.Seconds() / float64(n)
		b.ReportMetric(float64(n), "runs")
		b.ReportMetric(scan.Seconds(), "scan_s")
		b.ReportMetric(perRun*1e3, "ms/run")
		b.ReportMetric(perRun*floorPerSec, "floor_commits/run")
		b.StartTimer()
	}
}
