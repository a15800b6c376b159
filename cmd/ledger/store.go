package main

import (
	"context"
	"crypto/ed25519"
	"os"

	"github.com/spf13/cobra"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/stores"
)

// envDB names the database when --db is not given: a SQLite file path, or
// a postgres:// URL.
const envDB = "LEDGER_DB"

// defaultDB is the database of a command given neither --db nor $LEDGER_DB.
const defaultDB = "./ledger.db"

// dbFlagUsage is the help text of every --db flag.
const dbFlagUsage = "the database: a SQLite file path, or a postgres:// URL (env " + envDB + ")"

// addDBFlag registers --db on cmd, stored in p. Its default is defaultDB;
// $LEDGER_DB, when set, takes its place at run time (useDBEnv), so that
// --help never prints a URL that may hold a password.
func addDBFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "db", defaultDB, dbFlagUsage)
}

// useDBEnv gives every command that has a --db flag, and was not given
// one, the database named by $LEDGER_DB. The root command runs it before
// any command's own work.
func useDBEnv(cmd *cobra.Command) error {
	f := cmd.Flags().Lookup("db")
	env := os.Getenv(envDB)
	if f == nil || f.Changed || env == "" {
		return nil
	}
	return cmd.Flags().Set("db", env)
}

// isPostgres reports whether db names a PostgreSQL database.
func isPostgres(db string) bool { return stores.IsPostgres(db) }

// shownDB is db as logs and messages show it: a URL's password is hidden.
func shownDB(db string) string { return stores.Shown(db) }

// storeConfig opens the ledger's store.
type storeConfig struct {
	// DB is a SQLite file path or a postgres:// URL.
	DB string
	// OnCommit and WriteFault are the driver's hooks (metrics, fault
	// plans); SigningKey signs chain heads; Observe is told of every
	// operation of the store (its health).
	OnCommit   func(ledger.CommitStats)
	WriteFault func(n int64, at ledger.WritePoint) error
	SigningKey ed25519.PrivateKey
	Observe    ledger.ObserveFunc
}

// openStore opens the driver the database's name selects and the ledger
// over it, applying pending migrations.
func openStore(ctx context.Context, c storeConfig) (*ledger.DB, error) {
	return stores.Open(ctx, stores.Config{DB: c.DB, OnCommit: c.OnCommit, WriteFault: c.WriteFault, SigningKey: c.SigningKey,
		Observe: c.Observe})
}

// defaultEffectsPath is where the simulator keeps its side effects when
// serve is given no --effects: beside a SQLite database, <db>.effects.db;
// for a PostgreSQL database, ./ledger.effects.db (replicas that must count
// effects together are given one --effects file).
func defaultEffectsPath(db string) string {
	if isPostgres(db) {
		return "./ledger.effects.db"
	}
	return db + ".effects.db"
}
