package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
)

// writeLog records what a WriteFaultFunc is called with.
type writeLog struct {
	mu    sync.Mutex
	calls []string
	// durable, when set, reads the store at each point: whether the run
	// being submitted is visible to another connection yet.
	durable func() bool
	seen    []bool
	// fail, when set, is what the hook answers.
	fail func(n int64, at ledger.WritePoint) error
}

func (l *writeLog) hook(n int64, at ledger.WritePoint) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, fmt.Sprintf("%d %s", n, at))
	if l.durable != nil {
		l.seen = append(l.seen, l.durable())
	}
	if l.fail != nil {
		return l.fail(n, at)
	}
	return nil
}

func openWithHook(t *testing.T, l *writeLog) *ledger.DB {
	t.Helper()
	clock := ledgertest.NewClock()
	s, err := sqlite.OpenStore(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "ledger.db"), Now: clock.Now,
		WriteFaultFunc: l.hook})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func submit(ctx context.Context, s ledger.Store, key string) (ledger.SubmitRunResult, error) {
	return s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: key, Principal: "alice",
		Agent: "practice-cards", Input: []byte(`{"title":"t"}`)})
}

// TestWriteFaultFunc: the fault plan's hook sees every write once at each
// point, numbered from 1 in the order the writes run, failed writes
// included; before_commit comes before the commit (another connection does
// not see the write yet), after_commit after it (it does).
func TestWriteFaultFunc(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		ctx := context.Background()
		l := &writeLog{}
		s := openWithHook(t, l)
		l.durable = func() bool {
			runs, err := s.FindRuns(ctx, ledger.RunFilter{Tenant: ptr("acme")})
			require.NoError(t, err)
			return len(runs) > 0
		}
		res, err := submit(ctx, s, "k1")
		require.NoError(t, err)
		_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: res.Run.ID, From: ledger.RunQueued, To: ledger.RunRunning})
		require.NoError(t, err)
		_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: res.Run.ID, From: ledger.RunQueued, To: ledger.RunRunning})
		require.ErrorIs(t, err, ledger.ErrConflict, "a write that fails is still a write")
		require.Equal(t, []string{"1 before_commit", "1 after_commit", "2 before_commit", "2 after_commit",
			"3 before_commit", "3 after_commit"}, l.calls)
		require.Equal(t, []bool{false, true, true, true, true, true}, l.seen,
			"the first write is visible only after its commit")
	})

	t.Run("Concurrent", func(t *testing.T) {
		ctx := context.Background()
		l := &writeLog{}
		s := openWithHook(t, l)
		const n = 50
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				_, err := submit(ctx, s, fmt.Sprintf("k%d", i))
				require.NoError(t, err)
			})
		}
		wg.Wait()
		// Writes sharing a commit are numbered one by one; each number is
		// seen before its commit, then after it, and never again.
		state := map[string]string{}
		for _, c := range l.calls {
			var num int64
			var at ledger.WritePoint
			_, err := fmt.Sscanf(c, "%d %s", &num, &at)
			require.NoError(t, err)
			key := fmt.Sprint(num)
			switch at {
			case ledger.WriteBeforeCommit:
				require.Empty(t, state[key], "write %d seen twice before its commit", num)
			case ledger.WriteAfterCommit:
				require.Equal(t, "before", state[key], "write %d after its commit without before it", num)
			}
			state[key] = map[ledger.WritePoint]string{ledger.WriteBeforeCommit: "before", ledger.WriteAfterCommit: "after"}[at]
		}
		require.Len(t, state, n)
		for i := 1; i <= n; i++ {
			require.Equal(t, "after", state[fmt.Sprint(i)], "write %d", i)
		}
	})

	t.Run("ErrFailsTheWriteAlone", func(t *testing.T) {
		// A failure asked for before the commit fails that write, as a
		// full disk would, and none of the others sharing its commit; one
		// asked for after the commit changes nothing.
		ctx := context.Background()
		l := &writeLog{fail: func(n int64, at ledger.WritePoint) error {
			if n%2 == 0 || at == ledger.WriteAfterCommit {
				return fmt.Errorf("disk full")
			}
			return nil
		}}
		s := openWithHook(t, l)
		const n = 40
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			failed int
		)
		for i := range n {
			wg.Go(func() {
				_, err := submit(ctx, s, fmt.Sprintf("k%d", i))
				if err != nil {
					require.Equal(t, ledger.CodeInternal, ledger.Code(err), "%v", err)
					require.ErrorContains(t, err, "disk full")
					mu.Lock()
					failed++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		runs, err := s.FindRuns(ctx, ledger.RunFilter{Tenant: ptr("acme")})
		require.NoError(t, err)
		require.Equal(t, n/2, failed, "every even-numbered write failed")
		require.Len(t, runs, n-failed, "exactly the writes answered without error are stored")
		for _, r := range runs {
			chain, err := s.VerifyChain(ctx, r.ID)
			require.NoError(t, err)
			require.True(t, chain.OK, "%+v", chain)
		}
	})

	t.Run("Nil", func(t *testing.T) {
		b := ledgertest.OpenStore(t)
		_, err := submit(context.Background(), b.Store, "k1")
		require.NoError(t, err, "no hook, no fault")
	})
}
func ptr[T any](v T) *T { return &v }
