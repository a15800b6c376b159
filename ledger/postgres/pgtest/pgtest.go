// Package pgtest gives a test a fresh PostgreSQL database of its own, so
// that tests of the PostgreSQL driver (and the suites run against it: the
// conformance suite, the fault matrix) never share state.
//
// The server is the one LEDGER_TEST_POSTGRES names, by default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable; its user must
// be allowed to create databases. When the server cannot be reached, the
// test is skipped with the reason, unless LEDGER_TEST_POSTGRES_REQUIRED is
// set (to anything but "" or "0"), when it fails instead: a CI run that
// means to test PostgreSQL sets it, so that a missing server cannot pass
// as a green run.
package pgtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables read by the package.
const (
	// EnvServer names the server (any database on it) as a URL.
	EnvServer = "LEDGER_TEST_POSTGRES"
	// EnvRequired, set, fails a test whose server is unreachable instead
	// of skipping it.
	EnvRequired = "LEDGER_TEST_POSTGRES_REQUIRED"
)

// DefaultServer is the server used when EnvServer is not set.
const DefaultServer = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Server is the URL of the test server.
func Server() string {
	if s := os.Getenv(EnvServer); s != "" {
		return s
	}
	return DefaultServer
}

// NewDatabase creates an empty database with a random name on the test
// server and returns its URL; it is dropped (WITH (FORCE), closing whatever
// connections are left) when tb ends. options, if any, are appended to
// CREATE DATABASE (for example "TEMPLATE template0 LOCALE_PROVIDER icu
// ICU_LOCALE 'en-US'" for a database of another collation). If the server
// is unreachable, tb is skipped, or fails when EnvRequired is set.
func NewDatabase(tb testing.TB, options ...string) string {
	tb.Helper()
	u, name := create(tb, "database", func(quoted string) string {
		return strings.Join(append([]string{"CREATE DATABASE " + quoted}, options...), " ")
	}, func(quoted string) string { return "DROP DATABASE IF EXISTS " + quoted + " WITH (FORCE)" })
	db := *u
	db.Path = "/" + name
	return db.String()
}

// NewSchema creates an empty schema with a random name in the database of
// the test server's URL and returns that URL with the schema as its
// search_path, so everything a driver creates lands in it, and as its
// application_name, so that a test looking at pg_stat_activity can tell
// its own sessions from those of the other tests sharing the database,
// with synchronous_commit off; the schema is dropped with all it holds when tb ends. It is NewDatabase
// at a fraction of the cost (no database files to create, no checkpoint to
// drop them): every test that does not need a database of its own uses it.
// The schemas share the database's advisory locks and extensions. If the
// server is unreachable, tb is skipped, or fails when EnvRequired is set.
func NewSchema(tb testing.TB) string {
	tb.Helper()
	u, name := create(tb, "schema", func(quoted string) string { return "CREATE SCHEMA " + quoted },
		func(quoted string) string { return "DROP SCHEMA IF EXISTS " + quoted + " CASCADE" })
	in := *u
	q := in.Query()
	q.Set("search_path", name)
	q.Set("application_name", name)
	// A commit need not wait for its WAL to reach the disk: it is seen
	// by every session at once either way, and only a crash of the server,
	// which no test makes, could lose it.
	q.Set("synchronous_commit", "off")
	in.RawQuery = q.Encode()
	return in.String()
}

// create makes a what (database, schema) with a random name on the test
// server, with the statement createSQL gives for its quoted name, and
// runs dropSQL's when tb ends (dropOnCleanup). It returns the server's URL
// and the name. An unreachable server skips tb (unreachable).
func create(tb testing.TB, what string, createSQL, dropSQL func(quoted string) string) (*url.URL, string) {
	tb.Helper()
	server, u := serverURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		unreachable(tb, server, err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	// rand.Text is base32 (A–Z, 2–7): lowercased, the name needs no
	// quoting, but is quoted anyway.
	name := "ledger_test_" + strings.ToLower(rand.Text()[:16])
	quoted := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, createSQL(quoted)); err != nil {
		tb.Fatalf("pgtest: create %s %s on %s: %v", what, name, redacted(u), err)
	}
	dropOnCleanup(tb, server, what+" "+name, dropSQL(quoted))
	return u, name
}

// serverURL is the test server (Server) and its parsed URL; anything but a
// postgres:// URL fails tb.
func serverURL(tb testing.TB) (string, *url.URL) {
	tb.Helper()
	server := Server()
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("pgtest: %s must be a postgres:// URL, not %q", EnvServer, server)
	}
	return server, u
}

// dropOnCleanup runs drop, which drops what, on server when tb ends, on a
// connection of its own; a failure fails tb. DROP DATABASE waits for a
// checkpoint of the whole server, and with the fault matrix's replica
// cells creating and dropping databases beside the driver tests on a
// loaded two-core machine one took over 30 s: it gets two minutes.
func dropOnCleanup(tb testing.TB, server, what, drop string) {
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, server)
		if err == nil {
			defer func() { _ = conn.Close(context.Background()) }()
			_, err = conn.Exec(ctx, drop)
		}
		if err != nil {
			tb.Errorf("pgtest: drop %s: %v", what, err)
		}
	})
}

// unreachable skips tb (or fails it, with EnvRequired set) because the
// server could not be reached.
func unreachable(tb testing.TB, server string, err error) {
	tb.Helper()
	u, _ := url.Parse(server)
	msg := fmt.Sprintf("pgtest: PostgreSQL at %s is unreachable (set %s to another server): %v", redacted(u), EnvServer, err)
	if r := os.Getenv(EnvRequired); r != "" && r != "0" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

// redacted is u without its password, for messages.
func redacted(u *url.URL) string {
	if u == nil {
		return "?"
	}
	return u.Redacted()
}
