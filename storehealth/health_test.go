package storehealth_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/storehealth"
)

// TestStoreHealth drives a Tracker through a real SQLite store whose hook
// it is (ledger.Options.Observe), its writes failing as on a full disk
// through the store's own fault hook.
func TestStoreHealth(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*ledgertest.Bundle, *logLines, *storehealth.Tracker, ledger.Store, func(bool)) {
		var full atomic.Bool
		lines, log := newLogLines()
		var h *storehealth.Tracker
		lb := ledgertest.OpenStoreWith(t, func(c *sqlite.Config) {
			c.WriteFaultFunc = func(_ int64, at ledger.WritePoint) error {
				if at == ledger.WriteBeforeCommit && full.Load() {
					return errors.New("database or disk is full")
				}
				return nil
			}
			h = storehealth.New(storehealth.Config{Now: c.Now, Logger: log})
			c.Observe = h.Observe
		})
		return lb, lines, h, lb.Store, full.Store
	}

	t.Run("FailingUntilAWriteSucceeds", func(t *testing.T) {
		lb, lines, h, s, fill := setup(t)
		run := lb.SubmitRun(t, "k1", ledger.BudgetLimits{})
		require.NoError(t, h.Err())
		require.Nil(t, h.Recovered())
		fill(true)
		_, err := s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.Error(t, err)
		require.ErrorContains(t, h.Err(), "store writes failing since 2026-01-02T03:04:05Z (1 failed): transition run: ")
		require.ErrorContains(t, h.Err(), "database or disk is full")
		ok := h.Recovered()
		require.NotNil(t, ok)
		lb.Clock.Advance(time.Second)
		_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.Error(t, err)
		require.ErrorContains(t, h.Err(), "(2 failed)")
		require.EqualValues(t, 2, h.Errors()["transition_run"])

		fill(false)
		// The domain's answers are neither failure nor success.
		_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunAwaitingApproval, Actor: "t"})
		require.ErrorIs(t, err, ledger.ErrConflict)
		_, err = s.FindRunByID(ctx, "run_01JAAAAAAAAAAAAAAAAAAAAAAA")
		require.ErrorIs(t, err, ledger.ErrNotFound)
		require.Error(t, h.Err(), "a conflict or a not-found proves no write")
		select {
		case <-ok:
			t.Fatal("recovered on a conflict")
		default:
		}

		// Writes that succeed without changing anything prove nothing either.
		_, err = s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k1", Principal: "alice",
			Agent: "practice-cards", Input: []byte(`{"title":"t","markdown":"# a"}`)})
		require.NoError(t, err, "a replay")
		expired, err := s.ExpireApprovals(ctx)
		require.NoError(t, err)
		require.Empty(t, expired)
		lb.Clock.Advance(3 * time.Second)
		require.Error(t, h.Err(), "a replayed submit and an expiry pass with nothing due wrote nothing")

		// A write succeeds, but the last failure is under Hold (2s) ago: a
		// nearly full disk lets some writes through.
		fill(true)
		_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.Error(t, err)
		fill(false)
		lb.Clock.Advance(time.Second)
		run2 := lb.SubmitRun(t, "k2", ledger.BudgetLimits{})
		_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.NoError(t, err)
		require.ErrorContains(t, h.Err(), "(3 failed)", "one write went through a second after a failure")
		select {
		case <-ok:
			t.Fatal("recovered within Hold")
		default:
		}

		// Two seconds without a failure, and a write succeeded: sound.
		lb.Clock.Advance(time.Second)
		require.NoError(t, h.Err())
		<-ok // closed: whoever backs off resumes
		_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run2.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.NoError(t, err)
		require.NoError(t, h.Err())
		require.EqualValues(t, 3, h.Errors()["transition_run"], "counts only grow")
		require.Zero(t, h.Errors()["find_run_by_id"], "not found is no failure")

		recs := lines.records(t)
		require.Len(t, recs, 2, "%v", recs)
		require.Equal(t, "store writes failing", recs[0]["msg"])
		require.Equal(t, "transition_run", recs[0]["op"])
		require.Equal(t, "store writes succeed again", recs[1]["msg"])
		require.EqualValues(t, 3, recs[1]["failed"])
		require.Equal(t, "6s", recs[1]["after"])
	})

	t.Run("ProbeWriteOnceHoldIsOver", func(t *testing.T) {
		// A process with nothing else to write: the probe write, due once
		// Hold has gone without a failure, ends the episode, or, on a disk
		// still full, fails and starts Hold again.
		lb, _, h, s, fill := setup(t)
		run := lb.SubmitRun(t, "k1", ledger.BudgetLimits{})
		require.False(t, h.ProbeDue(), "nothing failing")
		fill(true)
		_, err := s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.Error(t, err)
		lb.Clock.Advance(time.Second)
		require.False(t, h.ProbeDue(), "within Hold of the failure")
		lb.Clock.Advance(time.Second)
		require.True(t, h.ProbeDue())
		require.ErrorContains(t, s.ProbeWrite(ctx), "database or disk is full", "the probe is a real write")
		require.EqualValues(t, 1, h.Errors()["probe_write"])
		require.False(t, h.ProbeDue(), "its failure starts Hold again")
		require.Error(t, h.Err())

		fill(false)
		lb.Clock.Advance(2 * time.Second)
		require.True(t, h.ProbeDue())
		require.NoError(t, s.ProbeWrite(ctx))
		require.NoError(t, h.Err(), "the probe wrote: sound")
		require.False(t, h.ProbeDue())
		got, err := lb.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunQueued, got.State, "the probe changed nothing the ledger reads")
		report, err := lb.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, report.OK)
	})

	t.Run("ReadFailuresCountedNotFailing", func(t *testing.T) {
		lb, _, h, s, _ := setup(t)
		require.NoError(t, lb.Store.Close())
		_, err := s.FindRuns(ctx, ledger.RunFilter{Limit: 1})
		require.Error(t, err)
		require.True(t, storehealth.IsFailure(err))
		require.EqualValues(t, 1, h.Errors()["find_runs"])
		require.NoError(t, h.Err(), "readiness reads for itself")
	})

	t.Run("EveryOpCountedFromZero", func(t *testing.T) {
		_, _, h, _, _ := setup(t)
		errs := h.Errors()
		require.Len(t, errs, len(ledger.StoreOps()))
		for _, op := range ledger.StoreOps() {
			require.Contains(t, errs, op)
			require.Zero(t, errs[op])
		}
		require.Contains(t, errs, "find_run_by_id", "named as before the hook")
		require.Contains(t, errs, "probe_write")
	})

	t.Run("WrappedStoreSeenOnce", func(t *testing.T) {
		// Whoever wraps the store (a test, a fault plan), its calls reach
		// the store's runners, and each is counted once.
		lb, _, h, s, fill := setup(t)
		run := lb.SubmitRun(t, "k1", ledger.BudgetLimits{})
		wrapped := struct{ ledger.Store }{s}
		fill(true)
		_, err := wrapped.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.Error(t, err)
		require.EqualValues(t, 1, h.Errors()["transition_run"])
		require.Error(t, h.Err())
	})

	t.Run("CancelledIsNoFailure", func(t *testing.T) {
		require.False(t, storehealth.IsFailure(nil))
		require.False(t, storehealth.IsFailure(context.Canceled))
		require.False(t, storehealth.IsFailure(ledger.Errorf(ledger.CodeInternal, "begin: %w", context.DeadlineExceeded)))
		require.False(t, storehealth.IsFailure(ledger.ErrConflict))
		require.True(t, storehealth.IsFailure(errors.New("disk I/O error")))
	})
}
