package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
	"github.com/actionledger/ledger/ledger/storetest"
)

// TestConformance runs the Store conformance suite against the ledger over
// the PostgreSQL driver, each test in a fresh schema of its own
// (pgtest.NewSchema, much cheaper than a database each). Without a server
// it is skipped, saying why.
func TestConformance(t *testing.T) { storetest.Run(t, postgresHarness) }

// postgresHarness opens each Store in a new schema, and a GORM handle on
// the same database for the suite's SQL (GORM turns its ? placeholders
// into $1, $2, …).
var postgresHarness = storetest.Harness{
	Name: "postgres",
	Open: func(tb testing.TB, opts storetest.Options) (ledger.Store, storetest.DB, error) {
		dsn := pgtest.NewSchema(tb)
		s, err := openPostgres(tb, dsn, opts)
		if err != nil {
			return nil, storetest.DB{}, err
		}
		raw, err := gorm.Open(gormpostgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			return nil, storetest.DB{}, err
		}
		tb.Cleanup(func() {
			if db, err := raw.DB(); err == nil {
				_ = db.Close()
			}
		})
		return s, storetest.DB{
			Open: func(tb testing.TB, opts storetest.Options) (ledger.Store, error) { return openPostgres(tb, dsn, opts) },
			Exec: func(ctx context.Context, q string, args ...any) error {
				return raw.WithContext(ctx).Exec(q, args...).Error
			},
			Query: func(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
				return raw.WithContext(ctx).Raw(q, args...).Rows()
			},
			Tables: func(ctx context.Context) ([]string, error) { return raw.WithContext(ctx).Migrator().GetTables() },
			DropAppendOnly: func(ctx context.Context) error {
				for trigger, table := range map[string]string{"events_no_update": "events", "events_no_delete": "events",
					"observations_no_update": "observations", "observations_no_delete": "observations"} {
					if err := raw.WithContext(ctx).Exec("DROP TRIGGER " + trigger + " ON " + table).Error; err != nil {
						return err
					}
				}
				return nil
			},
		}, nil
	},
}

// openPostgres opens a Store on the database at dsn and closes it when tb
// ends.
func openPostgres(tb testing.TB, dsn string, opts storetest.Options) (ledger.Store, error) {
	s, err := postgres.OpenStore(context.Background(), postgres.Config{DSN: dsn, Now: opts.Now, NewID: opts.NewID,
		SigningKey: opts.SigningKey, Observe: opts.Observe})
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, nil
}
