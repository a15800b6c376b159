// Package migrate is the schema migration runner of the ledger's SQL
// storage drivers (ledger/sqlite, ledger/postgres), written once: a
// driver's numbered migration files, embedded, parsed and checked once
// (Embedded), and Run, which reads the version the database records,
// refuses one newer than the build, and applies each missing file in
// order together with its row in schema_migrations.
//
// How a file is applied, and under which lock, is the driver's (Target):
// SQLite applies each file in a transaction of its own, BEGIN IMMEDIATE on
// its one writer connection, and checks inside it that no other process
// applied the file meanwhile; PostgreSQL runs Run inside one transaction
// that first takes an advisory lock.
package migrate
