package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/stretchr/testify/require"
)

func TestMigrations(t *testing.T) {
	ctx := context.Background()

	t.Run("empty database migrates and re-opens cleanly", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ledger.db")
		clock := ledgertest.NewClock()
		b := ledgertest.OpenStoreAt(t, path, clock)
		v, err := b.Store.CurrentSchemaVersion(ctx)
		require.NoError(t, err)
		require.Equal(t, sqlite.SchemaVersion(), v)
		require.GreaterOrEqual(t, v, 1)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		require.NoError(t, b.Store.Close())

		again := ledgertest.OpenStoreAt(t, path, clock)
		v2, err := again.Store.CurrentSchemaVersion(ctx)
		require.NoError(t, err)
		require.Equal(t, v, v2)
		got, err := again.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunRunning, got.State)

		db, err := sql.Open("sqlite3", path)
		require.NoError(t, err)
		defer db.Close()
		var applied int
		require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&applied))
		require.Equal(t, v, applied, "each migration recorded once")
		var mode string
		require.NoError(t, db.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
		require.Equal(t, "wal", mode)
		var integrity string
		require.NoError(t, db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity))
		require.Equal(t, "ok", integrity)
		rows, err := db.Query(`PRAGMA foreign_key_check`)
		require.NoError(t, err)
		require.False(t, rows.Next(), "no dangling references")
		require.NoError(t, rows.Close())
	})

	t.Run("a newer database is refused and left alone", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ledger.db")
		b := ledgertest.OpenStoreAt(t, path, ledgertest.NewClock())
		require.NoError(t, b.Store.Close())
		db, err := sql.Open("sqlite3", path)
		require.NoError(t, err)
		defer db.Close()
		newer := sqlite.SchemaVersion() + 1
		_, err = db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'from_the_future.sql', 0)`, newer)
		require.NoError(t, err)

		_, err = sqlite.OpenStore(ctx, sqlite.Config{Path: path})
		require.ErrorIs(t, err, ledger.ErrUnsupportedVersion)
		require.Contains(t, err.Error(), "newer than this build")
		var maxV int
		require.NoError(t, db.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&maxV))
		require.Equal(t, newer, maxV)
	})

	t.Run("OK several processes migrating one new file at once", func(t *testing.T) {
		// Each Open is what a process starting `ledger migrate` or `serve`
		// does; they race to apply the same migrations, and each must find
		// the schema complete, applied once.
		path := filepath.Join(t.TempDir(), "ledger.db")
		const n = 6
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				s, err := sqlite.OpenStore(ctx, sqlite.Config{Path: path, BusyTimeout: 30 * time.Second})
				if err == nil {
					err = s.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		db, err := sql.Open("sqlite3", path)
		require.NoError(t, err)
		defer db.Close()
		var applied, distinct int
		require.NoError(t, db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT version) FROM schema_migrations`).Scan(&applied, &distinct))
		require.Equal(t, sqlite.SchemaVersion(), applied, "each migration recorded once")
		require.Equal(t, applied, distinct)
	})

	t.Run("bad config", func(t *testing.T) {
		_, err := sqlite.OpenStore(ctx, sqlite.Config{})
		require.ErrorIs(t, err, ledger.ErrInvalid)
		_, err = sqlite.OpenStore(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "x.db"), Synchronous: "sometimes"})
		require.ErrorIs(t, err, ledger.ErrInvalid)
		_, err = sqlite.OpenStore(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "no", "such", "dir", "x.db")})
		require.Error(t, err)
	})
}
