package perf_test

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
	"github.com/actionledger/ledger/perf"
	"github.com/actionledger/ledger/redact"
)

// The workloads run for real, briefly, on both drivers: these tests check
// that they do what they say, never how fast. BenchmarkX in the packages
// and `ledger bench` time them. The PostgreSQL cases skip when no server is
// reachable (pgtest).

// drivers runs test once per driver, each time with a function that names
// a fresh database: a file in a temporary directory, or a new database on
// the PostgreSQL test server.
func drivers(t *testing.T, test func(t *testing.T, newDB func(name string) string)) {
	t.Run("sqlite", func(t *testing.T) {
		dir := t.TempDir()
		test(t, func(name string) string { return filepath.Join(dir, name+".db") })
	})
	t.Run("postgres", func(t *testing.T) {
		test(t, func(string) string { return pgtest.NewDatabase(t) })
	})
}

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

func TestPostgresFloor(t *testing.T) {
	ctx := t.Context()
	t.Run("OK", func(t *testing.T) {
		db := pgtest.NewDatabase(t)
		f, err := perf.OpenPostgresFloor(ctx, db)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, f.Commit(ctx))
		n, d, err := f.Measure(ctx, time.Millisecond)
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 20)
		require.Positive(t, d)
		rows := countRows(t, db, "t")
		require.Equal(t, int64(n+1), rows, "one row per commit, every one committed")
	})
	t.Run("Err synchronous_commit off", func(t *testing.T) {
		db := pgtest.NewDatabase(t)
		_, err := perf.OpenPostgresFloor(ctx, db+"&synchronous_commit=off")
		require.ErrorContains(t, err, "synchronous_commit = off")
		_, err = perf.OpenPostgresFloor(ctx, db+"&synchronous_commit=local")
		require.ErrorContains(t, err, "synchronous_commit = local")
	})
}

// countRows counts the rows of table in the PostgreSQL database dsn.
func countRows(t *testing.T, dsn, table string) int64 {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	var n int64
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

func TestPostgresServer(t *testing.T) {
	ctx := t.Context()
	pgtest.NewDatabase(t) // skips when the server is unreachable
	s, err := perf.NewPostgresServer(ctx, pgtest.Server())
	require.NoError(t, err)
	a, err := s.CreateDatabase(ctx, "one")
	require.NoError(t, err)
	b, err := s.CreateDatabase(ctx, "two")
	require.NoError(t, err)
	require.NotEqual(t, a, b)
	require.True(t, strings.HasPrefix(a, "postgres://"), a)
	f, err := perf.OpenPostgresFloor(ctx, a)
	require.NoError(t, err, "the new database can be used")
	require.NoError(t, f.Close())

	name := func(db string) string {
		u, err := url.Parse(db)
		require.NoError(t, err)
		return strings.TrimPrefix(u.Path, "/")
	}
	exists := func(db string) bool {
		conn, err := pgx.Connect(ctx, pgtest.Server())
		require.NoError(t, err)
		defer conn.Close(context.Background())
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&ok))
		return ok
	}
	require.True(t, exists(name(a)))
	require.NoError(t, s.Close(ctx))
	require.False(t, exists(name(a)), "Close drops what CreateDatabase made")
	require.False(t, exists(name(b)))
	require.NoError(t, s.Close(ctx), "a second Close has nothing left to drop")

	_, err = perf.NewPostgresServer(ctx, "/tmp/not-a-url.db")
	require.Error(t, err)
}

func TestActionsDrive(t *testing.T) { drivers(t, testActionsDrive) }

func testActionsDrive(t *testing.T, newDB func(string) string) {
	ctx := t.Context()
	a, err := perf.OpenActions(ctx, newDB("ledger"))
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
	drivers(t, func(t *testing.T, newDB func(string) string) {
		ctx := t.Context()
		db := newDB("recovery")
		require.NoError(t, perf.WriteInterruptedRuns(ctx, db, 5, nil))
		scan, err := perf.ScanRecovery(ctx, db, 5, nil)
		require.NoError(t, err)
		require.Positive(t, scan)
	})
}

func TestEvidence(t *testing.T) { drivers(t, testEvidence) }

func testEvidence(t *testing.T, newDB func(string) string) {
	ctx := t.Context()
	s, id, events, err := perf.EvidenceRun(ctx, newDB("evidence"), 50)
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

func TestProtocolDrive(t *testing.T) { drivers(t, testProtocolDrive) }

func testProtocolDrive(t *testing.T, newDB func(string) string) {
	ctx := t.Context()
	p, err := perf.OpenProtocol(ctx, newDB("protocol"))
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

func TestStreams(t *testing.T) { drivers(t, testStreams) }

func testStreams(t *testing.T, newDB func(string) string) {
	ctx := t.Context()
	s, err := perf.OpenStreams(ctx, newDB("streams"), 40)
	require.NoError(t, err)
	defer s.Close()
	require.GreaterOrEqual(t, s.Events, 40)
	for _, n := range []int{0, 3} {
		lv, err := s.Measure(ctx, n, 20*time.Millisecond, 0, 2)
		require.NoError(t, err, "%d streams", n)
		require.Equal(t, n, lv.Streams)
		require.GreaterOrEqual(t, lv.Window, 20*time.Millisecond)
		require.GreaterOrEqual(t, lv.CPU, time.Duration(0))
		require.Len(t, lv.Latencies, 2)
		require.Positive(t, lv.P(0.5))
	}
	_, err = s.Measure(ctx, 1, 0, 0, 1)
	require.Error(t, err, "no idle window")
}

// BenchmarkIdleStreams measures idle event streams on a long run beside
// none, as `ledger bench` does: the process's CPU per second with 100
// streams open on a run of 3,000 events, each waiting for the next, and
// the latency of an unrelated request (GET /v1/runs/{other}), b.N of them
// at each level. Run once (smoke mode, -benchtime 1x), it uses 300 events
// and 10 streams.
func BenchmarkIdleStreams(b *testing.B) {
	ctx := b.Context()
	events, streams := 3000, 100
	if b.N == 1 {
		events, streams = 300, 10
	}
	s, err := perf.OpenStreams(ctx, filepath.Join(b.TempDir(), "ledger.db"), events)
	require.NoError(b, err)
	defer s.Close()
	b.ResetTimer()
	none, err := s.Measure(ctx, 0, 500*time.Millisecond, 0, b.N)
	require.NoError(b, err)
	open, err := s.Measure(ctx, streams, 500*time.Millisecond, 0, b.N)
	require.NoError(b, err)
	b.StopTimer()
	b.ReportMetric(none.Cores(), "cores-none")
	b.ReportMetric(open.Cores(), "cores-streams")
	b.ReportMetric(float64(none.P(0.50).Microseconds())/1000, "p50-ms-none")
	b.ReportMetric(float64(open.P(0.50).Microseconds())/1000, "p50-ms-streams")
	b.ReportMetric(float64(open.P(0.99).Microseconds())/1000, "p99-ms-streams")
}
