package evidence_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/perf"
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
		require.Equal(t, 33, rep.Events)
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

// TestChainReadCancelled: the store reads a long chain without handing
// each row to a goroutine of the driver, but a cancelled context still
// ends the read: FindChain either returns the whole chain or fails with
// the context's error, for deadlines from before the read to after it.
func TestChainReadCancelled(t *testing.T) {
	f := openFixtureWith(t, sqlite.Config{Synchronous: "OFF"})
	id := goldenRun(t, f)
	_, err := perf.FillEvents(context.Background(), f.store, id, 3000)
	require.NoError(t, err)
	whole, err := f.store.FindChain(context.Background(), id)
	require.NoError(t, err)
	require.True(t, whole.Report.OK)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = f.store.FindChain(ctx, id)
	require.ErrorIs(t, err, context.Canceled)

	failed, finished := 0, 0
	for d := 100 * time.Microsecond; d < 2*time.Second && (failed == 0 || finished == 0); d *= 2 {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		chain, err := f.store.FindChain(ctx, id)
		cancel()
		if err != nil {
			// Past the read, database/sql rolls the read transaction back
			// when the context ends, and FindChain's commit finds it done.
			if !errors.Is(err, sql.ErrTxDone) {
				require.ErrorIs(t, err, context.DeadlineExceeded, "after %s", d)
			}
			failed++
			continue
		}
		require.Equal(t, whole.Report, chain.Report, "after %s", d)
		require.Len(t, chain.Events, len(whole.Events))
		finished++
	}
	require.Positive(t, failed, "some deadline cut the read short")
	require.Positive(t, finished, "some deadline let it finish")
}
