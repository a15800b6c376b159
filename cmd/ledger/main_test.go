package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/stretchr/testify/require"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := Run(context.Background(), args, &out, &errOut)
	return out.String(), err
}

func TestVersion(t *testing.T) {
	t.Parallel()
	out, err := run(t, "version", "--json")
	require.NoError(t, err)
	var v struct {
		Version       string `json:"version"`
		SchemaVersion int    `json:"schema_version"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, sqlite.SchemaVersion(), v.SchemaVersion)

	out, err = run(t, "version")
	require.NoError(t, err)
	require.Contains(t, out, "ledger dev (schema")

	_, err = run(t, "version", "extra")
	requireExit(t, err, exitUsage)

	flag, err := run(t, "--version")
	require.NoError(t, err)
	require.Equal(t, out, flag, "--version prints what version prints")
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	out, err := run(t, "migrate", "--db", db, "--json")
	require.NoError(t, err)
	require.JSONEq(t, `{"db":"`+db+`","schema_version":`+itoa(sqlite.SchemaVersion())+`}`, out)
	out, err = run(t, "migrate", "--db", db)
	require.NoError(t, err, "re-running is a no-op")
	require.Contains(t, out, "schema version")

	t.Run("newer database refused with exit status 3", func(t *testing.T) {
		raw, err := sql.Open("sqlite3", db)
		require.NoError(t, err)
		_, err = raw.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future.sql', 0)`)
		require.NoError(t, err)
		require.NoError(t, raw.Close())
		_, err = run(t, "migrate", "--db", db)
		require.ErrorIs(t, err, ledger.ErrUnsupportedVersion)
		require.Equal(t, 3, exitCode(err))
	})

	t.Run("unknown flag", func(t *testing.T) {
		_, err := run(t, "migrate", "--nope")
		require.Error(t, err)
	})
}

// TestBinary builds the real binary and runs the README's first command.
func TestBinary(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := ledgerBinary(t)

	cmd := exec.Command(bin, "migrate")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "./ledger.db: schema version")
	_, err = os.Stat(filepath.Join(dir, "ledger.db"))
	require.NoError(t, err)

	cmd = exec.Command(bin, "migrate", "--db", filepath.Join(dir, "missing", "x.db"))
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "ledger: ")

	t.Run("UsageErrorsExit2", func(t *testing.T) {
		for _, args := range [][]string{{"runs", "lsit"}, {"submti"}, {"--bogus"}, {"runs"}, {}, {"help", "nope"}} {
			cmd := exec.Command(bin, args...)
			cmd.Dir = dir
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			require.Equal(t, 2, exitOf(err), "ledger %v: %v\n%s", args, err, stderr.String())
			require.Empty(t, stdout.String(), "ledger %v", args)
			require.True(t, strings.HasPrefix(stderr.String(), "ledger: "), "ledger %v: %s", args, stderr.String())
		}
	})
	t.Run("VersionFlag", func(t *testing.T) {
		flag, err := exec.Command(bin, "--version").Output()
		require.NoError(t, err)
		cmd, err := exec.Command(bin, "version").Output()
		require.NoError(t, err)
		require.Equal(t, string(cmd), string(flag))
		require.Contains(t, string(flag), "ledger ")
	})
}

func TestDemo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out, err := run(t, "demo", "--keep", dir)
	require.NoError(t, err)
	require.Contains(t, out, "refused (forbidden)", "self-approval is refused")
	require.Contains(t, out, "(replayed: true)")
	require.Contains(t, out, "is completed, stop reason completed")
	require.Contains(t, out, "chain valid: true")
	require.Contains(t, out, "which the ledger never writes): 1\n")

	// The effect count is readable without the ledger, from the store alone.
	out, err = run(t, "simulator", "effects", "--store", filepath.Join(dir, "ledger.db.effects.db"), "--json")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 1)
	var e struct {
		DedupKey        string `json:"dedup_key"`
		Tool            string `json:"tool"`
		ArgumentsDigest string `json:"arguments_digest"`
		CreatedAt       string `json:"created_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &e))
	require.Equal(t, "cards.write", e.Tool)
	require.Regexp(t, `^run_[0-9A-Z]{26}/act_[0-9A-Z]{26}$`, e.DedupKey)
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, e.ArgumentsDigest)

	// Running the demo again on the same files is the same run: still one effect.
	out, err = run(t, "demo", "--keep", dir)
	require.NoError(t, err, out)
	out, err = run(t, "simulator", "effects", "--store", filepath.Join(dir, "ledger.db.effects.db"))
	require.NoError(t, err)
	require.Contains(t, out, "1 effects")
}

func TestSimulatorEffectsMissingStore(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nope.db")
	_, err := run(t, "simulator", "effects", "--store", missing)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, statErr := os.Stat(missing)
	require.ErrorIs(t, statErr, os.ErrNotExist, "a typo does not create an empty store")
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
