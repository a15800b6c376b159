package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/server/servertest"
	"github.com/actionledger/ledger/simulator"
)

// TestPostgres runs the CLI on a fresh PostgreSQL database (skipped, with
// the reason, when no server is reachable): migrate creates the schema,
// $LEDGER_DB stands for --db, serve takes a run through its approval to
// its end with the effect in the --effects store, and evidence verify
// checks the run's chain in the database. The URL's password never
// reaches the output.
func TestPostgres(t *testing.T) {
	db := pgtest.NewDatabase(t)
	dir := t.TempDir()

	out, _, err := runCLI(t, nil, "migrate", "--db", db, "--json")
	require.NoError(t, err)
	var m struct {
		DB            string `json:"db"`
		SchemaVersion int    `json:"schema_version"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	require.Equal(t, postgres.SchemaVersion(), m.SchemaVersion)

	t.Run("LEDGER_DB", func(t *testing.T) {
		t.Setenv(envDB, db)
		out, _, err := runCLI(t, nil, "migrate", "--json")
		require.NoError(t, err, "the environment names the database")
		require.Contains(t, out, `"schema_version":`+itoa(postgres.SchemaVersion()))
		help, _, err := runCLI(t, nil, "migrate", "--help")
		require.NoError(t, err)
		require.NotContains(t, help, db, "--help does not print the environment's URL")
	})

	t.Run("password hidden", func(t *testing.T) {
		withPassword := strings.Replace(db, "postgres://postgres@", "postgres://postgres:s3cret-pw@", 1)
		require.NotEqual(t, db, withPassword)
		out, _, err := runCLI(t, nil, "migrate", "--db", withPassword, "--json")
		require.NoError(t, err, "trust authentication ignores the password")
		require.NotContains(t, out, "s3cret-pw")
		require.Contains(t, out, "xxxxx")
	})

	effects := filepath.Join(dir, "effects.db")
	served, logs, stop := startServe(t, "--db", db, "--effects", effects, "--addr", "127.0.0.1:0")
	url := servertest.NewProxy(t, served).URL
	md := filepath.Join(dir, "doc.md")
	require.NoError(t, os.WriteFile(md, []byte("# Go\n\n## Goroutines\n\nLightweight threads.\n"), 0o644))
	out, _, err = runCLI(t, nil, "submit", "--title", "Go", "--markdown-file", md, "--server", url, "--json")
	require.NoError(t, err)
	var sr server.SubmitResponse
	require.NoError(t, json.Unmarshal([]byte(out), &sr))
	var run server.Run
	show := func() server.Run {
		out, _, err := runCLI(t, nil, "runs", "show", string(sr.ID), "--server", url, "--json")
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(out), &run))
		return run
	}
	eventually(t, "the run to await approval", func() bool { return show().State == "awaiting_approval" })
	a := run.Actions[len(run.Actions)-1]
	_, _, err = runCLI(t, nil, "approve", string(a.ID), "--digest", string(a.ActionDigest), "--server", url)
	require.NoError(t, err)
	eventually(t, "the run to complete", func() bool { return show().State == "completed" })
	require.NoError(t, stop())
	require.NotContains(t, logs.String(), "this build has no")

	store, err := simulator.OpenEffectStore(t.Context(), effects, nil)
	require.NoError(t, err)
	got, err := store.Effects(t.Context())
	require.NoError(t, err)
	require.NoError(t, store.Close())
	require.Len(t, got, 1, "exactly one effect, in the --effects store")

	out, _, err = runCLI(t, nil, "evidence", "verify", string(sr.ID), "--db", db)
	require.NoError(t, err, out)
	require.Contains(t, out, "chain intact")
}
