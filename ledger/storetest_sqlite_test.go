package ledger_test

import (
	"context"
	"path/filepath"
	"testing"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/storetest"
)

// TestConformance runs the Store conformance suite against the SQLite
// store.
func TestConformance(t *testing.T) { storetest.Run(t, sqliteHarness) }

// sqliteHarness opens each Store on a new file in the test's TempDir.
var sqliteHarness = storetest.Harness{
	Name: "sqlite",
	Open: func(tb testing.TB, opts storetest.Options) (ledger.Store, storetest.DB, error) {
		path := filepath.Join(tb.TempDir(), "ledger.db")
		s, err := openSQLite(tb, path, opts)
		if err != nil {
			return nil, storetest.DB{}, err
		}
		raw, err := gorm.Open(sqlite.Open("file:"+path+"?_busy_timeout=5000&_foreign_keys=on"),
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
			SQL:  raw,
			Open: func(tb testing.TB, opts storetest.Options) (ledger.Store, error) { return openSQLite(tb, path, opts) },
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
	s, err := ledger.Open(context.Background(), ledger.Config{Path: path, Now: opts.Now, NewID: opts.NewID,
		SigningKey: opts.SigningKey})
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, nil
}
