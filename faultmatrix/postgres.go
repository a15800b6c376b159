package faultmatrix

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"

	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/stores"
)

// The replica cells run several `serve` processes on one PostgreSQL
// database each, made fresh on the server Options.Postgres names and
// dropped once the cell passed (a failed cell's is kept, to look into).

// EnvPostgres names the PostgreSQL server of the replica cells (any
// database on it, as a URL) when Options.Postgres is empty; the tests use
// the same variable.
const EnvPostgres = "LEDGER_TEST_POSTGRES"

// DefaultPostgres is the server of the replica cells when neither
// Options.Postgres nor EnvPostgres names one.
const DefaultPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// PostgresServer is the server the replica cells use for flag (a
// postgres:// URL, or "" for $LEDGER_TEST_POSTGRES, else DefaultPostgres).
func PostgresServer(flag string) string {
	if flag != "" {
		return flag
	}
	if s := os.Getenv(EnvPostgres); s != "" {
		return s
	}
	return DefaultPostgres
}

// pgDatabase is one replica cell's database.
type pgDatabase struct {
	server, name string
	// URL is the database's: the server's, with the database as its path.
	URL string
}

// newPGDatabase creates an empty database with a random name on server.
// An unreachable server is postgres.ErrUnreachable: the cell is skipped,
// not failed.
func newPGDatabase(ctx context.Context, server string) (*pgDatabase, error) {
	name := "ledger_faultmatrix_" + strings.ToLower(rand.Text()[:16])
	db, err := postgres.CreateDatabase(ctx, server, name)
	if err != nil {
		return nil, fmt.Errorf("faultmatrix (set --postgres or %s): %w", EnvPostgres, err)
	}
	return &pgDatabase{server: server, name: name, URL: db}, nil
}

// drop drops the database, closing whatever connections are left to it.
func (d *pgDatabase) drop(ctx context.Context) error {
	return postgres.DropDatabase(ctx, d.server, d.name)
}

// shown is the database's URL without its password.
func (d *pgDatabase) shown() string { return stores.Shown(d.URL) }
