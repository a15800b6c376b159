package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

// TestSessionDefaults: the driver's sessions end when they sit idle inside
// a transaction (a frozen process holding its run's lock), for a URL and a
// keyword=value DSN, unless the DSN sets its own timeout; and the server
// applies it.
func TestSessionDefaults(t *testing.T) {
	require.Equal(t, "postgres://u@h:5432/db?idle_in_transaction_session_timeout=5000&sslmode=disable",
		withSessionDefaults("postgres://u@h:5432/db?sslmode=disable"))
	require.Equal(t, "host=h dbname=db idle_in_transaction_session_timeout=5000",
		withSessionDefaults("host=h dbname=db"))
	own := "postgres://u@h/db?idle_in_transaction_session_timeout=100"
	require.Equal(t, own, withSessionDefaults(own), "the DSN's own setting stays")

	dsn := withSessionDefaults(pgtest.NewSchema(t))
	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	var got string
	require.NoError(t, conn.QueryRow(t.Context(), `SHOW idle_in_transaction_session_timeout`).Scan(&got))
	require.Equal(t, "5s", got)
}
