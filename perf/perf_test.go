package perf_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/perf"
	"github.com/actionledger/ledger/redact"
)

// The workloads run for real, briefly: these tests check that they do what
// they say, never how fast. BenchmarkX in the packages and `ledger bench`
// time them.

func TestFloor(t *testing.T) {
	ctx := t.Context()
	f, err := perf.OpenFloor(ctx, t.TempDir())
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Commit(ctx))
	d, err := f.Commits(ctx, 3)
	require.NoError(t, err)
	require.Positive(t, d)
	n, d, err := f.Measure(ctx, time.Millisecond)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 20, "at least 20 commits")
	require.Positive(t, d)
}

func TestActionsDrive(t *testing.T) {
	ctx := t.Context()
	a, err := perf.OpenActions(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	require.NoError(t, err)
	defer a.Close()

	t.Run("OK runs", func(t *testing.T) {
		lv, err := a.Drive(ctx, 2, 3, 0)
		require.NoError(t, err)
		require.Equal(t, 3, lv.Runs)
		require.Equal(t, 3*perf.ActionsPerRun, lv.Actions)
		require.Positive(t, lv.PerSecond())
	})
	t.Run("OK duration", func(t *testing.T) {
		lv, err := a.Drive(ctx, 2, 0, time.Millisecond)
		require.NoError(t, err)
		require.Positive(t, lv.Runs, "a run started before the deadline is finished")
	})
	t.Run("OK run", func(t *testing.T) {
		submit, advance, err := a.Run(ctx)
		require.NoError(t, err)
		require.Positive(t, submit)
		require.Positive(t, advance)
		require.NoError(t, a.CheckCompleted(ctx))
	})
	t.Run("ErrInvalid no bound", func(t *testing.T) {
		_, err := a.Drive(ctx, 1, 0, 0)
		require.Error(t, err)
		_, err = a.Drive(ctx, 0, 1, 0)
		require.Error(t, err)
	})
}

func TestRecovery(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "recovery.db")
	require.NoError(t, perf.WriteInterruptedRuns(ctx, path, 5, nil))
	scan, err := perf.ScanRecovery(ctx, path, 5, nil)
	require.NoError(t, err)
	require.Positive(t, scan)
}

func TestEvidence(t *testing.T) {
	ctx := t.Context()
	s, id, events, err := perf.EvidenceRun(ctx, filepath.Join(t.TempDir(), "evidence.db"), 50)
	require.NoError(t, err)
	defer s.Close()
	require.GreaterOrEqual(t, events, 50)
	r, err := redact.NewRedactor(make([]byte, 32))
	require.NoError(t, err)
	opts := evidence.Options{Redactor: r, Now: time.Now}
	e, err := perf.ExportMedian(ctx, s, id, opts, 50, 3)
	require.NoError(t, err)
	require.Equal(t, events, e.Events)
	require.Equal(t, e.Build+e.Render, e.Total())
	_, err = perf.ExportOnce(ctx, s, id, opts, events+1)
	require.Error(t, err, "fewer events than asked for")
}

func TestPercentile(t *testing.T) {
	require.Zero(t, perf.Percentile(nil, 0.5))
	ds := []time.Duration{5, 1, 4, 2, 3}
	require.Equal(t, time.Duration(3), perf.Percentile(ds, 0.5))
	require.Equal(t, time.Duration(5), perf.Percentile(ds, 0.99))
	require.Equal(t, time.Duration(1), perf.Percentile(ds, 0))
}

func TestProtocolDrive(t *testing.T) {
	ctx := t.Context()
	p, err := perf.OpenProtocol(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	require.NoError(t, err)
	defer p.Close()
	lv, err := p.Drive(ctx, 2, 6, 0)
	require.NoError(t, err)
	require.Equal(t, 6, lv.Calls)
	require.Len(t, lv.Latencies, 6)
	require.Positive(t, lv.P(0.5))
	n, err := p.Store.CountByState(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(6), n.Actions[ledger.ActionSucceeded], "every call recorded as a succeeded action")
}

// BenchmarkProtocolCall times one agent protocol tool call (propose,
// begin, complete of an auto-approved read) over loopback HTTP, from one
// agent; `ledger bench` adds concurrency 32 and the floor beside it.
func BenchmarkProtocolCall(b *testing.B) {
	ctx := b.Context()
	p, err := perf.OpenProtocol(ctx, filepath.Join(b.TempDir(), "ledger.db"))
	require.NoError(b, err)
	defer p.Close()
	lv, err := p.Drive(ctx, 1, 1, 0) // a run, warmed
	require.NoError(b, err)
	require.Equal(b, 1, lv.Calls)
	b.ResetTimer()
	lv, err = p.Drive(ctx, 1, b.N, 0)
	require.NoError(b, err)
	b.ReportMetric(float64(lv.P(0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lv.P(0.99).Microseconds())/1000, "p99-ms")
}
