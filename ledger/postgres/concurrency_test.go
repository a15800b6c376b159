package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

// Concurrency of the driver under the ledger's own rules: what a worker
// pool does to a run (submit it, record an action and start its attempt in
// one write, finish the attempt), from many goroutines at once, on a fresh
// database (whose tables are small, where SERIALIZABLE's predicate locks
// cover whole tables and made writes of unrelated runs fail each other).

// tries counts the transactions of a Driver: those that committed and
// those that failed (each failed one is a write run again, or given up).
type tries struct{ committed, failed atomic.Int64 }

func (c *tries) onCommit(s ledger.CommitStats) {
	if s.Err != nil {
		c.failed.Add(1)
	} else {
		c.committed.Add(1)
	}
}

// openCounted opens a Store on a fresh schema whose transactions c
// counts.
func openCounted(t *testing.T, c *tries) *ledger.DB {
	t.Helper()
	s, err := postgres.OpenStore(context.Background(), postgres.Config{DSN: pgtest.NewSchema(t), OnCommit: c.onCommit})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// doAction records an auto-approved action of run, starting its attempt
// in the same write, then finishes the attempt: two writes.
func doAction(ctx context.Context, s *ledger.DB, run ledger.RunID, key string) error {
	res, err := s.CreateAction(ctx, ledger.CreateActionParams{RunID: run, IdempotencyKey: key, Tool: "cards.write",
		ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"card":"` + key + `"}`),
		Gate: ledger.ActionApproved, StartAttempt: true, Actor: "engine", Usage: &ledger.AddUsageParams{Steps: 1, Tokens: 3}})
	if err != nil {
		return fmt.Errorf("create action %s: %w", key, err)
	}
	if res.StartErr != nil {
		return fmt.Errorf("start attempt of %s: %w", key, res.StartErr)
	}
	if _, err := s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: res.Attempt.ID, Status: ledger.AttemptSucceeded,
		Result: json.RawMessage(`{"ok":true}`), Actor: "engine",
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened}}); err != nil {
		return fmt.Errorf("finish attempt of %s: %w", key, err)
	}
	return nil
}

// requireRunIntact checks that run has actions succeeded actions, each
// with one finished attempt, its budget counting them all, and a chain
// that verifies.
func requireRunIntact(t *testing.T, s *ledger.DB, run ledger.RunID, actions int) {
	t.Helper()
	ctx := context.Background()
	acts, err := s.FindActions(ctx, ledger.ActionFilter{RunID: &run})
	require.NoError(t, err)
	require.Len(t, acts, actions, "run %s: no action lost", run)
	for i, a := range acts {
		require.Equal(t, ledger.ActionSucceeded, a.State, "action %s", a.ID)
		require.Equal(t, int64(i+1), a.Seq, "action sequence numbers run 1, 2, 3…")
	}
	atts, err := s.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run})
	require.NoError(t, err)
	require.Len(t, atts, actions)
	for _, a := range atts {
		require.Equal(t, ledger.AttemptSucceeded, a.Status, "attempt %s", a.ID)
	}
	r, err := s.FindRunByID(ctx, run)
	require.NoError(t, err)
	require.Equal(t, int64(actions), r.Budget.Used.Attempts, "every attempt counted")
	require.Equal(t, int64(actions), r.Budget.Used.Steps, "every step counted")
	rep, err := s.VerifyChain(ctx, run)
	require.NoError(t, err)
	require.True(t, rep.OK, "run %s: %s at %d", run, rep.Reason, rep.BrokenSeq)
}

func TestConcurrentWritesOfDistinctRunsNeverFailEachOther(t *testing.T) {
	const (
		goroutines = 16
		rounds     = 3 // runs per goroutine, one after another
	)
	var c tries
	s := openCounted(t, &c)
	ctx := context.Background()
	runs := make([][]ledger.RunID, goroutines)
	errs := make([]error, goroutines)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for i := range rounds {
				res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: fmt.Sprintf("g%d-r%d", g, i),
					Principal: "alice", Agent: "support", Input: json.RawMessage(`{}`), Start: true})
				if err != nil {
					errs[g] = fmt.Errorf("submit: %w", err)
					return
				}
				runs[g] = append(runs[g], res.Run.ID)
				if err := doAction(ctx, s, res.Run.ID, "step-1"); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	// Three writes per run, each one commit when nothing fails.
	require.Equal(t, int64(goroutines*rounds*3), c.committed.Load())
	// Writes of different runs share no lock: none waits for, or fails,
	// another. SERIALIZABLE failed here hundreds of times.
	require.LessOrEqual(t, c.failed.Load(), int64(2), "transactions run again: %d for %d commits",
		c.failed.Load(), c.committed.Load())
	for _, rs := range runs {
		for _, run := range rs {
			requireRunIntact(t, s, run, 1)
		}
	}
}

func TestConcurrentWritesOfOneRunQueueAndLoseNothing(t *testing.T) {
	const (
		goroutines = 8
		actions    = 4 // per goroutine
	)
	var c tries
	s := openCounted(t, &c)
	ctx := context.Background()
	res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "one", Principal: "alice",
		Agent: "support", Input: json.RawMessage(`{}`), Start: true})
	require.NoError(t, err)
	run := res.Run.ID
	errs := make([]error, goroutines)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for i := range actions {
				if err := doAction(ctx, s, run, fmt.Sprintf("g%d-s%d", g, i)); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	// The run's lock queues its writes: each commits at its first try.
	require.Equal(t, int64(1+goroutines*actions*2), c.committed.Load())
	require.LessOrEqual(t, c.failed.Load(), int64(2), "transactions run again: %d for %d commits",
		c.failed.Load(), c.committed.Load())
	requireRunIntact(t, s, run, goroutines*actions)
}
