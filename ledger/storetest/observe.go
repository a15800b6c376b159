package storetest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

// opKinds is what the suite observed of each operation, by name: whether
// it was seen as a write, as a read, or both.
type opKinds struct {
	mu    sync.Mutex
	kinds map[string]map[bool]bool // name → write → seen
}

func (k *opKinds) observe(_ context.Context, op ledger.Op) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.kinds[op.Name] == nil {
		k.kinds[op.Name] = map[bool]bool{}
	}
	k.kinds[op.Name][op.Write] = true
}

// observeAll makes every Store the suite opens through h (and through the
// DB its Open returns) tell seen of its operations, besides the observer
// a test asks for.
func observeAll(h *Harness) *opKinds {
	seen := &opKinds{kinds: map[string]map[bool]bool{}}
	withSeen := func(opts Options) Options {
		mine := opts.Observe
		opts.Observe = func(ctx context.Context, op ledger.Op) {
			seen.observe(ctx, op)
			if mine != nil {
				mine(ctx, op)
			}
		}
		return opts
	}
	open := h.Open
	h.Open = func(tb testing.TB, opts Options) (ledger.Store, DB, error) {
		s, db, err := open(tb, withSeen(opts))
		if db.Open != nil {
			reopen := db.Open
			db.Open = func(tb testing.TB, opts Options) (ledger.Store, error) { return reopen(tb, withSeen(opts)) }
		}
		return s, db, err
	}
	return seen
}

// checkEveryOpObserved checks, once the whole suite has passed, that the
// Store told its observer of every operation it has (ledger.StoreOps,
// read from the Store interface: no list here either), under its
// method's name, a read for a Find…, Count… or Verify… method and a write
// for any other. A method the Store gains is checked as soon as it is
// there: it fails here until the suite calls it and it runs through the
// store's runners (DB.inTx, DB.planned, read), and a driver whose
// OpenStore drops Options.Observe fails it whole.
func checkEveryOpObserved(t *testing.T, seen *opKinds) {
	t.Helper()
	seen.mu.Lock()
	defer seen.mu.Unlock()
	ops := ledger.StoreOps()
	require.NotEmpty(t, seen.kinds, "no operation observed: the driver's OpenStore must pass Observe to ledger.Options")
	for _, name := range slices.Sorted(maps.Keys(seen.kinds)) {
		require.Contains(t, ops, name, "observed an operation that is no Store method's name")
	}
	var never []string
	for _, name := range ops {
		kinds, ok := seen.kinds[name]
		if !ok {
			never = append(never, name)
			continue
		}
		write := !strings.HasPrefix(name, "find_") && !strings.HasPrefix(name, "count_") && !strings.HasPrefix(name, "verify_")
		require.Equal(t, map[bool]bool{write: true}, kinds, "%s: observed as a write (true) or a read (false)", name)
	}
	require.Empty(t, never, "never observed: call them in the suite, through the store's runners "+
		"(a -run that filters the suite's subtests may also leave one uncalled)")
}

// testObservedWrites: the observer is told of each operation once, with
// its error, and of whether a write changed anything. A write that
// succeeds without changing anything (a replayed submit, a duplicate
// action, an expiry pass with nothing due, a claim of no run) and a write
// the domain refused say so; a read never wrote.
func testObservedWrites(t *testing.T, h Harness) {
	ctx := context.Background()
	var mu sync.Mutex
	var got []ledger.Op
	b := openWith(t, h, Options{Observe: func(_ context.Context, op ledger.Op) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, op)
	}}, ledgertest.NewClock())
	// last returns the one operation observed since the previous call.
	last := func(t *testing.T) ledger.Op {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, got, 1, "one observation per call: %+v", got)
		op := got[0]
		got = nil
		return op
	}

	submit := submitAs("alice", "k1")
	res, err := b.Store.SubmitRun(ctx, submit)
	require.NoError(t, err)
	require.Equal(t, ledger.Op{Name: "submit_run", Write: true, Wrote: true}, last(t))
	_, err = b.Store.SubmitRun(ctx, submit)
	require.NoError(t, err)
	require.Equal(t, ledger.Op{Name: "submit_run", Write: true}, last(t), "a replay changed nothing")

	_, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: res.Run.ID, From: ledger.RunRunning, To: ledger.RunAwaitingApproval, Actor: "t"})
	require.ErrorIs(t, err, ledger.ErrConflict)
	op := last(t)
	require.Equal(t, "transition_run", op.Name)
	require.True(t, op.Write)
	require.False(t, op.Wrote)
	require.True(t, errors.Is(op.Err, ledger.ErrConflict), "the caller's error: %v", op.Err)
	_, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: res.Run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "t"})
	require.NoError(t, err)
	require.Equal(t, ledger.Op{Name: "transition_run", Write: true, Wrote: true}, last(t))

	require.False(t, b.Action(t, res.Run.ID, "step-1", ledger.ActionAwaitingApproval).Duplicate)
	require.Equal(t, ledger.Op{Name: "create_action", Write: true, Wrote: true}, last(t))
	require.True(t, b.Action(t, res.Run.ID, "step-1", ledger.ActionAwaitingApproval).Duplicate)
	require.Equal(t, ledger.Op{Name: "create_action", Write: true}, last(t), "a duplicate changed nothing")

	expired, err := b.Store.ExpireApprovals(ctx)
	require.NoError(t, err)
	require.Empty(t, expired)
	require.Equal(t, ledger.Op{Name: "expire_approvals", Write: true}, last(t), "nothing due: no write, still one operation")

	leases, err := b.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "p1", TTL: 10 * time.Second, Limit: 5,
		States: []ledger.RunState{ledger.RunQueued}})
	require.NoError(t, err)
	require.Empty(t, leases)
	require.Equal(t, ledger.Op{Name: "claim_runs", Write: true}, last(t), "no run claimed")
	leases, err = b.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "p1", TTL: 10 * time.Second, Limit: 5,
		States: []ledger.RunState{ledger.RunRunning}})
	require.NoError(t, err)
	require.Len(t, leases, 1)
	require.Equal(t, ledger.Op{Name: "claim_runs", Write: true, Wrote: true}, last(t), "a lease is a row outside the chains")

	require.NoError(t, b.Store.ProbeWrite(ctx))
	require.Equal(t, ledger.Op{Name: "probe_write", Write: true, Wrote: true}, last(t))

	_, err = b.Store.FindRunByID(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.Op{Name: "find_run_by_id"}, last(t))
	_, err = b.Store.VerifyChain(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.Op{Name: "verify_chain"}, last(t), "not the find_chain it reads through")

	_, err = b.Store.CreateAction(ctx, ledger.CreateActionParams{RunID: res.Run.ID})
	require.Error(t, err)
	mu.Lock()
	defer mu.Unlock()
	for _, op := range got {
		require.Equal(t, "create_action", op.Name, "a call refused before the database is at most its own operation")
	}
}
