package ledgertest

import (
	"database/sql"
	"path/filepath"
	"testing"

	_ "github.com/mattn/go-sqlite3" // the driver gorm.io/driver/sqlite registers as "sqlite3"
)

// Floor is the benchmarks' yardstick: a SQLite file opened with
// database/sql and the Store's pragmas (WAL, synchronous=FULL, one
// connection, IMMEDIATE transactions) holding one small table. One Commit is
// one row inserted in its own committed transaction: the least any durable
// write can cost on this file system. Benchmarks report their figures as
// ratios to it, measured in the same run, because machines differ by orders
// of magnitude in fsync cost.
type Floor struct {
	db *sql.DB
	n  int
}

// OpenFloor opens the floor database in dir.
func OpenFloor(tb testing.TB, dir string) *Floor {
	tb.Helper()
	dsn := "file:" + filepath.Join(dir, "floor.db") +
		"?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=5000&_foreign_keys=on&_txlock=immediate"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		tb.Fatalf("open floor: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if _, err := db.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`); err != nil {
		tb.Fatalf("create floor table: %v", err)
	}
	var sync int
	if err := db.QueryRow(`PRAGMA synchronous`).Scan(&sync); err != nil || sync != 2 {
		tb.Fatalf("floor synchronous = %d (%v), want 2 (FULL)", sync, err)
	}
	return &Floor{db: db}
}

// Commit inserts one row in its own committed transaction.
func (f *Floor) Commit(tb testing.TB) {
	tx, err := f.db.Begin()
	if err != nil {
		tb.Fatalf("floor begin: %v", err)
	}
	f.n++
	if _, err := tx.Exec(`INSERT INTO t (id, v) VALUES (?, ?)`, f.n, "value"); err != nil {
		tb.Fatalf("floor insert: %v", err)
	}
	if err := tx.Commit(); err != nil {
		tb.Fatalf("floor commit: %v", err)
	}
}
