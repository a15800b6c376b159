package evidence_test

import (
	"bytes"
	"context"
	"database/sql"
	"testing"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	_ "github.com/mattn/go-sqlite3" // the driver under gorm.io/driver/sqlite, for tampering by hand
	"github.com/stretchr/testify/require"
)

// tamper edits an event the way someone with write access to the file
// would: drop the append-only trigger, then UPDATE.
func tamper(t *testing.T, path string, run ledger.RunID, seq int64) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`UPDATE events SET actor = 'mallory' WHERE run_id = ? AND seq = ?`, run, seq)
	require.ErrorContains(t, err, "append-only", "the trigger stops a plain edit")
	_, err = db.Exec(`DROP TRIGGER events_no_update`)
	require.NoError(t, err)
	res, err := db.Exec(`UPDATE events SET data = '{"reason":"nothing to see"}' WHERE run_id = ? AND seq = ?`, run, seq)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

func TestVerify(t *testing.T) {
	ctx := context.Background()
	t.Run("OK", func(t *testing.T) {
		f := openFixture(t)
		id := goldenRun(t, f)
		rep, err := f.store.VerifyChain(ctx, id)
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
		require.Equal(t, 35, rep.Events)
		require.Zero(t, rep.BrokenSeq)
	})
	t.Run("EditedEvent", func(t *testing.T) {
		f := openFixture(t)
		id := goldenRun(t, f)
		tamper(t, f.path, id, 22)

		rep, err := f.store.VerifyChain(ctx, id)
		require.NoError(t, err)
		require.False(t, rep.OK)
		require.Equal(t, int64(22), rep.BrokenSeq)
		require.Contains(t, rep.Reason, "event 22 was changed")

		// The report still exports, and says where the chain broke.
		report, err := evidence.Build(ctx, f.store, id, f.options(t))
		require.NoError(t, err)
		require.False(t, report.Chain.OK)
		require.Equal(t, int64(22), *report.Chain.BrokenSeq)
		var md bytes.Buffer
		require.NoError(t, report.Markdown(&md))
		require.Contains(t, md.String(), "BROKEN at event 22")
		var js bytes.Buffer
		require.NoError(t, report.JSON(&js))
		require.Contains(t, js.String(), `"broken_seq": 22`)
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		f := openFixture(t)
		_, err := f.store.VerifyChain(ctx, "run_00000000000000000000000099")
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}
