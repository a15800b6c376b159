// Package sqlrows is what the ledger's SQL storage drivers (ledger/sqlite,
// ledger/postgres) share, written once: the rows of the tables both
// schemas hold, their conversion to and from the ledger's objects, the
// column lists with their Scan targets, and the statements and reads whose
// text is the same in both dialects.
//
// The SQL is written with ? placeholders, which both drivers run as they
// are (GORM turns them into $1, $2, … for PostgreSQL). What a dialect says
// its own way (RETURNING lists, GREATEST or max, row locks, advisory
// locks, the value of "no limit") stays in its driver, and so does how a
// driver runs a statement: prepared on SQLite's writer connection, through
// GORM on the pool, in a PostgreSQL transaction that remembers its first
// failure.
//
// Times are unix microseconds; nullable columns are pointers. Each column
// list and the Targets of its row must stay in the same order. The gorm
// tags are read by ledger/sqlite, which also reads and writes some of
// these rows through GORM; this package does not import it.
package sqlrows
