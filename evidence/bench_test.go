package evidence_test

import (
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/perf"
	"github.com/stretchr/testify/require"
)

// BenchmarkExport10kEvents builds and writes the JSON report of a run with
// about 10,000 events: the golden run (two actions, approvals, recovery,
// cancellation) plus model-step usage records. Setup writes with
// synchronous=OFF, which changes nothing about reading. One op is Build
// (every query, the chain verification, redaction of every event) plus
// JSON (encoding and schema validation), reported as ms/export. The filling
// and the timing are perf's, the ones `ledger bench` runs.
func BenchmarkExport10kEvents(b *testing.B) {
	const n = 10_000
	ctx := b.Context()
	f := openFixtureWith(b, sqlite.Config{Synchronous: "OFF"})
	id := goldenRun(b, f)
	_, err := perf.FillEvents(ctx, f.store, id, n)
	require.NoError(b, err)
	opts := f.options(b)

	var build, render time.Duration
	events := 0
	for b.Loop() {
		e, err := perf.ExportOnce(ctx, f.store, id, opts, n)
		if err != nil {
			b.Fatal(err)
		}
		build, render, events = build+e.Build, render+e.Render, e.Events
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(build+render), "ms/export")
	b.ReportMetric(ms(build), "ms/build")
	b.ReportMetric(ms(render), "ms/json")
	b.ReportMetric(float64(events), "events")
}
