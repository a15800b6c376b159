package perf

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	_ "github.com/mattn/go-sqlite3" // the "sqlite3" driver; gorm.io/driver/sqlite registers the same one
)

// Floor is the yardstick of every figure: a SQLite file opened with
// database/sql and the Store's pragmas (WAL, synchronous=FULL, one
// connection, IMMEDIATE transactions) holding one small table. One Commit
// is one row inserted in its own committed transaction: the least any
// durable write can cost on this file system. Figures are reported as
// ratios to it, measured in the same run, because machines differ by
// orders of magnitude in fsync cost.
type Floor struct {
	db *sql.DB
	n  int
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
	return &Floor{db: db}, nil
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
	if _, err := tx.ExecContext(ctx, `INSERT INTO t (id, v) VALUES (?, ?)`, f.n, "value"); err != nil {
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
