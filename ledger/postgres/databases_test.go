package postgres_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

// TestCreateAndDropDatabase: CreateDatabase makes a database one can
// connect to at the URL it returns; DropDatabase removes it, connections
// left open or not, and again is no error; an unreachable server is
// ErrUnreachable.
func TestCreateAndDropDatabase(t *testing.T) {
	pgtest.NewSchema(t) // skips, or fails under LEDGER_TEST_POSTGRES_REQUIRED, without a server
	ctx := context.Background()
	server := pgtest.Server()
	name := "ledger_test_db_" + strings.ToLower(rand.Text()[:12])
	db, err := postgres.CreateDatabase(ctx, server, name)
	require.NoError(t, err)
	require.Contains(t, db, "/"+name)
	conn, err := pgx.Connect(ctx, db)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	var got string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_database()`).Scan(&got))
	require.Equal(t, name, got)

	require.NoError(t, postgres.DropDatabase(ctx, server, name), "with a connection still open")
	require.NoError(t, postgres.DropDatabase(ctx, server, name), "gone already")
	_, err = postgres.CreateDatabase(ctx, server, name)
	require.NoError(t, err, "the name is free again")
	require.NoError(t, postgres.DropDatabase(ctx, server, name))

	_, err = postgres.CreateDatabase(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable", name)
	require.ErrorIs(t, err, postgres.ErrUnreachable)
	_, err = postgres.CreateDatabase(ctx, "/tmp/ledger.db", name)
	require.ErrorContains(t, err, "must be a postgres:// URL")
}
