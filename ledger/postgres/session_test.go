package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

// TestWriteAfterSessionEnded: the server ends a session that sat idle
// inside a write past idle_in_transaction_session_timeout, as it does to a
// process frozen mid-write (SIGSTOP, a stalled VM). Nothing of that write
// was committed, so the driver runs it again, once, on a new session: the
// woken process's write goes through (or meets whatever the rules say,
// a lost lease say) instead of failing as a broken store. A session that
// ends again fails the write as the store failure it is, not as a
// conflict.
func TestWriteAfterSessionEnded(t *testing.T) {
	dsn := pgtest.NewSchema(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	f := openOn(t, dsn+sep+"idle_in_transaction_session_timeout=200")
	ctx := context.Background()

	calls := 0
	err := f.d.Write(ctx, func(tx ledger.Tx) error {
		calls++
		if err := tx.InsertRun(ctx, newRun("run_1")); err != nil {
			return err
		}
		if calls == 1 {
			time.Sleep(700 * time.Millisecond) // frozen: the server ends the session
		}
		return tx.InsertAction(ctx, newAction("act_1", "run_1", 1))
	})
	require.NoError(t, err, "run again on a new session")
	require.Equal(t, 2, calls)
	require.Equal(t, 1, f.count(t, "runs"))
	require.Equal(t, 1, f.count(t, "actions"))

	// Frozen after its last statement: the COMMIT is what meets the ended
	// session, and the server's reason (25P03) says it never committed.
	calls = 0
	err = f.d.Write(ctx, func(tx ledger.Tx) error {
		calls++
		if err := tx.InsertRun(ctx, newRun("run_3")); err != nil {
			return err
		}
		if calls == 1 {
			time.Sleep(700 * time.Millisecond)
		}
		return nil
	})
	require.NoError(t, err, "run again after its COMMIT met the ended session")
	require.Equal(t, 2, calls)
	require.Equal(t, 2, f.count(t, "runs"))

	calls = 0
	err = f.d.Write(ctx, func(tx ledger.Tx) error {
		calls++
		if err := tx.InsertRun(ctx, newRun("run_2")); err != nil {
			return err
		}
		time.Sleep(700 * time.Millisecond)
		return tx.InsertAction(ctx, newAction("act_2", "run_2", 1))
	})
	requireCode(t, ledger.CodeInternal, err)
	require.Equal(t, 2, calls, "run again once, not as often as a lost race")
	require.Equal(t, 2, f.count(t, "runs"), "nothing of the failed write")
}
