package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
)

// Databases on a server, for what makes fresh ones and drops them after
// (the benchmarks, the fault matrix's replica cells): serverURL is a
// postgres:// URL of any database on the server, whose user may create
// databases.

// ErrUnreachable is CreateDatabase's error when no server answers at the
// URL, so that a caller can skip what needs one rather than fail.
var ErrUnreachable = errors.New("no PostgreSQL server")

// CreateDatabase creates the empty database name on the server serverURL
// names and returns the database's URL: serverURL with name as its path.
func CreateDatabase(ctx context.Context, serverURL, name string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("create database %s: the server must be a postgres:// URL", name)
	}
	conn, err := connectServer(ctx, serverURL)
	if err != nil {
		return "", fmt.Errorf("%w at %s: %v", ErrUnreachable, u.Redacted(), err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s on %s: %w", name, u.Redacted(), err)
	}
	db := *u
	db.Path = "/" + name
	return db.String(), nil
}

// DropDatabase drops the database name, if it exists, on the server
// serverURL names, closing whatever connections are left to it
// (WITH (FORCE)).
func DropDatabase(ctx context.Context, serverURL, name string) error {
	conn, err := connectServer(ctx, serverURL)
	if err == nil {
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// connectServer connects to serverURL, giving up after 10 s unless ctx
// ends sooner.
func connectServer(ctx context.Context, serverURL string) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return pgx.Connect(cctx, serverURL)
}
