package server_test

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actionledger/ledger/perf"
)

// The benchmarks run the whole service on real SQLite files (WAL,
// synchronous=FULL) behind an httptest server on loopback, and report a
// raw SQLite commit on the same file system as the floor (perf.Floor):
// machines differ by orders of magnitude in fsync cost, ratios less so.

// floorMS measures the mean of n raw committed inserts, in milliseconds.
func floorMS(b *testing.B, n int) float64 {
	b.Helper()
	f, err := perf.OpenFloor(b.Context(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	d, err := f.Commits(b.Context(), n)
	if err != nil {
		b.Fatal(err)
	}
	return float64(d.Microseconds()) / 1000 / float64(n)
}

// BenchmarkSubmit measures POST /v1/runs with distinct keys from parallel
// clients: one write transaction (run, budget, event) per request.
func BenchmarkSubmit(b *testing.B) {
	e := newEnv(b, options{})
	body := submitBody(b)
	floor := floorMS(b, 20)
	var n atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := "bench-" + strconv.FormatInt(n.Add(1), 10)
			res := e.submitRaw(b, "alice", key, body)
			if res.Status != http.StatusCreated {
				b.Fatalf("submit: %d %s", res.Status, res.Body)
			}
		}
	})
	b.StopTimer()
	perOp := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(1/perOp, "submits/s")
	b.ReportMetric(floor, "floor_commit_ms")
	b.ReportMetric(perOp*1000/floor, "x_floor")
}

// BenchmarkApproveRoundTrip measures one run's whole approval flow per op,
// perf.RoundTrip's, the one `ledger bench` makes: submit over HTTP as
// alice, advance to the pending approval, approve over HTTP as bob,
// advance to completed. It reports the approve request's latency
// percentiles and their ratio to a raw SQLite commit.
func BenchmarkApproveRoundTrip(b *testing.B) {
	e := newEnv(b, options{})
	floor := floorMS(b, 20)
	rt := perf.RoundTrip{URL: e.ts.URL, Client: e.client, SubmitToken: e.tokens["alice"], ApproveToken: e.tokens["bob"],
		Advance: e.engine.Advance}
	latencies := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		t, err := rt.Once(b.Context(), "rt-"+strconv.Itoa(i))
		if err != nil {
			b.Fatal(err)
		}
		latencies = append(latencies, t.Approve)
	}
	b.StopTimer()
	pct := func(p float64) float64 { return float64(perf.Percentile(latencies, p).Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
	b.ReportMetric(floor, "floor_commit_ms")
	b.ReportMetric(pct(0.50)/floor, "p50_x_floor")
	if n := e.effectCount(b); n != b.N {
		b.Fatalf("%d effects for %d runs", n, b.N)
	}
}
