package server_test

import (
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

// The benchmarks run the whole service on real SQLite files (WAL,
// synchronous=FULL) behind an httptest server on loopback, and report a
// raw SQLite commit on the same file system as the floor: machines differ
// by orders of magnitude in fsync cost, ratios less so.

// floorMS measures the mean of n raw committed inserts, in milliseconds.
func floorMS(b *testing.B, n int) float64 {
	b.Helper()
	f := ledgertest.OpenFloor(b, b.TempDir())
	start := time.Now()
	for range n {
		f.Commit(b)
	}
	return float64(time.Since(start).Microseconds()) / 1000 / float64(n)
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

// BenchmarkApproveRoundTrip measures one run's whole approval flow per op:
// submit over HTTP, advance to the pending approval, approve over HTTP,
// advance to completed. It reports the approve request's latency
// percentiles and their ratio to a raw SQLite commit.
func BenchmarkApproveRoundTrip(b *testing.B) {
	e := newEnv(b, options{})
	body := submitBody(b)
	floor := floorMS(b, 20)
	latencies := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		res := e.submitRaw(b, "alice", "rt-"+strconv.Itoa(i), body)
		if res.Status != http.StatusCreated {
			b.Fatalf("submit: %d %s", res.Status, res.Body)
		}
		id, a := runAndPending(b, e, res)
		start := time.Now()
		res = e.post(b, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest))
		latencies = append(latencies, time.Since(start))
		if res.Status != http.StatusOK {
			b.Fatalf("approve: %d %s", res.Status, res.Body)
		}
		if run := e.advance(b, id); run.State != ledger.RunCompleted {
			b.Fatalf("run %s is %s", id, run.State)
		}
	}
	b.StopTimer()
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		i := min(len(latencies)-1, int(float64(len(latencies))*p))
		return float64(latencies[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
	b.ReportMetric(floor, "floor_commit_ms")
	b.ReportMetric(pct(0.50)/floor, "p50_x_floor")
	if n := e.effectCount(b); n != b.N {
		b.Fatalf("%d effects for %d runs", n, b.N)
	}
}

func runAndPending(b *testing.B, e *env, res response) (ledger.RunID, *ledger.Action) {
	b.Helper()
	id := ledger.RunID(res.Header.Get("Location")[len("/v1/runs/"):])
	if run := e.advance(b, id); run.State != ledger.RunAwaitingApproval {
		b.Fatalf("run %s is %s", id, run.State)
	}
	return id, e.pendingAction(b, id)
}
