// Package stores opens the ledger's Store on the driver a database's name
// selects: a postgres:// (or postgresql://) URL is PostgreSQL
// (ledger/postgres), anything else a SQLite file path (ledger/sqlite). It
// is what the CLI and the benchmarks open a --db with; a program that
// knows its database uses the driver's own OpenStore.
package stores

import (
	"context"
	"crypto/ed25519"
	"net/url"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/sqlite"
)

// Config opens a Store.
type Config struct {
	// DB is a SQLite file path or a postgres:// URL.
	DB string
	// Now, NewID, SigningKey and Observe are the ledger's
	// (ledger.Options).
	Now        func() time.Time
	NewID      ledger.NewIDFunc
	SigningKey ed25519.PrivateKey
	Observe    ledger.ObserveFunc
	// OnCommit and WriteFault are the driver's hooks (metrics, fault
	// plans), as the drivers' Configs describe them.
	OnCommit   func(ledger.CommitStats)
	WriteFault func(n int64, at ledger.WritePoint) error
}

// IsPostgres reports whether db names a PostgreSQL database rather than a
// SQLite file.
func IsPostgres(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// Shown is db as logs and messages may show it: a URL's password is
// hidden.
func Shown(db string) string {
	if !IsPostgres(db) {
		return db
	}
	u, err := url.Parse(db)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	return u.Redacted()
}

// Open opens the driver c.DB selects and the ledger over it, applying
// pending migrations.
func Open(ctx context.Context, c Config) (*ledger.DB, error) {
	if c.DB == "" {
		return nil, ledger.Errorf(ledger.CodeInvalid, "open store: no database")
	}
	if IsPostgres(c.DB) {
		return postgres.OpenStore(ctx, postgres.Config{DSN: c.DB, Now: c.Now, NewID: c.NewID, SigningKey: c.SigningKey,
			Observe: c.Observe, OnCommit: c.OnCommit, WriteFaultFunc: c.WriteFault})
	}
	return sqlite.OpenStore(ctx, sqlite.Config{Path: c.DB, Now: c.Now, NewID: c.NewID, SigningKey: c.SigningKey,
		Observe: c.Observe, OnCommit: c.OnCommit, WriteFaultFunc: c.WriteFault})
}
