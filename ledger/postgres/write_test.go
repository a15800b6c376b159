package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

// barrier lets n goroutines wait until all have arrived.
type barrier struct {
	wg  sync.WaitGroup
	all chan struct{}
}

func newBarrier(n int) *barrier {
	b := &barrier{all: make(chan struct{})}
	b.wg.Add(n)
	go func() { b.wg.Wait(); close(b.all) }()
	return b
}

// arrive waits for the others, at most 10 s.
func (b *barrier) arrive() error {
	b.wg.Done()
	select {
	case <-b.all:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("the other writer never arrived")
	}
}

// leaseFixture is a database with one attempt lease, att_1.
func leaseFixture(t *testing.T, cfg postgres.Config) *fixture {
	t.Helper()
	f := open(t, cfg)
	f.seed(t)
	f.write(t, func(tx ledger.Tx) error {
		return tx.InsertAttemptLease(context.Background(), &ledger.AttemptLease{AttemptID: "att_1", ActionID: "act_1", RunID: "run_1",
			BeginKey: "b", TokenSHA256: hexHash("t"), Lease: time.Second, Until: t0, MaxUntil: t0.Add(time.Hour)})
	})
	return f
}

// waitForLockWaiter waits, at most 10 s, until a session of the test
// waits for a lock: one with raw's application_name, which pgtest.NewSchema
// makes the schema's, as other tests share the database.
func waitForLockWaiter(ctx context.Context, raw *sql.DB) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := raw.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = current_setting('application_name')
			AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("no write ever waited for a lock")
}

// heartbeat is a read-then-write with a blind write: it reads the lease's
// heartbeats, then writes them plus one, and records an observation of
// its own. Under READ COMMITTED alone, two of them reading before either
// writes would lose one heartbeat; the run's lock, taken by the read,
// makes the second read wait for the first write's commit. before runs
// in the first run of fn, between the read and the writes.
func heartbeat(ctx context.Context, d *postgres.Driver, who string, runs *atomic.Int32, before func() error) error {
	first := true
	return d.Write(ctx, func(tx ledger.Tx) error {
		runs.Add(1)
		l, err := tx.GetAttemptLease(ctx, "att_1")
		if err != nil {
			return err
		}
		if first && before != nil {
			first = false
			if err := before(); err != nil {
				return err
			}
		}
		if err := tx.InsertObservation(ctx, &ledger.Observation{ID: ledger.ObservationID("obs_" + who), RunID: "run_1",
			ActionID: "act_1", Source: ledger.ObservedPerson, Effect: ledger.EffectUnknown, ObservedAt: t0}); err != nil {
			return err
		}
		l.Heartbeats++
		return tx.UpdateAttemptLease(ctx, l)
	})
}

func TestWritesOfOneRunWaitForEachOtherAndLoseNoUpdate(t *testing.T) {
	f := leaseFixture(t, postgres.Config{})
	ctx := context.Background()
	var runs atomic.Int32
	aRead := make(chan struct{})
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() {
		// a has read (and so locked run_1): it writes only once b waits.
		errs[0] = heartbeat(ctx, f.d, "a", &runs, func() error {
			close(aRead)
			return waitForLockWaiter(ctx, f.raw)
		})
	})
	wg.Go(func() {
		<-aRead
		errs[1] = heartbeat(ctx, f.d, "b", &runs, nil)
	})
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	l, err := f.d.Reader().GetAttemptLease(ctx, "att_1")
	require.NoError(t, err)
	require.Equal(t, int64(2), l.Heartbeats, "both writes counted: no lost update")
	require.Equal(t, int32(2), runs.Load(), "b waited for a instead of failing and running again")
	require.Equal(t, 2, f.count(t, "observations"))
}

// crossWrite reads two runs in the order given, meeting the other writer
// between the two reads at its first run, then counts an attempt on each:
// two of them in opposite orders deadlock.
func crossWrite(ctx context.Context, d *postgres.Driver, first, second ledger.RunID, b *barrier, runs *atomic.Int32) error {
	met := false
	return d.Write(ctx, func(tx ledger.Tx) error {
		runs.Add(1)
		if _, err := tx.GetRun(ctx, first); err != nil {
			return err
		}
		if !met {
			met = true
			if err := b.arrive(); err != nil {
				return err
			}
		}
		if _, err := tx.GetRun(ctx, second); err != nil {
			return err
		}
		if err := tx.CountAttempt(ctx, first); err != nil {
			return err
		}
		return tx.CountAttempt(ctx, second)
	})
}

// twoRunsFixture is a database with run_1 and run_2, one attempt used
// on each.
func twoRunsFixture(t *testing.T, cfg postgres.Config) *fixture {
	t.Helper()
	f := open(t, cfg)
	f.seed(t)
	f.write(t, func(tx ledger.Tx) error {
		r := newRun("run_2")
		r.IdempotencyKey = "k2"
		return tx.InsertRun(context.Background(), r)
	})
	return f
}

// attemptsUsed is the attempts a run's budget counts.
func (f *fixture) attemptsUsed(t *testing.T, run string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, f.raw.QueryRow(`SELECT attempts_used FROM budgets WHERE run_id = $1`, run).Scan(&n))
	return n
}

func TestWriteRunsADeadlockAgain(t *testing.T) {
	f := twoRunsFixture(t, postgres.Config{})
	ctx := context.Background()
	b := newBarrier(2)
	var runs atomic.Int32
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = crossWrite(ctx, f.d, "run_1", "run_2", b, &runs) })
	wg.Go(func() { errs[1] = crossWrite(ctx, f.d, "run_2", "run_1", b, &runs) })
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, int32(3), runs.Load(), "the deadlock's victim ran again, once")
	require.Equal(t, int64(3), f.attemptsUsed(t, "run_1"), "both writes counted")
	require.Equal(t, int64(3), f.attemptsUsed(t, "run_2"), "both writes counted")
}

func TestWriteGivesUpWithConflictAfterItsLastAttempt(t *testing.T) {
	f := twoRunsFixture(t, postgres.Config{WriteAttempts: 1})
	ctx := context.Background()
	b := newBarrier(2)
	var runs atomic.Int32
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = crossWrite(ctx, f.d, "run_1", "run_2", b, &runs) })
	wg.Go(func() { errs[1] = crossWrite(ctx, f.d, "run_2", "run_1", b, &runs) })
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	require.Len(t, failed, 1, "one committed, one lost: %v", errs)
	requireCode(t, ledger.CodeConflict, failed[0])
	require.Equal(t, "40P01", sqlstate(t, failed[0]))
	require.Equal(t, int32(2), runs.Load(), "no run beyond the one attempt each")
	require.Equal(t, int64(2), f.attemptsUsed(t, "run_1"), "the committed write alone")
	require.Equal(t, int64(2), f.attemptsUsed(t, "run_2"), "the committed write alone")
}

func TestWriteNeverCommitsAfterAFailedStatement(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	err := f.d.Write(ctx, func(tx ledger.Tx) error {
		r2 := newRun("run_2")
		r2.IdempotencyKey = "k2"
		require.NoError(t, tx.InsertRun(ctx, r2))
		dup := tx.InsertRun(ctx, newRun("run_1"))
		requireCode(t, ledger.CodeConflict, dup)
		// PostgreSQL aborted the transaction: every later call says why.
		_, err := tx.GetRun(ctx, "run_2")
		requireCode(t, ledger.CodeConflict, err)
		require.ErrorContains(t, err, "aborted")
		return nil // fn swallows the failure
	})
	requireCode(t, ledger.CodeConflict, err)
	require.Equal(t, 1, f.count(t, "runs"), "run_2 was not committed")
}

func TestWriteReturnsTheRulesErrorsAsTheyAreAndRollsBack(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	refusal := ledger.Errorf(ledger.CodeBudgetExceeded, "run %s used its attempts", "run_1")
	err := f.d.Write(ctx, func(tx ledger.Tx) error {
		require.NoError(t, tx.InsertRun(ctx, newRun("run_1")))
		return refusal
	})
	require.Same(t, refusal, err)

	plain := errors.New("something else")
	err = f.d.Write(ctx, func(tx ledger.Tx) error { return plain })
	requireCode(t, ledger.CodeInternal, err)
	require.ErrorIs(t, err, plain)
	require.Equal(t, 0, f.count(t, "runs"))
}

func TestWriteRollsBackWhenFnPanics(t *testing.T) {
	f := open(t, postgres.Config{MaxConns: 1})
	ctx := context.Background()
	require.Panics(t, func() {
		_ = f.d.Write(ctx, func(tx ledger.Tx) error {
			require.NoError(t, tx.InsertRun(ctx, newRun("run_1")))
			panic("bug")
		})
	})
	// The only connection went back to the pool, and nothing was kept.
	f.write(t, func(tx ledger.Tx) error {
		_, err := tx.GetRun(ctx, "run_1")
		requireCode(t, ledger.CodeNotFound, err)
		return nil
	})
}

func TestWriteOnADoneContextRunsNothing(t *testing.T) {
	f := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err := f.d.Write(ctx, func(ledger.Tx) error { ran = true; return nil })
	requireCode(t, ledger.CodeInternal, err)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ran)
}

func TestReadIsOneSnapshotAndTheReaderIsNot(t *testing.T) {
	f := open(t, postgres.Config{MaxConns: 4})
	ctx := context.Background()
	f.seed(t)
	err := f.d.Read(ctx, func(r ledger.Reader) error {
		runs, err := r.ListRuns(ctx, ledger.RunFilter{})
		require.NoError(t, err)
		require.Len(t, runs, 1)
		r2 := newRun("run_2")
		r2.IdempotencyKey = "k2"
		f.write(t, func(tx ledger.Tx) error { return tx.InsertRun(ctx, r2) })

		runs, err = r.ListRuns(ctx, ledger.RunFilter{})
		require.NoError(t, err)
		require.Len(t, runs, 1, "the snapshot does not move")
		_, err = r.GetRun(ctx, "run_2")
		requireCode(t, ledger.CodeNotFound, err)

		runs, err = f.d.Reader().ListRuns(ctx, ledger.RunFilter{})
		require.NoError(t, err)
		require.Len(t, runs, 2, "the pool sees what was committed")
		return nil
	})
	require.NoError(t, err)

	refusal := ledger.Errorf(ledger.CodeForbidden, "no")
	require.Same(t, refusal, f.d.Read(ctx, func(ledger.Reader) error { return refusal }))
}

func TestIDsSortByteByByteWhateverTheDatabaseCollation(t *testing.T) {
	// In an en-US collation "run_a" sorts before "run_B"; the ledger's
	// cursors and "in id order" are byte order, as on SQLite.
	dsn := pgtest.NewDatabase(t, "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'")
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer func() { _ = raw.Close() }()
	var natural bool
	require.NoError(t, raw.QueryRow(`SELECT 'run_a' < 'run_B'`).Scan(&natural))
	require.True(t, natural, "the database's own collation is not byte order")

	f := openOn(t, dsn)
	ctx := context.Background()
	f.write(t, func(tx ledger.Tx) error {
		for _, id := range []string{"run_a", "run_B"} {
			if err := tx.InsertRun(ctx, newRun(id)); err != nil {
				return err
			}
		}
		return nil
	})
	runs, err := f.d.Reader().ListRuns(ctx, ledger.RunFilter{})
	require.NoError(t, err)
	require.Equal(t, []ledger.RunID{"run_B", "run_a"}, ids(runs))
	after := ledger.RunID("run_B")
	runs, err = f.d.Reader().ListRuns(ctx, ledger.RunFilter{AfterID: &after})
	require.NoError(t, err)
	require.Equal(t, []ledger.RunID{"run_a"}, ids(runs))
}

func ids(runs []*ledger.Run) []ledger.RunID {
	out := make([]ledger.RunID, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}

func TestConcurrentWritesOfOneRowAllCommit(t *testing.T) {
	// Many writers moving one run's chain head, each read then guarded
	// write: the run's lock queues them, and every one commits.
	f := open(t, postgres.Config{WriteAttempts: 50})
	ctx := context.Background()
	f.seed(t)
	const writers = 8
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		wg.Go(func() {
			errs[i] = f.d.Write(ctx, func(tx ledger.Tx) error {
				seq, _, err := tx.ChainHead(ctx, "run_1")
				if err != nil {
					return err
				}
				moved, err := tx.MoveChainHead(ctx, "run_1", seq, seq+1, fmt.Sprintf("sha256:%d", i))
				if err != nil {
					return err
				}
				if !moved {
					return errors.New("the head moved between the read and the write")
				}
				return nil
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	seq, _, err := f.d.Reader().ChainHead(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, int64(writers), seq)
}

func TestWriteRunsAgainOnceAfterAUniqueViolation(t *testing.T) {
	// Two writers check that a request identity is free, then insert it:
	// the check reads runs_tenant_submitter, not the unique index, so the
	// loser is told 23505 rather than 40001. Run again, it finds the
	// winner's run.
	f := open(t)
	ctx := context.Background()
	b := newBarrier(2)
	var runs atomic.Int32
	created := make([]bool, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, id := range []string{"run_a", "run_b"} {
		wg.Go(func() {
			first := true
			errs[i] = f.d.Write(ctx, func(tx ledger.Tx) error {
				runs.Add(1)
				created[i] = false
				r := newRun(id)
				r.IdempotencyKey = "same"
				_, err := tx.GetRunByRequest(ctx, r.Tenant, r.SubmittedBy, r.IdempotencyKey)
				if first {
					first = false
					if err := b.arrive(); err != nil {
						return err
					}
				}
				switch {
				case err == nil:
					return nil // a replay
				case ledger.Code(err) != ledger.CodeNotFound:
					return err
				}
				created[i] = true
				return tx.InsertRun(ctx, r)
			})
		})
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.NotEqual(t, created[0], created[1], "one created the run, the other found it")
	require.Equal(t, int32(3), runs.Load())
	require.Equal(t, 1, f.count(t, "runs"))

	// A key that is really taken fails again, and is CodeConflict.
	runs.Store(0)
	err := f.d.Write(ctx, func(tx ledger.Tx) error {
		runs.Add(1)
		r := newRun("run_c")
		r.IdempotencyKey = "same"
		return tx.InsertRun(ctx, r)
	})
	requireCode(t, ledger.CodeConflict, err)
	require.Equal(t, "23505", sqlstate(t, err))
	require.Equal(t, int32(2), runs.Load(), "run again once, not more")
}

func TestWriteTellsOnCommitAndTheFaultPlan(t *testing.T) {
	type call struct {
		n  int64
		at ledger.WritePoint
	}
	var (
		mu    sync.Mutex
		calls []call
		stats []ledger.CommitStats
	)
	boom := errors.New("disk full")
	f := open(t, postgres.Config{
		OnCommit: func(s ledger.CommitStats) { mu.Lock(); stats = append(stats, s); mu.Unlock() },
		WriteFaultFunc: func(n int64, at ledger.WritePoint) error {
			mu.Lock()
			calls = append(calls, call{n, at})
			mu.Unlock()
			switch {
			case n == 2:
				return boom // fails write 2 before its commit
			case at == ledger.WriteAfterCommit:
				return errors.New("ignored after the commit")
			}
			return nil
		},
	})
	ctx := context.Background()
	insert := func(id string) func(ledger.Tx) error {
		return func(tx ledger.Tx) error {
			r := newRun(id)
			r.IdempotencyKey = id
			return tx.InsertRun(ctx, r)
		}
	}
	require.NoError(t, f.d.Write(ctx, insert("run_1")))
	err := f.d.Write(ctx, insert("run_2"))
	requireCode(t, ledger.CodeInternal, err)
	require.ErrorIs(t, err, boom)
	refusal := ledger.Errorf(ledger.CodeConflict, "no")
	require.Same(t, refusal, f.d.Write(ctx, func(ledger.Tx) error { return refusal }))

	runs, err := f.d.Reader().ListRuns(ctx, ledger.RunFilter{})
	require.NoError(t, err)
	require.Equal(t, []ledger.RunID{"run_1"}, ids(runs), "write 2 was rolled back")
	require.Equal(t, []call{{1, ledger.WriteBeforeCommit}, {1, ledger.WriteAfterCommit}, {2, ledger.WriteBeforeCommit}}, calls,
		"write 3 failed before the commit point")
	require.Len(t, stats, 3)
	for i, s := range stats {
		require.Equal(t, 1, s.Writes)
		require.Positive(t, s.Duration)
		if i == 0 {
			require.NoError(t, s.Err)
		} else {
			require.Error(t, s.Err, "write %d was not committed", i+1)
		}
	}
}

func TestOpenStore(t *testing.T) {
	dsn := pgtest.NewSchema(t)
	ctx := context.Background()
	s, err := postgres.OpenStore(ctx, postgres.Config{DSN: dsn, SigningKey: []byte("short")})
	requireCode(t, ledger.CodeInvalid, err)
	require.Nil(t, s)

	s, err = postgres.OpenStore(ctx, postgres.Config{DSN: dsn})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	require.Equal(t, postgres.SchemaVersion(), s.LatestSchemaVersion())
	v, err := s.CurrentSchemaVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, s.LatestSchemaVersion(), v)
}
