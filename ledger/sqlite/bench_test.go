package sqlite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/perf"
)

// The hot path of a run is three committed writes per tool call: record the
// action (approved by the rules), start the attempt before calling the
// tool, finish it with the tool's answer. Each is one IMMEDIATE transaction
// on a real file with synchronous=FULL, so each costs at least one fsync of
// the WAL: the floor is a raw one-row INSERT committed the same way.
// Machines differ by orders of magnitude in fsync cost; the figure to
// report is the ratio to the floor measured in the same run
// (BenchmarkHotPathVsFloor), with the floor from perf.Floor, the one
// `ledger bench` measures.

// hotPath is a Store with one running run and unlimited budgets.
type hotPath struct {
	store *ledger.DB
	run   ledger.RunID
	n     int
}

func openHotPath(b *testing.B, dir string) *hotPath {
	b.Helper()
	// Default Config: synchronous=FULL.
	bundle := ledgertest.OpenStoreAt(b, filepath.Join(dir, "ledger.db"), ledgertest.NewClock())
	run := bundle.RunningRun(b, "bench", ledger.BudgetLimits{})
	return &hotPath{store: bundle.Store, run: run.ID}
}

// openFloor opens perf's floor in dir, closed with b.
func openFloor(b *testing.B, dir string) *perf.Floor {
	b.Helper()
	f, err := perf.OpenFloor(b.Context(), dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	return f
}

var benchArgs = json.RawMessage(`{"cards":[{"front":"q","back":"a"}]}`)

// action runs the three writes of one tool call and returns how long each
// took.
func (h *hotPath) action(b *testing.B) (record, start, finish time.Duration) {
	ctx := context.Background()
	h.n++
	t0 := time.Now()
	res, err := h.store.CreateAction(ctx, ledger.CreateActionParams{
		RunID: h.run, IdempotencyKey: fmt.Sprintf("step-%d", h.n), Tool: "cards.write", ToolVersion: "1",
		Effect: ledger.EffectWrite, Arguments: benchArgs, Gate: ledger.ActionApproved, Actor: "engine",
	})
	if err != nil {
		b.Fatalf("record action: %v", err)
	}
	t1 := time.Now()
	att, err := h.store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: res.Action.ID, Actor: "worker"})
	if err != nil {
		b.Fatalf("start attempt: %v", err)
	}
	t2 := time.Now()
	_, err = h.store.FinishAttempt(ctx, ledger.FinishAttemptParams{
		AttemptID: att.ID, Status: ledger.AttemptSucceeded,
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened},
		Result:      json.RawMessage(`{"written":1}`), Actor: "worker",
	})
	if err != nil {
		b.Fatalf("finish attempt: %v", err)
	}
	t3 := time.Now()
	return t1.Sub(t0), t2.Sub(t1), t3.Sub(t2)
}

// BenchmarkRawCommit is the floor: one single-row INSERT committed per op.
func BenchmarkRawCommit(b *testing.B) {
	ctx := b.Context()
	f := openFloor(b, b.TempDir())
	n := 0
	for b.Loop() {
		if err := f.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "commits/s")
}

// BenchmarkHotPath measures one tool call's three writes through the Store,
// as a whole (ns/op = ns/action) and each write alone.
func BenchmarkHotPath(b *testing.B) {
	h := openHotPath(b, b.TempDir())
	var record, start, finish time.Duration
	for b.Loop() {
		r, s, f := h.action(b)
		record, start, finish = record+r, start+s, finish+f
	}
	n := float64(h.n)
	b.ReportMetric(float64((record+start+finish).Nanoseconds())/n, "ns/action")
	b.ReportMetric(float64(record.Nanoseconds())/n, "ns/record")
	b.ReportMetric(float64(start.Nanoseconds())/n, "ns/start")
	b.ReportMetric(float64(finish.Nanoseconds())/n, "ns/finish")
	b.ReportMetric(n/(record+start+finish).Seconds(), "actions/s")
}

// BenchmarkHotPathVsFloor measures the floor and the hot path in one run,
// b.N of each, interleaved so that a noisy moment of the disk falls on both,
// and reports their ratio: the figure that carries from machine to machine.
func BenchmarkHotPathVsFloor(b *testing.B) {
	dir := b.TempDir()
	ctx := b.Context()
	f := openFloor(b, dir)
	h := openHotPath(b, dir)
	var floor, hot time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := f.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		h.action(b)
		t2 := time.Now()
		floor, hot = floor+t1.Sub(t0), hot+t2.Sub(t1)
	}
	n := float64(h.n)
	floorCommitsPerSec := n / floor.Seconds()
	actionsPerSec := n / hot.Seconds()
	writesPerSec := 3 * actionsPerSec
	b.ReportMetric(floorCommitsPerSec, "floor_commits/s")
	b.ReportMetric(actionsPerSec, "actions/s")
	b.ReportMetric(actionsPerSec/floorCommitsPerSec, "ratio_to_floor")
	b.ReportMetric(writesPerSec/floorCommitsPerSec, "write_ratio")
}
