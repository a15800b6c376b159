package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/ledger/storetest"
)

// TestConformance runs the Store conformance suite against the SQLite
// store.
func TestConformance(t *testing.T) { storetest.Run(t, sqliteHarness) }

// sqliteHarness opens each Store on a new file in the test's TempDir, and
// a GORM handle on the same file, with foreign keys on, for the suite's
// SQL.
var sqliteHarness = storetest.Harness{
	Name: "sqlite",
	Open: func(tb testing.TB, opts storetest.Options) (ledger.Store, storetest.DB, error) {
		path := filepath.Join(tb.TempDir(), "ledger.db")
		s, err := openSQLite(tb, path, opts)
		if err != nil {
			return nil, storetest.DB{}, err
		}
		raw, err := gorm.Open(gormsqlite.Open("file:"+path+"?_busy_timeout=5000&_foreign_keys=on"),
			&gorm.Config{Logger: logger.Discard})
		if err != nil {
			return nil, storetest.DB{}, err
		}
		tb.Cleanup(func() {
			if db, err := raw.DB(); err == nil {
				_ = db.Close()
			}
		})
		return s, storetest.DB{
			Open: func(tb testing.TB, opts storetest.Options) (ledger.Store, error) { return openSQLite(tb, path, opts) },
			Exec: func(ctx context.Context, q string, args ...any) error {
				return raw.WithContext(ctx).Exec(q, args...).Error
			},
			Query: func(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
				return raw.WithContext(ctx).Raw(q, args...).Rows()
			},
			Tables: func(ctx context.Context) ([]string, error) { return raw.WithContext(ctx).Migrator().GetTables() },
			DropAppendOnly: func(ctx context.Context) error {
				for _, trigger := range []string{"events_no_update", "events_no_delete", "observations_no_update", "observations_no_delete"} {
					if err := raw.WithContext(ctx).Exec("DROP TRIGGER " + trigger).Error; err != nil {
						return err
					}
				}
				return nil
			},
		}, nil
	},
}

// openSQLite opens a Store on the SQLite file at path and closes it when
// tb ends.
func openSQLite(tb testing.TB, path string, opts storetest.Options) (ledger.Store, error) {
	s, err := sqlite.OpenStore(context.Background(), sqlite.Config{Path: path, Now: opts.Now, NewID: opts.NewID,
		SigningKey: opts.SigningKey, Observe: opts.Observe})
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, nil
}
