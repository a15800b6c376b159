package faultmatrix

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	server *url.URL
	name   string
	// URL is the database's: the server's, with the database as its path.
	URL string
}

// errNoPostgres marks a server that cannot be reached: the cell is
// skipped, not failed.
var errNoPostgres = errors.New("no PostgreSQL server")

// newPGDatabase creates an empty database with a random name on server.
// An unreachable server is errNoPostgres.
func newPGDatabase(ctx context.Context, server string) (*pgDatabase, error) {
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("faultmatrix: the PostgreSQL server must be a postgres:// URL, not %q", redactedURL(server))
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, server)
	if err != nil {
		return nil, fmt.Errorf("%w at %s (set --postgres or %s): %v", errNoPostgres, u.Redacted(), EnvPostgres, err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	name := "ledger_faultmatrix_" + strings.ToLower(rand.Text()[:16])
	if _, err := conn.Exec(cctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("faultmatrix: create database %s on %s: %w", name, u.Redacted(), err)
	}
	db := *u
	db.Path = "/" + name
	return &pgDatabase{server: u, name: name, URL: db.String()}, nil
}

// drop drops the database, closing whatever connections are left to it.
func (d *pgDatabase) drop(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, d.server.String())
	if err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(cctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	return nil
}

// shown is the database's URL without its password.
func (d *pgDatabase) shown() string { return redactedURL(d.URL) }

func redactedURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "?"
	}
	return u.Redacted()
}
