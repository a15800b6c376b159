// Package postgres is the ledger's storage driver on PostgreSQL: a
// ledger.Driver over GORM and pgx (gorm.io/driver/postgres).
//
// What PostgreSQL makes it do differently from ledger/sqlite:
//   - Writes run concurrently, each in a SERIALIZABLE transaction, so the
//     rules' read, decide, write is safe; a write that loses to a
//     concurrent one (SQLSTATE 40001 or 40P01) is run again from the
//     start, a bounded number of times (Config.WriteAttempts) with a small
//     jittered backoff, and is CodeConflict after the last. There is no
//     group commit: concurrent writes commit in parallel instead.
//   - A failed statement aborts the PostgreSQL transaction it ran in, where
//     SQLite would only undo the statement: after one, every later call of
//     the Tx returns that first error, and Write never commits the
//     transaction, even if fn swallowed the error.
//   - Reads in Read run in one REPEATABLE READ READ ONLY transaction; the
//     Reader outside any snapshot runs each statement on the pool (READ
//     COMMITTED), and a call that needs several statements takes a
//     snapshot of its own.
//   - TEXT cannot hold the NUL character or invalid UTF-8, which SQLite
//     would store: such a value is CodeInvalid (SQLSTATE class 22).
//   - Every TEXT column is COLLATE "C", so ids sort byte by byte whatever
//     the database's collation.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/actionledger/ledger/ledger"
)

// Config opens a Driver.
type Config struct {
	// DSN is the database's URL, postgres://user@host:port/dbname?… (or
	// any connection string pgx accepts).
	DSN string
	// MaxConns is the size of the connection pool; 0 means 16.
	MaxConns int
	// Now is the clock the driver's own rows are stamped with
	// (schema_migrations.applied_at); nil means time.Now.
	Now func() time.Time
	// WriteAttempts is how many times Write runs fn when PostgreSQL keeps
	// failing it for a concurrent write (serialisation failure, deadlock)
	// before it gives up with CodeConflict; 0 means 10.
	WriteAttempts int
}

// Defaults of Config.
const (
	DefaultMaxConns      = 16
	DefaultWriteAttempts = 10
)

// Driver is the ledger's storage on PostgreSQL.
type Driver struct {
	db       *gorm.DB
	sqlDB    *sql.DB
	now      func() time.Time
	attempts int
}

var _ ledger.Driver = (*Driver)(nil)

// Open connects to cfg.DSN and applies pending migrations. A database whose
// schema is newer than this build is refused with CodeUnsupportedVersion
// and left untouched. Several processes may open the same database at once:
// one migrates, the others wait for it.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	switch {
	case cfg.DSN == "":
		return nil, ledger.Errorf(ledger.CodeInvalid, "open postgres: no DSN")
	case cfg.MaxConns < 0:
		return nil, ledger.Errorf(ledger.CodeInvalid, "open postgres: MaxConns cannot be negative")
	case cfg.WriteAttempts < 0:
		return nil, ledger.Errorf(ledger.CodeInvalid, "open postgres: WriteAttempts cannot be negative")
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.WriteAttempts == 0 {
		cfg.WriteAttempts = DefaultWriteAttempts
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	db, err := gorm.Open(postgres.New(postgres.Config{DSN: cfg.DSN}), &gorm.Config{
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true, // Write and Read open every transaction themselves
		// pgx caches a prepared statement per connection and statement
		// text on its own; GORM's statement cache would add a goroutine.
		PrepareStmt: false,
	})
	if err != nil {
		return nil, wrapErr("open postgres", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, wrapErr("open postgres", err)
	}
	sqlDB.SetMaxOpenConns(cfg.MaxConns)
	sqlDB.SetMaxIdleConns(cfg.MaxConns)
	d := &Driver{db: db, sqlDB: sqlDB, now: cfg.Now, attempts: cfg.WriteAttempts}
	if err := sqlDB.PingContext(ctx); err != nil {
		_ = sqlDB.Close()
		return nil, wrapErr("open postgres", err)
	}
	if err := d.migrate(ctx); err != nil {
		_ = sqlDB.Close()
		return nil, err
	}
	return d, nil
}

// Close closes the connection pool.
func (d *Driver) Close() error {
	if err := d.sqlDB.Close(); err != nil {
		return wrapErr("close postgres", err)
	}
	return nil
}

// Reader implements ledger.Driver: the pool, each statement on what was
// committed when it ran.
func (d *Driver) Reader() ledger.Reader { return &reader{db: d.db, pool: d} }

// Read implements ledger.Driver: fn runs in one REPEATABLE READ READ ONLY
// transaction, so every read sees the same snapshot.
func (d *Driver) Read(ctx context.Context, fn func(ledger.Reader) error) error {
	err := d.snapshot(ctx, func(r *reader) error { return fn(r) })
	return passErr("read", err)
}

// snapshot runs fn on a reader in one REPEATABLE READ READ ONLY
// transaction.
func (d *Driver) snapshot(ctx context.Context, fn func(*reader) error) error {
	g := d.db.WithContext(ctx).Begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if g.Error != nil {
		return wrapErr("begin read", g.Error)
	}
	ended := false
	defer func() {
		if !ended {
			g.Rollback() // also when fn panics
		}
	}()
	r := &reader{db: g, st: &txState{}}
	if err := fn(r); err != nil {
		return err
	}
	if r.st.failed != nil {
		return wrapErr("read", r.st.failed)
	}
	ended = true
	if err := g.Commit().Error; err != nil {
		return wrapErr("end read", err)
	}
	return nil
}

// Write implements ledger.Driver: fn runs in one SERIALIZABLE transaction,
// and again from the start, in a new one, when PostgreSQL fails it for a
// concurrent write; after Config.WriteAttempts runs it is CodeConflict.
func (d *Driver) Write(ctx context.Context, fn func(ledger.Tx) error) error {
	for attempt := 1; ; attempt++ {
		retry, err := d.writeOnce(ctx, fn)
		if !retry {
			return passErr("write", err)
		}
		if attempt >= d.attempts {
			return &ledger.Error{Code: ledger.CodeConflict,
				Message: fmt.Sprintf("write: a concurrent write changed what it read, %d times: %v", attempt, err), Err: err}
		}
		if err := backoff(ctx, attempt); err != nil {
			return wrapErr("write", err)
		}
	}
}

// backoff waits before run attempt+1 of a write: a random time up to 1 ms
// doubled for each run so far, at most 64 ms, so that writes that keep
// colliding spread out.
func backoff(ctx context.Context, attempt int) error {
	ceiling := time.Millisecond << min(attempt-1, 6)
	t := time.NewTimer(rand.N(ceiling) + time.Millisecond/4)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeOnce runs fn in one SERIALIZABLE transaction and commits it; retry
// is whether the transaction failed for a concurrent write, so that running
// fn again may succeed.
func (d *Driver) writeOnce(ctx context.Context, fn func(ledger.Tx) error) (retry bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	g := d.db.WithContext(ctx).Begin(&sql.TxOptions{Isolation: sql.LevelSerializable})
	if g.Error != nil {
		return false, wrapErr("begin write", g.Error)
	}
	t := &tx{reader{db: g, st: &txState{}}}
	committed := false
	defer func() {
		if !committed {
			g.Rollback() // also when fn panics
		}
	}()
	err = fn(t)
	failed := t.st.failed
	switch {
	case failed != nil && retryable(failed):
		return true, failed
	case err != nil:
		return retryable(err), err
	case failed != nil:
		// fn went on after a statement failed: PostgreSQL has aborted the
		// transaction, so nothing of it may be committed.
		return false, wrapErr("write", failed)
	}
	committed = true
	if err := g.Commit().Error; err != nil {
		return retryable(err), wrapErr("commit", err)
	}
	return false, nil
}

// passErr returns err as the caller gets it: a *ledger.Error unchanged (the
// rules' own errors keep their words), anything else translated.
func passErr(op string, err error) error {
	var e *ledger.Error
	if err == nil || errors.As(err, &e) {
		return err
	}
	return wrapErr(op, err)
}

// SchemaVersion implements ledger.Driver.
func (d *Driver) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := d.db.WithContext(ctx).Raw(`SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Row().Scan(&v); err != nil {
		return 0, wrapErr("read schema version", err)
	}
	return v, nil
}
