// Package sqlite is the ledger's embedded storage driver: GORM and SQLite
// (mattn/go-sqlite3) behind ledger.Driver. It owns the SQLite schema and its
// migrations (migrations/), the translation of SQLite's errors into ledger
// error codes (translate), group commit (groupcommit.go) and the prepared
// statements of the hot path (stmts.go).
//
// Open opens the driver; OpenStore opens it and the ledger over it, which
// is what the CLI, the examples and most tests use.
package sqlite
