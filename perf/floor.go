package perf

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver: pgx, as gorm.io/driver/postgres uses it
	_ "github.com/mattn/go-sqlite3"    // the "sqlite3" driver; gorm.io/driver/sqlite registers the same one
)

// Floor is the yardstick of every figure: a SQLite file opened with
// database/sql and the Store's pragmas (WAL, synchronous=FULL, one
// connection, IMMEDIATE transactions) holding one small table. One Commit
// is one row inserted in its own committed transaction: the least any
// durable write can cost on this file system. Figures are reported as
// ratios to it, measured in the same run, because machines differ by
// orders of magnitude in fsync cost.
//
// OpenPostgresFloor is the same yardstick on PostgreSQL: a table in a
// database of its own on the server the ledger's database is on, and the
// server's durability (synchronous_commit on, fsync on).
type Floor struct {
	db     *sql.DB
	insert string // the INSERT, in the driver's placeholders
	n      int
}

// OpenFloor creates the floor database floor.db in dir and checks that it
// commits with synchronous=FULL.
func OpenFloor(ctx context.Context, dir string) (*Floor, error) {
	dsn := "file:" + filepath.Join(dir, "floor.db") +
		"?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=5000&_foreign_keys=on&_txlock=immediate"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("open floor: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`); err != nil {
		return nil, errors.Join(fmt.Errorf("create floor table: %w", err), db.Close())
	}
	var syncMode int
	if err := db.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&syncMode); err != nil || syncMode != 2 {
		return nil, errors.Join(fmt.Errorf("floor synchronous = %d (%v), want 2 (FULL)", syncMode, err), db.Close())
	}
	return &Floor{db: db, insert: `INSERT INTO t (id, v) VALUES (?, ?)`}, nil
}

// OpenPostgresFloor creates the floor's table in the PostgreSQL database
// dsn names, which should be new and empty, over database/sql and pgx's
// stdlib (the pgx the ledger's driver uses) with one connection, and checks
// that its commits wait for the WAL to be flushed: synchronous_commit and
// fsync both on, the server's defaults. Otherwise it refuses to measure.
func OpenPostgresFloor(ctx context.Context, dsn string) (*Floor, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres floor: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	var syncCommit, fsync string
	if err := db.QueryRowContext(ctx, `SELECT current_setting('synchronous_commit'), current_setting('fsync')`).
		Scan(&syncCommit, &fsync); err != nil {
		return nil, errors.Join(fmt.Errorf("postgres floor settings: %w", err), db.Close())
	}
	if syncCommit != "on" || fsync != "on" {
		return nil, errors.Join(fmt.Errorf("postgres floor: synchronous_commit = %s, fsync = %s, want both on", syncCommit, fsync), db.Close())
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id bigint PRIMARY KEY, v text)`); err != nil {
		return nil, errors.Join(fmt.Errorf("create postgres floor table: %w", err), db.Close())
	}
	return &Floor{db: db, insert: `INSERT INTO t (id, v) VALUES ($1, $2)`}, nil
}

// Close closes the floor database.
func (f *Floor) Close() error { return f.db.Close() }

// Commit inserts one row in its own committed transaction.
func (f *Floor) Commit(ctx context.Context) error {
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("floor begin: %w", err)
	}
	f.n++
	if _, err := tx.ExecContext(ctx, f.insert, f.n, "value"); err != nil {
		return errors.Join(fmt.Errorf("floor insert: %w", err), tx.Rollback())
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("floor commit: %w", err)
	}
	return nil
}

// Commits makes n commits one after another and returns how long they
// took.
func (f *Floor) Commits(ctx context.Context, n int) (time.Duration, error) {
	start := time.Now()
	for range n {
		if err := f.Commit(ctx); err != nil {
			return time.Since(start), err
		}
	}
	return time.Since(start), nil
}

// Measure commits for about d, and at least 20 times, and returns how many
// commits it made and how long they took.
func (f *Floor) Measure(ctx context.Context, d time.Duration) (int, time.Duration, error) {
	start := time.Now()
	n := 0
	for n < 20 || time.Since(start) < d {
		if err := f.Commit(ctx); err != nil {
			return n, time.Since(start), err
		}
		n++
	}
	return n, time.Since(start), nil
}
