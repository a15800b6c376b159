package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/migrate"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// TestPragmas checks that both pools run with the settings the store needs
// (WAL, synchronous=FULL for the writer, foreign keys, a busy timeout);
// synchronous and foreign_keys are per connection.
func TestPragmas(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "ledger.db")})
	require.NoError(t, err)
	defer s.Close()
	pragma := func(t *testing.T, reader bool, p string) (v string) {
		db := s.wg // GORM on the writer's connection, which the driver holds
		if reader {
			db = s.r
		}
		require.NoError(t, db.WithContext(ctx).Raw("PRAGMA "+p).Row().Scan(&v))
		return v
	}
	for _, reader := range []bool{false, true} {
		require.Equal(t, "wal", pragma(t, reader, "journal_mode"))
		require.Equal(t, "2", pragma(t, reader, "synchronous"), "FULL")
		require.Equal(t, "1", pragma(t, reader, "foreign_keys"))
		require.Equal(t, "5000", pragma(t, reader, "busy_timeout"))
		require.Equal(t, "2", pragma(t, reader, "temp_store"), "MEMORY, from the driver's connect hook")
	}
	require.Equal(t, "1", pragma(t, true, "query_only"), "readers cannot write")
	require.Equal(t, "0", pragma(t, false, "query_only"))
	sqlDB, err := s.w.DB()
	require.NoError(t, err)
	require.Equal(t, 1, sqlDB.Stats().MaxOpenConnections, "one writer connection")
}

// TestRunReadsUseIndexes checks with EXPLAIN QUERY PLAN that the reads
// evidence makes of one run search an index instead of scanning a table
// that grows with the whole ledger.
func TestRunReadsUseIndexes(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "ledger.db")})
	require.NoError(t, err)
	defer s.Close()
	run := ledger.RunID("run_x")
	reads := map[string]func(db *gorm.DB) *gorm.DB{
		"observations of a run": func(db *gorm.DB) *gorm.DB {
			var rows []sqlrows.Observation
			return observationsQuery(db, ledger.ObservationFilter{RunID: &run}).Find(&rows)
		},
		"approvals of a run": func(db *gorm.DB) *gorm.DB {
			var rows []sqlrows.Approval
			return approvalsQuery(db, ledger.ApprovalFilter{RunID: &run}).Find(&rows)
		},
		"a page of a tenant's pending approvals": func(db *gorm.DB) *gorm.DB {
			var rows []sqlrows.Approval
			tenant, state, after := "acme", ledger.ApprovalPending, ledger.ApprovalID("apr_x")
			return approvalsQuery(db, ledger.ApprovalFilter{Tenant: &tenant, State: &state, AfterID: &after, Limit: 51}).Find(&rows)
		},
		"unsettled cancellations": func(db *gorm.DB) *gorm.DB {
			var rows []sqlrows.Cancellation
			return unsettledCancellations(db).Find(&rows)
		},
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			query := s.r.ToSQL(read)
			plan := queryPlan(t, s, query)
			for _, step := range plan {
				require.NotRegexp(t, `^SCAN (observations|approvals)\b`, step, "plan of %s: %q", query, plan)
				// The partial index holds only unsettled rows: scanning it
				// is the point.
				require.NotRegexp(t, `^SCAN cancellations$`, step, "plan of %s: %q", query, plan)
				if name != "observations of a run" {
					require.NotContains(t, step, "TEMP B-TREE", "plan of %s: %q", query, plan)
				}
			}
		})
	}
}

// queryPlan is the detail of each step of SQLite's plan for query.
func queryPlan(t *testing.T, s *Driver, query string, args ...any) []string {
	t.Helper()
	rows, err := s.r.WithContext(context.Background()).Raw("EXPLAIN QUERY PLAN "+query, args...).Rows()
	require.NoError(t, err)
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
		plan = append(plan, detail)
	}
	require.NoError(t, rows.Err())
	return plan
}

// TestEventsAfterUsesIndex checks with EXPLAIN QUERY PLAN that an event
// stream's poll (ListEventsAfter) searches the events' (run_id, seq) index
// from the seq on, in order, rather than scanning the run's events or
// sorting them.
func TestEventsAfterUsesIndex(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "ledger.db")})
	require.NoError(t, err)
	defer s.Close()
	plan := queryPlan(t, s, sqlrows.ListEventsAfterSQL, "run_x", 5, noLimit)
	require.Len(t, plan, 1, "%q", plan)
	require.Regexp(t, `^SEARCH events USING INDEX \S+ \(run_id=\? AND seq>\?\)$`, plan[0])
}

// TestMigrationForeignKeysOff checks the runner's way of running a
// migration with foreign keys off: a dangling reference it would leave
// rolls it back, and the writer's connection has foreign keys on again.
func TestMigrationForeignKeysOff(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "ledger.db")})
	require.NoError(t, err)
	defer s.Close()
	ms, err := migrations.Load()
	require.NoError(t, err)
	for _, m := range ms {
		if strings.HasSuffix(m.Name, "_request_identity_and_too_late.sql") {
			require.True(t, foreignKeysOff(m), "the migration that rebuilds runs asks for it")
		}
		if m.Version == 1 {
			require.False(t, foreignKeysOff(m), "without the directive, foreign keys stay on")
		}
	}

	// Migrations run on the writer's pool before the driver holds its one
	// connection: give it back, as before Open held it.
	require.NoError(t, s.releaseWriter())
	sqlDB, err := s.w.DB()
	require.NoError(t, err)
	dangling := migrate.Migration{Version: len(ms) + 1, Name: "dangling.sql",
		SQL: foreignKeysOffDirective + "\nINSERT INTO budgets (run_id) VALUES ('run_gone');"}
	require.True(t, foreignKeysOff(dangling))
	err = applyMigration(ctx, sqlDB, dangling, s.now())
	require.ErrorContains(t, err, "row 1 of budgets refers to a missing row of runs")
	var n int
	require.NoError(t, s.w.WithContext(ctx).Raw(`SELECT COUNT(*) FROM budgets`).Scan(&n).Error)
	require.Zero(t, n, "rolled back")
	require.NoError(t, s.w.WithContext(ctx).Raw(`SELECT COUNT(*) FROM schema_migrations WHERE name = 'dangling.sql'`).Scan(&n).Error)
	require.Zero(t, n, "not recorded")
	var fk string
	require.NoError(t, s.w.WithContext(ctx).Raw("PRAGMA foreign_keys").Row().Scan(&fk))
	require.Equal(t, "1", fk, "foreign keys on again")
}
