package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// writeErr runs fn in a write and returns what Write returned.
func (f *fixture) writeErr(fn func(context.Context, ledger.Tx) error) error {
	ctx := context.Background()
	return f.d.Write(ctx, func(tx ledger.Tx) error { return fn(ctx, tx) })
}

// sqlstate is the SQLSTATE of the *pgconn.PgError in err's chain.
func sqlstate(t *testing.T, err error) string {
	t.Helper()
	var pg *pgconn.PgError
	require.ErrorAs(t, err, &pg, "the cause is kept: %v", err)
	return pg.Code
}

func TestConstraintErrorCodes(t *testing.T) {
	f := open(t)
	f.seed(t)

	// A duplicate key is CodeConflict.
	err := f.writeErr(func(ctx context.Context, tx ledger.Tx) error { return tx.InsertRun(ctx, newRun("run_1")) })
	requireCode(t, ledger.CodeConflict, err)
	require.ErrorIs(t, err, ledger.ErrConflict)
	require.Equal(t, "23505", sqlstate(t, err))
	// So is another run of the same request identity.
	same := newRun("run_9")
	same.IdempotencyKey = "key-run_1"
	err = f.writeErr(func(ctx context.Context, tx ledger.Tx) error { return tx.InsertRun(ctx, same) })
	requireCode(t, ledger.CodeConflict, err)
	// And a second pending approval of one action (a partial unique index).
	apr := func(id string) *ledger.Approval {
		return &ledger.Approval{ID: ledger.ApprovalID(id), ActionID: "act_1", RunID: "run_1", Tenant: "acme",
			ActionDigest: digest("a"), State: ledger.ApprovalPending, Version: 1, RequestedAt: t0}
	}
	err = f.writeErr(func(ctx context.Context, tx ledger.Tx) error {
		if err := tx.InsertApproval(ctx, apr("apr_1")); err != nil {
			return err
		}
		return tx.InsertApproval(ctx, apr("apr_2"))
	})
	requireCode(t, ledger.CodeConflict, err)

	// A missing foreign key is CodeInvalid.
	err = f.writeErr(func(ctx context.Context, tx ledger.Tx) error {
		return tx.InsertAction(ctx, newAction("act_9", "run_none", 1))
	})
	requireCode(t, ledger.CodeInvalid, err)
	require.Equal(t, "23503", sqlstate(t, err))
	err = f.writeErr(func(ctx context.Context, tx ledger.Tx) error {
		_, err := tx.SetAttemptEffect(ctx, "att_1", ledger.EffectHappened, "obs_none")
		return err
	})
	requireCode(t, ledger.CodeInvalid, err)

	// A check constraint is CodeInvalid: an unknown state, a stop reason on
	// a live run, a malformed digest.
	for name, mutate := range map[string]func(*ledger.Run){
		"state":       func(r *ledger.Run) { r.State = "bogus" },
		"stop reason": func(r *ledger.Run) { r.StopReason = "completed" },
		"digest":      func(r *ledger.Run) { r.RequestDigest = "md5:x" },
		"tenant":      func(r *ledger.Run) { r.Tenant = "" },
		"budget":      func(r *ledger.Run) { r.Budget.Used.Steps = -1 },
	} {
		r := newRun("run_x")
		mutate(r)
		err := f.writeErr(func(ctx context.Context, tx ledger.Tx) error { return tx.InsertRun(ctx, r) })
		requireCode(t, ledger.CodeInvalid, err)
		require.Equal(t, "23514", sqlstate(t, err), name)
	}
	// An approval decided without a time breaks its CHECK.
	err = f.writeErr(func(ctx context.Context, tx ledger.Tx) error {
		a := apr("apr_3")
		a.State = ledger.ApprovalGranted
		return tx.InsertApproval(ctx, a)
	})
	requireCode(t, ledger.CodeInvalid, err)

	// A value TEXT cannot hold (NUL) is CodeInvalid (class 22).
	err = f.writeErr(func(ctx context.Context, tx ledger.Tx) error {
		r := newRun("run_nul")
		r.Agent = "a\x00b"
		return tx.InsertRun(ctx, r)
	})
	requireCode(t, ledger.CodeInvalid, err)
	require.Equal(t, "22", sqlstate(t, err)[:2])

	// Nothing of the failed writes was committed.
	require.Equal(t, 1, f.count(t, "runs"))
	require.Equal(t, 0, f.count(t, "approvals"))
}

func TestAppendOnlyTables(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	f.write(t, func(tx ledger.Tx) error {
		if err := tx.InsertEvent(ctx, &ledger.Event{ID: "evt_1", RunID: "run_1", Seq: 1, Type: "run.queued", EntityType: "run",
			EntityID: "run_1", CreatedAt: t0, Hash: "sha256:1", Format: 2}); err != nil {
			return err
		}
		return tx.InsertObservation(ctx, &ledger.Observation{ID: "obs_1", RunID: "run_1", ActionID: "act_1",
			Source: ledger.ObservedPerson, Effect: ledger.EffectUnknown, ObservedAt: t0})
	})
	for _, q := range []string{`UPDATE events SET actor = 'x'`, `DELETE FROM events`,
		`UPDATE observations SET detail = 'x'`, `DELETE FROM observations`} {
		_, err := f.raw.Exec(q)
		require.ErrorContains(t, err, "are append-only", q)
	}
	// Dropping the trigger (what the tamper tests do) lets an edit through.
	_, err := f.raw.Exec(`DROP TRIGGER events_no_update ON events`)
	require.NoError(t, err)
	_, err = f.raw.Exec(`UPDATE events SET actor = 'x'`)
	require.NoError(t, err)
}

func TestGetsOfMissingRowsAreNotFound(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	r := f.d.Reader()
	gets := map[string]func() error{
		"run":           func() error { _, err := r.GetRun(ctx, "run_none"); return err },
		"run by key":    func() error { _, err := r.GetRunByRequest(ctx, "acme", "alice", "none"); return err },
		"chain head":    func() error { _, _, err := r.ChainHead(ctx, "run_none"); return err },
		"action":        func() error { _, err := r.GetAction(ctx, "act_none"); return err },
		"action by key": func() error { _, err := r.GetActionByKey(ctx, "run_1", "none"); return err },
		"attempt":       func() error { _, err := r.GetAttempt(ctx, "att_none"); return err },
		"last attempt":  func() error { _, err := r.LastAttempt(ctx, "act_none"); return err },
		"approval":      func() error { _, err := r.GetApproval(ctx, "apr_none"); return err },
		"pending":       func() error { _, err := r.PendingApproval(ctx, "act_1"); return err },
		"cancellation":  func() error { _, err := r.GetCancellation(ctx, "run_1"); return err },
		"lease":         func() error { _, err := r.GetAttemptLease(ctx, "att_1"); return err },
		"lease by key":  func() error { _, err := r.GetAttemptLeaseByKey(ctx, "act_1", "k"); return err },
		"decision":      func() error { _, err := r.GetAgentDecision(ctx, "act_1"); return err },
		"signature":     func() error { _, err := r.GetSignature(ctx, "run_1"); return err },
		"update lease": func() error {
			return f.writeErr(func(ctx context.Context, tx ledger.Tx) error {
				return tx.UpdateAttemptLease(ctx, &ledger.AttemptLease{AttemptID: "att_1"})
			})
		},
	}
	for name, get := range gets {
		err := get()
		requireCode(t, ledger.CodeNotFound, err)
		require.ErrorIs(t, err, ledger.ErrNotFound, name)
	}
	// Lists are empty, not nil.
	runs, err := r.ListRuns(ctx, ledger.RunFilter{AfterID: new(ledger.RunID("run_9"))})
	require.NoError(t, err)
	require.NotNil(t, runs)
	require.Empty(t, runs)
}

func TestErrorsOfAClosedDriverAreInternal(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	d2 := openOn(t, f.dsn)
	require.NoError(t, d2.d.Close())
	_, err := d2.d.Reader().GetRun(ctx, "run_1")
	requireCode(t, ledger.CodeInternal, err)
	err = d2.d.Write(ctx, func(ledger.Tx) error { return nil })
	requireCode(t, ledger.CodeInternal, err)
	err = d2.d.Read(ctx, func(ledger.Reader) error { return nil })
	requireCode(t, ledger.CodeInternal, err)
	_, err = d2.d.SchemaVersion(ctx)
	requireCode(t, ledger.CodeInternal, err)
	require.False(t, errors.Is(err, ledger.ErrNotFound))
}

// TestEventsKeptUntilCommit: InsertEvent keeps a write's events and
// inserts them together before the commit, so a write that reads its
// run's events sees those it appended, and an event that breaks a
// constraint fails the write whole, translated as an insert would be.
func TestEventsKeptUntilCommit(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	event := func(seq int64) *ledger.Event {
		return &ledger.Event{ID: ledger.EventID(fmt.Sprintf("evt_%d", seq)), RunID: "run_1", Seq: seq, Type: "run.queued",
			EntityType: "run", EntityID: "run_1", CreatedAt: t0, Hash: fmt.Sprintf("sha256:%d", seq), Format: 2}
	}
	f.write(t, func(tx ledger.Tx) error {
		for seq := int64(1); seq <= 3; seq++ {
			if err := tx.InsertEvent(ctx, event(seq)); err != nil {
				return err
			}
		}
		got, err := tx.ListEvents(ctx, "run_1", 3)
		if err != nil {
			return err
		}
		require.Len(t, got, 3, "the write reads the events it appended")
		return tx.InsertEvent(ctx, event(4))
	})
	require.Equal(t, 4, f.count(t, "events"))

	// A second event 5 breaks the unique (run, seq): the write fails at its
	// end, as a conflict, and neither event 5 nor the run's move is kept.
	err := f.writeErr(func(ctx context.Context, tx ledger.Tx) error {
		if _, _, err := tx.MoveRun(ctx, "run_1", ledger.RunQueued, ledger.RunRunning, "", t0); err != nil {
			return err
		}
		e := event(5)
		if err := tx.InsertEvent(ctx, e); err != nil {
			return err
		}
		e.ID = "evt_5b"
		return tx.InsertEvent(ctx, e)
	})
	requireCode(t, ledger.CodeConflict, err)
	require.Equal(t, "23505", sqlstate(t, err), "unique_violation")
	require.Equal(t, 4, f.count(t, "events"))
	var state string
	require.NoError(t, f.raw.QueryRow(`SELECT state FROM runs WHERE id = 'run_1'`).Scan(&state))
	require.Equal(t, string(ledger.RunQueued), state)
}
