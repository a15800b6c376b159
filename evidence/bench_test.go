package evidence_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// BenchmarkExport10kEvents builds and writes the JSON report of a run with
// about 10,000 events: the golden run (two actions, approvals, recovery,
// cancellation) plus model-step usage records. Setup writes with
// synchronous=OFF, which changes nothing about reading. One op is Build
// (every query, the chain verification, redaction of every event) plus
// JSON (encoding and schema validation), reported as ms/export.
func BenchmarkExport10kEvents(b *testing.B) {
	ctx := context.Background()
	f := openFixtureWith(b, ledger.Config{Synchronous: "OFF"})
	id := goldenRun(b, f)
	for range 10_000 - 35 {
		_, err := f.store.AddUsage(ctx, ledger.AddUsageParams{RunID: id, Steps: 1, Tokens: 42, Execution: time.Millisecond})
		require.NoError(b, err)
	}
	opts := f.options(b)
	rep, err := evidence.Build(ctx, f.store, id, opts)
	require.NoError(b, err)
	require.GreaterOrEqual(b, len(rep.Timeline), 10_000)
	require.True(b, rep.Chain.OK)

	var build, render time.Duration
	for b.Loop() {
		start := time.Now()
		rep, err := evidence.Build(ctx, f.store, id, opts)
		if err != nil {
			b.Fatal(err)
		}
		built := time.Now()
		if err := rep.JSON(io.Discard); err != nil {
			b.Fatal(err)
		}
		build, render = build+built.Sub(start), render+time.Since(built)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(build+render), "ms/export")
	b.ReportMetric(ms(build), "ms/build")
	b.ReportMetric(ms(render), "ms/json")
	b.ReportMetric(float64(len(rep.Timeline)), "events")
}
