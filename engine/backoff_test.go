package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/stretchr/testify/require"
)

func TestBackoffDelay(t *testing.T) {
	low := backoff{min: 100 * time.Millisecond, max: 30 * time.Second, jitter: func(time.Duration) time.Duration { return 0 }}
	high := low
	high.jitter = func(d time.Duration) time.Duration { return d - 1 }
	for _, tc := range []struct {
		n         int
		low, high time.Duration
	}{
		{1, 50 * time.Millisecond, 100*time.Millisecond - 1},
		{2, 100 * time.Millisecond, 200*time.Millisecond - 1},
		{3, 200 * time.Millisecond, 400*time.Millisecond - 1},
		{9, 12800 * time.Millisecond, 25600*time.Millisecond - 1},
		{10, 15 * time.Second, 30*time.Second - 1}, // 51.2s capped
		{64, 15 * time.Second, 30*time.Second - 1}, // no overflow however many
		{1000, 15 * time.Second, 30*time.Second - 1},
	} {
		t.Run(fmt.Sprintf("n=%d", tc.n), func(t *testing.T) {
			require.Equal(t, tc.low, low.delay(tc.n), "the lower half is never cut")
			require.Equal(t, tc.high, high.delay(tc.n))
		})
	}
	t.Run("RandomJitterInRange", func(t *testing.T) {
		b := backoff{min: 100 * time.Millisecond, max: time.Second}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := b.delay(3)
			require.GreaterOrEqual(t, d, 200*time.Millisecond)
			require.Less(t, d, 400*time.Millisecond)
			seen[d] = true
		}
		require.Greater(t, len(seen), 100, "retries of runs that failed together spread out")
	})
	t.Run("TinyMin", func(t *testing.T) {
		b := backoff{min: 1, max: 1}
		require.LessOrEqual(t, b.delay(1), time.Duration(1), "no panic on a range of one")
	})
}

// logLines is a JSON slog handler's output, safe for concurrent writes.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// records returns the lines logged so far, decoded.
func (l *logLines) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.buf.String()) {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		out = append(out, r)
	}
	return out
}

func newLogLines() (*logLines, *slog.Logger) {
	l := &logLines{}
	return l, slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func TestFailureLog(t *testing.T) {
	ctx := context.Background()
	setup := func() (*logLines, *ledgertest.Clock, *failureLog) {
		lines, log := newLogLines()
		clock := ledgertest.NewClock()
		return lines, clock, newFailureLog(log, clock.Now, 10*time.Second)
	}
	first, later := errors.New("disk full at 1"), errors.New("disk full at 2")

	t.Run("FirstAtOnceThenOncePerIntervalWithCount", func(t *testing.T) {
		lines, clock, l := setup()
		l.Error(ctx, "advance run", first, "run", "run_1")
		require.Len(t, lines.records(t), 1, "the first failure is logged at once")
		for i := range 311 {
			clock.Advance(10 * time.Millisecond)
			if i == 0 {
				l.Error(ctx, "advance run", later, "run", "run_2")
				continue
			}
			l.Error(ctx, "advance run", first, "run", "run_3")
		}
		l.Flush(ctx)
		require.Len(t, lines.records(t), 1, "repeats within the interval are only counted")

		clock.Advance(7 * time.Second) // 10.11s since the first line
		l.Flush(ctx)
		recs := lines.records(t)
		require.Len(t, recs, 2)
		require.Equal(t, "advance run", recs[0]["msg"])
		require.Equal(t, first.Error(), recs[0]["err"])
		require.Equal(t, "run_1", recs[0]["run"])
		require.Equal(t, "ERROR", recs[0]["level"])
		require.Equal(t, "advance run; 311 errors in the last 10s", recs[1]["msg"])
		require.Equal(t, later.Error(), recs[1]["err"], "the first error of the window")
		require.EqualValues(t, 311, recs[1]["errors"])
	})

	t.Run("CountLoggedByTheNextFailureWithoutFlush", func(t *testing.T) {
		lines, clock, l := setup()
		l.Error(ctx, "expire approvals", first)
		clock.Advance(time.Second)
		l.Error(ctx, "expire approvals", later)
		clock.Advance(9 * time.Second)
		l.Error(ctx, "expire approvals", first)
		recs := lines.records(t)
		require.Len(t, recs, 2)
		require.Equal(t, "expire approvals; 2 errors in the last 10s", recs[1]["msg"])
		require.Equal(t, later.Error(), recs[1]["err"])
	})

	t.Run("QuietIntervalStartsOver", func(t *testing.T) {
		lines, clock, l := setup()
		l.Error(ctx, "find runnable runs", first)
		clock.Advance(10 * time.Second)
		l.Flush(ctx) // nothing counted: forgotten
		require.Len(t, lines.records(t), 1)
		l.Error(ctx, "find runnable runs", later)
		recs := lines.records(t)
		require.Len(t, recs, 2, "after a quiet interval the next failure is logged at once")
		require.Equal(t, "find runnable runs", recs[1]["msg"])
	})

	t.Run("MessagesApart", func(t *testing.T) {
		lines, _, l := setup()
		l.Error(ctx, "advance run", first)
		l.Error(ctx, "expire approvals", first)
		l.Error(ctx, "advance run", first)
		require.Len(t, lines.records(t), 2)
	})
}

func TestStoreHealth(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*ledgertest.Bundle, *logLines, *StoreHealth, ledger.Store, func(bool)) {
		// The store's writes fail as on a full disk while full is set: the
		// store's own fault hook, so the store stays real.
		var full atomic.Bool
		lb := ledgertest.OpenStoreWith(t, func(c *sqlite.Config) {
			c.WriteFaultFunc = func(_ int64, at ledger.WritePoint) error {
				if at == ledger.WriteBeforeCommit && full.Load() {
					return errors.New("database or disk is full")
				}
				return nil
			}
		})
		lines, log := newLogLines()
		h := NewStoreHealth(StoreHealthConfig{Now: lb.Clock.Now, Logger: log})
		return lb, lines, h, h.Watch(lb.Store), full.Store
	}

	t.Run("FailingUntilAWriteSucceeds", func(t *testing.T) {
		lb, lines, h, s, fill := setup(t)
		run := lb.SubmitRun(t, "k1", ledger.BudgetLimits{})
		require.NoError(t, h.Err())
		require.Nil(t, h.recoveredC())
		fill(true)
		_, err := s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.Error(t, err)
		require.ErrorContains(t, h.Err(), "store writes failing since 2026-01-02T03:04:05Z (1 failed): transition run: ")
		require.ErrorContains(t, h.Err(), "database or disk is full")
		ok := h.recoveredC()
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

		// Calls that succeed without writing prove nothing either.
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
		require.False(t, h.probeDue(), "nothing failing")
		fill(true)
		_, err := s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.Error(t, err)
		lb.Clock.Advance(time.Second)
		require.False(t, h.probeDue(), "within Hold of the failure")
		lb.Clock.Advance(time.Second)
		require.True(t, h.probeDue())
		require.ErrorContains(t, s.ProbeWrite(ctx), "database or disk is full", "the probe is a real write")
		require.EqualValues(t, 1, h.Errors()["probe_write"])
		require.False(t, h.probeDue(), "its failure starts Hold again")
		require.Error(t, h.Err())

		fill(false)
		lb.Clock.Advance(2 * time.Second)
		require.True(t, h.probeDue())
		require.NoError(t, s.ProbeWrite(ctx))
		require.NoError(t, h.Err(), "the probe wrote: sound")
		require.False(t, h.probeDue())
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
		require.True(t, IsStoreFailure(err))
		require.EqualValues(t, 1, h.Errors()["find_runs"])
		require.NoError(t, h.Err(), "readiness reads for itself")
	})

	t.Run("EveryOpCountedFromZero", func(t *testing.T) {
		_, _, h, _, _ := setup(t)
		errs := h.Errors()
		require.Len(t, errs, len(StoreOps()))
		for _, op := range StoreOps() {
			require.Contains(t, errs, op)
			require.Zero(t, errs[op])
		}
	})

	t.Run("WatchTwiceCountsOnce", func(t *testing.T) {
		lb, _, h, s, fill := setup(t)
		run := lb.SubmitRun(t, "k1", ledger.BudgetLimits{})
		require.Same(t, s, h.Watch(s))
		fill(true)
		_, err := h.Watch(s).TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
		require.Error(t, err)
		require.EqualValues(t, 1, h.Errors()["transition_run"])
	})

	t.Run("CancelledIsNoFailure", func(t *testing.T) {
		require.False(t, IsStoreFailure(nil))
		require.False(t, IsStoreFailure(context.Canceled))
		require.False(t, IsStoreFailure(ledger.Errorf(ledger.CodeInternal, "begin: %w", context.DeadlineExceeded)))
		require.False(t, IsStoreFailure(ledger.ErrConflict))
		require.True(t, IsStoreFailure(errors.New("disk I/O error")))
	})
}
