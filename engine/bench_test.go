package engine_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/perf"
)

// The workload is perf's, the one `ledger bench` runs: runs of ten
// auto-approved writes of an instant tool, driven by Engine.Advance on a
// real file (synchronous=FULL), beside the raw commit floor.

// openActions opens perf's action workload in dir, closed with b.
func openActions(b *testing.B, dir string) *perf.Actions {
	a, err := perf.OpenActions(b.Context(), filepath.Join(dir, "ledger.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	return a
}

// BenchmarkEngineConcurrency drives runs from 1, 8 and 32 goroutines at
// once; group commit lets concurrent writes share their fsyncs, so
// actions/s should grow with concurrency. Each op is one run of ten actions.
func BenchmarkEngineConcurrency(b *testing.B) {
	for _, c := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			a := openActions(b, b.TempDir())
			b.ResetTimer()
			lv, err := a.Drive(b.Context(), c, b.N, 0)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(lv.PerSecond(), "actions/s")
		})
	}
}

// BenchmarkEngineCPU is BenchmarkEngineConcurrency at 1 and 32 with
// synchronous=OFF, so that no fsync is waited for, and reports the CPU the
// process spent per action (user and system, getrusage): the ledger's own
// cost per durable action, which varies far less than wall time on a
// shared machine. Each op is one run of ten actions.
func BenchmarkEngineCPU(b *testing.B) {
	for _, c := range []int{1, 32} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			a, err := perf.OpenActionsWith(b.Context(), sqlite.Config{Path: filepath.Join(b.TempDir(), "ledger.db"), Synchronous: "OFF"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = a.Close() })
			cpu0, ok := perf.ProcessCPU()
			b.ResetTimer()
			lv, err := a.Drive(b.Context(), c, b.N, 0)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(lv.PerSecond(), "actions/s")
			if cpu1, ok1 := perf.ProcessCPU(); ok && ok1 {
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(lv.Actions), "cpu_us/action")
			}
		})
	}
}

// BenchmarkEngineActions drives runs of ten auto-approved write actions
// each through Engine.Advance on a real file (synchronous=FULL), and
// reports actions per second beside raw single-row commits per second
// measured in the same run on the same file system: ratio_to_floor is the
// figure to compare across machines. Per action the engine commits twice
// (the model step's usage, the action through the gate and its attempt
// started, in one; the attempt's outcome in the other), so 0.5 would be
// "no cost beyond the fsyncs".
func BenchmarkEngineActions(b *testing.B) {
	ctx := b.Context()
	dir := b.TempDir()
	a := openActions(b, dir)
	floor, err := perf.OpenFloor(ctx, dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = floor.Close() })

	var engineTime, floorTime time.Duration
	actions := 0
	for b.Loop() {
		// One op is one run of ten actions, then as many floor commits.
		_, advance, err := a.Run(ctx)
		if err != nil {
			b.Fatal(err)
		}
		engineTime += advance
		actions += perf.ActionsPerRun
		commits, err := floor.Commits(ctx, perf.ActionsPerRun)
		if err != nil {
			b.Fatal(err)
		}
		floorTime += commits
	}
	if err := a.CheckCompleted(ctx); err != nil {
		b.Fatal(err)
	}
	actionsPerSec := float64(actions) / engineTime.Seconds()
	floorPerSec := float64(actions) / floorTime.Seconds()
	b.ReportMetric(actionsPerSec, "actions/s")
	b.ReportMetric(floorPerSec, "floor_commits/s")
	b.ReportMetric(actionsPerSec/floorPerSec, "ratio_to_floor")
}
