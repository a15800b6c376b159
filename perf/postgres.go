package perf

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/ledger/stores"
)

// PostgresServer makes the fresh databases the workloads run on, on one
// PostgreSQL server, and drops them all on Close. Each database's name is
// ledger_bench_, a random suffix shared by one PostgresServer, and the
// workload's name.
type PostgresServer struct {
	server  *url.URL
	version string
	prefix  string
	mu      sync.Mutex
	made    []string
}

// NewPostgresServer connects once to serverURL (a postgres:// URL of any
// database on the server whose user may create databases), to check it
// can be reached and read its version.
func NewPostgresServer(ctx context.Context, serverURL string) (*PostgresServer, error) {
	u, err := url.Parse(serverURL)
	if err != nil || !stores.IsPostgres(serverURL) {
		return nil, fmt.Errorf("perf: %q is not a postgres:// URL", stores.Shown(serverURL))
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("perf: connect to %s: %w", u.Redacted(), err)
	}
	var version string
	err = conn.QueryRow(ctx, `SHOW server_version`).Scan(&version)
	if err = errors.Join(err, conn.Close(ctx)); err != nil {
		return nil, fmt.Errorf("perf: server version of %s: %w", u.Redacted(), err)
	}
	return &PostgresServer{server: u, version: version, prefix: "ledger_bench_" + strings.ToLower(rand.Text()[:8]) + "_"}, nil
}

// Shown is the server's URL without its password.
// Prefix is the name every database of s starts with: ledger_bench_, then
// a suffix of its own, so one run's databases are told from another's.
func (s *PostgresServer) Prefix() string { return s.prefix }

func (s *PostgresServer) Shown() string { return s.server.Redacted() }

// Version is the server's version (server_version).
func (s *PostgresServer) Version() string { return s.version }

// CreateDatabase creates the empty database for the workload name (lower
// case letters, digits and _) and returns its URL: the server's, with the
// new database's name as its path.
func (s *PostgresServer) CreateDatabase(ctx context.Context, name string) (string, error) {
	db := s.prefix + name
	u, err := postgres.CreateDatabase(ctx, s.server.String(), db)
	if err != nil {
		return "", fmt.Errorf("perf: %w", err)
	}
	s.mu.Lock()
	s.made = append(s.made, db)
	s.mu.Unlock()
	return u, nil
}

// Close drops every database CreateDatabase made, WITH (FORCE): whatever
// connections are left to them are closed.
func (s *PostgresServer) Close(ctx context.Context) error {
	s.mu.Lock()
	made := s.made
	s.made = nil
	s.mu.Unlock()
	var errs []error
	for _, db := range made {
		if err := postgres.DropDatabase(ctx, s.server.String(), db); err != nil {
			errs = append(errs, fmt.Errorf("perf: %w", err))
		}
	}
	return errors.Join(errs...)
}

// openUnsynced opens the Store db names for writing a workload's setup,
// which is not measured, without waiting for each commit to be durable: a
// SQLite file with synchronous=OFF, a PostgreSQL database with the
// session's synchronous_commit off.
func openUnsynced(ctx context.Context, db string) (*ledger.DB, error) {
	if !stores.IsPostgres(db) {
		return sqlite.OpenStore(ctx, sqlite.Config{Path: db, Synchronous: "OFF"})
	}
	u, err := url.Parse(db)
	if err != nil {
		return nil, fmt.Errorf("perf: database URL %s: %w", stores.Shown(db), err)
	}
	q := u.Query()
	q.Set("synchronous_commit", "off") // pgx sends an unknown parameter as a run-time setting
	u.RawQuery = q.Encode()
	return stores.Open(ctx, stores.Config{DB: u.String()})
}
