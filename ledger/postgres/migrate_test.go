package postgres_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

func TestOpenMigratesOnceAndRecordsIt(t *testing.T) {
	applied := time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC)
	f := open(t, postgres.Config{Now: func() time.Time { return applied }})
	ctx := context.Background()

	v, err := f.d.SchemaVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, postgres.SchemaVersion(), v)
	require.Equal(t, 6, v)

	rows, err := f.raw.Query(`SELECT version, name, applied_at FROM schema_migrations ORDER BY version`)
	require.NoError(t, err)
	var names []string
	for rows.Next() {
		var (
			version int
			name    string
			at      int64
		)
		require.NoError(t, rows.Scan(&version, &name, &at))
		require.Equal(t, len(names)+1, version)
		require.Equal(t, applied.UnixMicro(), at)
		names = append(names, name)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"0001_schema.sql", "0002_run_leases.sql", "0003_store_probe.sql", "0004_rule_sets.sql",
		"0005_approval_execute_by.sql", "0006_delivered_observations.sql"}, names)

	// Opening again applies nothing.
	again := openOn(t, f.dsn)
	v, err = again.d.SchemaVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, v)
	require.Equal(t, 6, f.count(t, "schema_migrations"))

	require.ElementsMatch(t, []string{"actions", "agent_decisions", "approvals", "attempt_leases", "attempts", "budgets",
		"cancellations", "chain_signatures", "events", "observations", "rule_sets", "runs", "schema_migrations", "store_probes"}, tables(t, f.raw))
}

// tables lists the tables of the session's schema.
func tables(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename`)
	require.NoError(t, err)
	defer func() { _ = rows.Close() }()
	var out []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestOpenRefusesANewerSchemaAndTouchesNothing(t *testing.T) {
	f := open(t)
	_, err := f.raw.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, '9999_future.sql', 42)`, postgres.SchemaVersion()+1)
	require.NoError(t, err)
	before := tables(t, f.raw)

	_, err = postgres.Open(context.Background(), postgres.Config{DSN: f.dsn})
	requireCode(t, ledger.CodeUnsupportedVersion, err)
	require.ErrorIs(t, err, ledger.ErrUnsupportedVersion)
	require.ErrorContains(t, err, "newer than this build")

	require.Equal(t, before, tables(t, f.raw))
	rows, err := f.raw.Query(`SELECT version, name, applied_at FROM schema_migrations ORDER BY version`)
	require.NoError(t, err)
	defer func() { _ = rows.Close() }()
	var got []string
	for rows.Next() {
		var (
			v  int
			n  string
			at int64
		)
		require.NoError(t, rows.Scan(&v, &n, &at))
		got = append(got, n)
		if v == postgres.SchemaVersion()+1 {
			require.EqualValues(t, 42, at)
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"0001_schema.sql", "0002_run_leases.sql", "0003_store_probe.sql", "0004_rule_sets.sql",
		"0005_approval_execute_by.sql", "0006_delivered_observations.sql", "9999_future.sql"}, got)
}

func TestOpenRefusesANewerSchemaOnADatabaseWithOnlyItsVersion(t *testing.T) {
	// A database a newer build created its own way: only schema_migrations
	// is there. Nothing of this build's schema may be added to it.
	dsn := pgtest.NewSchema(t)
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer func() { _ = raw.Close() }()
	_, err = raw.Exec(`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL);
		INSERT INTO schema_migrations VALUES (9, '0009_future.sql', 1)`)
	require.NoError(t, err)

	_, err = postgres.Open(context.Background(), postgres.Config{DSN: dsn})
	requireCode(t, ledger.CodeUnsupportedVersion, err)
	require.Equal(t, []string{"schema_migrations"}, tables(t, raw))
}

func TestConcurrentOpensMigrateTheDatabaseOnce(t *testing.T) {
	dsn := pgtest.NewSchema(t)
	const n = 6
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, n)
		ds    = make([]*postgres.Driver, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			ds[i], errs[i] = postgres.Open(context.Background(), postgres.Config{DSN: dsn, MaxConns: 2})
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "open %d", i)
		v, err := ds[i].SchemaVersion(context.Background())
		require.NoError(t, err)
		require.Equal(t, postgres.SchemaVersion(), v)
		require.NoError(t, ds[i].Close())
	}
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer func() { _ = raw.Close() }()
	var rows int
	require.NoError(t, raw.QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&rows))
	require.Equal(t, postgres.SchemaVersion(), rows)
}

func TestOpenChecksItsConfig(t *testing.T) {
	ctx := context.Background()
	_, err := postgres.Open(ctx, postgres.Config{})
	requireCode(t, ledger.CodeInvalid, err)
	_, err = postgres.Open(ctx, postgres.Config{DSN: "postgres://x@127.0.0.1/x", MaxConns: -1})
	requireCode(t, ledger.CodeInvalid, err)
	_, err = postgres.Open(ctx, postgres.Config{DSN: "postgres://x@127.0.0.1/x", WriteAttempts: -1})
	requireCode(t, ledger.CodeInvalid, err)
	// A server that is not there is CodeInternal, with the cause.
	_, err = postgres.Open(ctx, postgres.Config{DSN: "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"})
	requireCode(t, ledger.CodeInternal, err)
	require.True(t, strings.Contains(err.Error(), "open postgres"), err.Error())
}
