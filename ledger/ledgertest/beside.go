package ledgertest

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// SQL is raw access to a database beside its Store, as someone with
// access to the database has it: what the tests that edit or search rows
// the Store's methods cannot reach work through, on any driver.
type SQL struct {
	// Exec runs one statement written with ? placeholders.
	Exec func(ctx context.Context, query string, args ...any) error
	// Query runs a query written with ? placeholders; the caller closes
	// the rows.
	Query func(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	// Tables lists every table of the database.
	Tables func(ctx context.Context) ([]string, error)
}

// SQLiteFile opens raw access to the SQLite file at path, with foreign
// keys on, closed when tb ends.
func SQLiteFile(tb testing.TB, path string) SQL {
	tb.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000&_foreign_keys=on")
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return SQL{
		Exec: func(ctx context.Context, q string, args ...any) error {
			_, err := db.ExecContext(ctx, q, args...)
			return err
		},
		Query: db.QueryContext,
		Tables: func(ctx context.Context) ([]string, error) {
			rows, err := db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var names []string
			for rows.Next() {
				var name string
				if err := rows.Scan(&name); err != nil {
					return nil, err
				}
				names = append(names, name)
			}
			return names, rows.Err()
		},
	}
}

// InsertLegacyCancellation writes, with SQL beside the Store, the row an
// older build could leave behind: a cancellation of run in state
// (requested, accepted or stopping) whatever the run's state, with no
// event, as when its three separate writes were interrupted or raced by
// the run's end. Its times are the run's updated_at, copied in SQL so that
// the statement does not depend on how a driver stores time; now only
// seeds the id. It returns the cancellation's id.
func InsertLegacyCancellation(tb testing.TB, db SQL, now func() time.Time, run ledger.RunID, state ledger.CancellationState) ledger.CancellationID {
	tb.Helper()
	cols, vals := "requested_at", "updated_at"
	switch state {
	case ledger.CancelRequested:
	case ledger.CancelAccepted:
		cols, vals = cols+", accepted_at", vals+", updated_at"
	case ledger.CancelStopping:
		cols, vals = cols+", accepted_at, stopping_at", vals+", updated_at, updated_at"
	default:
		tb.Fatalf("legacy cancellation: %s is not a state an older build left behind", state)
	}
	id := ledger.NewULIDFunc(now)(ledger.PrefixCancellation)
	if err := db.Exec(context.Background(), `INSERT INTO cancellations (id, run_id, tenant, state, requested_by, reason, version, `+cols+`)
		SELECT ?, id, tenant, ?, 'alice', 'stop it', 1, `+vals+` FROM runs WHERE id = ?`,
		id, string(state), string(run)); err != nil {
		tb.Fatalf("legacy cancellation of %s: %v", run, err)
	}
	return ledger.CancellationID(id)
}

// ColumnsIn returns every table.column of db (sorted) holding s in some
// row: the check that a secret reached no column of the database, whatever
// wrote it.
func ColumnsIn(tb testing.TB, db SQL, s string) []string {
	tb.Helper()
	ctx := context.Background()
	tables, err := db.Tables(ctx)
	require.NoError(tb, err)
	require.Contains(tb, tables, "events")
	var found []string
	for _, table := range tables {
		eachRow(tb, db, `SELECT * FROM "`+strings.ReplaceAll(table, `"`, `""`)+`"`, func(cols []string, vals []any) {
			for i, v := range vals {
				var text string
				switch x := v.(type) {
				case []byte:
					text = string(x)
				case string:
					text = x
				default:
					text = fmt.Sprint(x)
				}
				if col := table + "." + cols[i]; strings.Contains(text, s) && !slices.Contains(found, col) {
					found = append(found, col)
				}
			}
		})
	}
	slices.Sort(found)
	return found
}

// eachRow runs query on db and calls fn with the columns and the values
// of each row of its answer, in order.
func eachRow(tb testing.TB, db SQL, query string, fn func(cols []string, vals []any)) {
	tb.Helper()
	rows, err := db.Query(context.Background(), query)
	require.NoError(tb, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(tb, err)
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(tb, rows.Scan(ptrs...))
		fn(cols, vals)
	}
	require.NoError(tb, rows.Err())
}
