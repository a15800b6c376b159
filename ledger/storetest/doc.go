// Package storetest is the conformance suite of ledger.Store: the tests
// every storage driver must pass, so that a second driver is proven by the
// same tests as the first. It is for tests only.
//
// A driver author runs it from a test of the driver's package:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{Name: "mydriver", Open: open})
//	}
//
//	// open makes a new, empty database, opens a Store on it and returns a
//	// DB on the same database; everything is closed (and the database
//	// dropped, if it needs dropping) when tb ends.
//	func open(tb testing.TB, opts storetest.Options) (ledger.Store, storetest.DB, error) {
//		dsn := newDatabase(tb) // a file in tb.TempDir(), a fresh PostgreSQL database…
//		s, err := openStore(tb, dsn, opts) // with opts.Observe as the ledger's Observe
//		if err != nil {
//			return nil, storetest.DB{}, err // as the Store returned it
//		}
//		raw := openGORM(tb, dsn) // logger.Discard: the suite runs statements that must fail
//		return s, storetest.DB{
//			Open: func(tb testing.TB, opts storetest.Options) (ledger.Store, error) { return openStore(tb, dsn, opts) },
//			Exec: func(ctx context.Context, q string, args ...any) error { return raw.WithContext(ctx).Exec(q, args...).Error },
//			Query: func(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
//				return raw.WithContext(ctx).Raw(q, args...).Rows()
//			},
//			Tables:         func(ctx context.Context) ([]string, error) { return raw.WithContext(ctx).Migrator().GetTables() },
//			DropAppendOnly: func(ctx context.Context) error { … },
//		}, nil
//	}
//
// The SQLite store's TestConformance is a complete harness.
//
// The suite talks to the Store only through the ledger.Store interface.
// The raw SQL it runs through DB.Exec and DB.Query is portable: standard
// SQL with ? placeholders (GORM rewrites them for its dialect) over the
// table and column names of the ledger's schema, which every driver
// keeps. It passes no time values, so how a driver stores time is its own
// business, and typed ids are passed as plain strings. What is
// dialect-specific is behind DB's functions, which the driver writes: the
// package imports neither GORM nor any database driver.
//
// The driver's open must pass opts.Observe on to the Store
// (ledger.Options.Observe): once the whole suite has passed, it checks
// that every operation of the Store was observed, under its method's name
// and as a write or a read, so that store health sees every method
// without a list of them.
//
// A driver conforms only if the whole suite passes. There are no per-driver
// skips: a test that cannot hold for a driver is a question about the
// Store's contract, to be settled in ledger.Store's documentation and then
// here, for every driver, with the reason written beside the test.
package storetest
