package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
)

// identityMigration names the migration that keys runs by (tenant,
// principal, key) and adds too_late; its number may change, its name not.
const identityMigration = "_request_identity_and_too_late.sql"

// previousSchema writes, at path, a database of the schema before the
// identity migration: every migration file before it applied by hand, as
// an older build of ledger did, each recorded in schema_migrations.
func previousSchema(t *testing.T, path string) *sql.DB {
	t.Helper()
	dir := "migrations"
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	idx := slices.IndexFunc(names, func(n string) bool { return strings.HasSuffix(n, identityMigration) })
	require.Positive(t, idx, "the identity migration is not the first")
	db, err := sql.Open("sqlite3", "file:"+path+"?_foreign_keys=on&_busy_timeout=5000")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	_, err = db.Exec(`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`)
	require.NoError(t, err)
	for i, name := range names[:idx] {
		body, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		_, err = db.Exec(string(body))
		require.NoError(t, err, name)
		_, err = db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)`, i+1, name)
		require.NoError(t, err)
	}
	return db
}

func TestMigrateRequestIdentity(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := previousSchema(t, path)

	input := json.RawMessage(`{"markdown":"# a","title":"t"}`)
	sub := ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "shared-key", Principal: "alice", Agent: "practice-cards", Input: input}
	digest, err := ledger.RequestDigest(sub)
	require.NoError(t, err)
	const (
		runID = "run_01HZZZZZZZZZZZZZZZZZZZZZZ1"
		actID = "act_01HZZZZZZZZZZZZZZZZZZZZZZ1"
		attID = "att_01HZZZZZZZZZZZZZZZZZZZZZZ1"
		aprID = "apr_01HZZZZZZZZZZZZZZZZZZZZZZ1"
		obsID = "obs_01HZZZZZZZZZZZZZZZZZZZZZZ1"
		cncID = "cnc_01HZZZZZZZZZZZZZZZZZZZZZZ1"
		evtID = "evt_01HZZZZZZZZZZZZZZZZZZZZZZ1"
	)
	// A completed run with one of each row, and the cancellation the old
	// three-write cancel left accepted on it.
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO runs (id, tenant, idempotency_key, request_digest, submitted_by, agent, input, state, stop_reason, version, event_seq, event_hash, created_at, updated_at)
			VALUES (?, 'acme', 'shared-key', ?, 'alice', 'practice-cards', ?, 'completed', 'completed', 5, 1, 'h1', 10, 20)`, []any{runID, string(digest), string(input)}},
		{`INSERT INTO budgets (run_id, max_attempts_per_action, attempts_used) VALUES (?, 3, 1)`, []any{runID}},
		{`INSERT INTO actions (id, run_id, tenant, seq, idempotency_key, tool, tool_version, effect, arguments, action_digest, dedup_key, state, attempt_count, created_at, updated_at)
			VALUES (?, ?, 'acme', 1, 'step-1', 'cards.write', '1', 'write', '{}', 'sha256:ab', ?, 'succeeded', 1, 11, 12)`, []any{actID, runID, runID + "/" + actID}},
		{`INSERT INTO observations (id, run_id, action_id, source, effect, observed_at) VALUES (?, ?, ?, 'tool_result', 'happened', 13)`, []any{obsID, runID, actID}},
		{`INSERT INTO attempts (id, action_id, run_id, attempt_no, status, effect, effect_observation_id, started_at, finished_at)
			VALUES (?, ?, ?, 1, 'succeeded', 'happened', ?, 12, 13)`, []any{attID, actID, runID, obsID}},
		{`INSERT INTO approvals (id, action_id, run_id, tenant, action_digest, state, decided_by, reason, requested_at, decided_at)
			VALUES (?, ?, ?, 'acme', 'sha256:ab', 'granted', 'bob', 'ok', 11, 12)`, []any{aprID, actID, runID}},
		{`INSERT INTO cancellations (id, run_id, tenant, state, requested_by, reason, requested_at, accepted_at)
			VALUES (?, ?, 'acme', 'accepted', 'alice', 'stop', 14, 14)`, []any{cncID, runID}},
		{`INSERT INTO events (id, run_id, seq, type, entity_type, entity_id, created_at, prev_hash, hash)
			VALUES (?, ?, 1, 'run.queued', 'run', ?, 10, '', 'h1')`, []any{evtID, runID, runID}},
	} {
		_, err := db.Exec(q.sql, q.args...)
		require.NoError(t, err, q.sql)
	}
	counts := func() map[string]int {
		out := map[string]int{}
		for _, table := range []string{"runs", "budgets", "actions", "observations", "attempts", "approvals", "cancellations", "events"} {
			var n int
			require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&n))
			out[table] = n
		}
		return out
	}
	before := counts()
	require.NoError(t, db.Close())

	b := ledgertest.OpenStoreAt(t, path, ledgertest.NewClock())
	v, err := b.Store.CurrentSchemaVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, sqlite.SchemaVersion(), v)

	db, err = sql.Open("sqlite3", "file:"+path+"?_foreign_keys=on&_busy_timeout=5000")
	require.NoError(t, err)
	defer db.Close()

	t.Run("OK every row kept", func(t *testing.T) {
		require.Equal(t, before, counts())
		run, err := b.Store.FindRunByID(ctx, runID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunCompleted, run.State)
		require.Equal(t, ledger.StopCompleted, run.StopReason)
		require.Equal(t, "alice", run.SubmittedBy)
		require.Equal(t, "shared-key", run.IdempotencyKey)
		require.Equal(t, digest, run.RequestDigest)
		require.Equal(t, int64(5), run.Version)
		require.Equal(t, int64(1), run.EventSeq)
		require.Equal(t, "h1", run.EventHash)
		require.Equal(t, int64(3), run.Budget.Limits.MaxAttemptsPerAction)
		c, err := b.Store.FindCancellation(ctx, runID)
		require.NoError(t, err)
		require.Equal(t, ledger.CancellationID(cncID), c.ID)
		require.Equal(t, ledger.CancelAccepted, c.State, "the migration settles nothing: recovery does")
		require.NotNil(t, c.AcceptedAt)
		require.Nil(t, c.TooLateAt)
	})
	t.Run("OK references, constraints and indexes kept", func(t *testing.T) {
		var integrity string
		require.NoError(t, db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity))
		require.Equal(t, "ok", integrity)
		rows, err := db.Query(`PRAGMA foreign_key_check`)
		require.NoError(t, err)
		require.False(t, rows.Next(), "no dangling references")
		require.NoError(t, rows.Close())
		var indexes []string
		rows, err = db.Query(`SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name IN ('runs', 'cancellations') AND sql IS NOT NULL ORDER BY name`)
		require.NoError(t, err)
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			indexes = append(indexes, n)
		}
		require.NoError(t, rows.Close())
		require.Equal(t, []string{"cancellations_unsettled", "runs_claim", "runs_lease_owner", "runs_state", "runs_tenant_state", "runs_tenant_submitter"}, indexes)
		// The other tables still refer to runs, with foreign keys on.
		_, err = db.Exec(`INSERT INTO budgets (run_id) VALUES ('run_missing')`)
		require.ErrorContains(t, err, "FOREIGN KEY")
		_, err = db.Exec(`INSERT INTO cancellations (id, run_id, tenant, state, requested_by, requested_at) VALUES ('cnc_x', 'run_missing', 'acme', 'accepted', 'a', 1)`)
		require.ErrorContains(t, err, "FOREIGN KEY")
		// The runs' CHECKs still hold.
		_, err = db.Exec(`INSERT INTO runs (id, tenant, idempotency_key, request_digest, submitted_by, agent, input, state, created_at, updated_at)
			VALUES ('run_x', 'acme', 'k', 'sha256:x', 'alice', 'a', '{}', 'completed', 1, 1)`)
		require.ErrorContains(t, err, "CHECK")
		_, err = db.Exec(`UPDATE cancellations SET state = 'too_late' WHERE id = ?`, cncID)
		require.ErrorContains(t, err, "CHECK", "too_late needs its time")
		// Events stay append-only.
		_, err = db.Exec(`DELETE FROM events`)
		require.ErrorContains(t, err, "append-only")
	})
	t.Run("OK the key is per principal", func(t *testing.T) {
		replay, err := b.Store.SubmitRun(ctx, sub)
		require.NoError(t, err)
		require.True(t, replay.Replayed, "alice's own key replays her run")
		require.Equal(t, ledger.RunID(runID), replay.Run.ID)
		other := sub
		other.Principal = "amy"
		res, err := b.Store.SubmitRun(ctx, other)
		require.NoError(t, err)
		require.False(t, res.Replayed, "amy's key is another identity")
		require.NotEqual(t, ledger.RunID(runID), res.Run.ID)
		changed := sub
		changed.Input = json.RawMessage(`{"markdown":"# b","title":"t"}`)
		_, err = b.Store.SubmitRun(ctx, changed)
		require.ErrorIs(t, err, ledger.ErrConflict)
	})
	t.Run("OK recovery's settling works on the migrated row", func(t *testing.T) {
		settled, err := b.Store.SettleCancellations(ctx)
		require.NoError(t, err)
		require.Len(t, settled, 1)
		require.Equal(t, ledger.CancelTooLate, settled[0].State)
	})
}
