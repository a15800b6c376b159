package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// Run leases (ledger/runleases.go, docs/operations.md): the engine
// advances and recovers a run only while it holds the run's lease. Its
// leases are kept by runLeases: claimed by the pool (or the recovery scan,
// or AdvanceRunnable), renewed by a loop every third of the TTL, released
// when a worker returns the run. Work on a run runs with a context marked
// with the lease (ledger.WithRunLease), so the store refuses its writes
// once another process has claimed the run, and cancelled with
// errLeaseLost as soon as the engine learns it lost the lease: a renewal
// that no longer returns it, or renewals that failed until it lapsed.

// errLeaseLost is the cause of a context cancelled because the engine
// lost the run's lease.
var errLeaseLost = fmt.Errorf("engine: %w", ledger.ErrLeaseLost)

// Lease defaults.
const defaultLeaseTTL = 15 * time.Second

// runLeases are the run leases this engine holds.
type runLeases struct {
	e     *Engine
	owner string
	ttl   time.Duration

	mu   sync.Mutex
	held map[ledger.RunID]*heldLease
	// loops counts the renew loops running (keep); stopLoop stops the one
	// that runs.
	loops    int
	stopLoop context.CancelFunc
	loopDone chan struct{}

	status LeaseStatus
	// dead caches the owners of leases found dead (deadOwners), and when.
	dead     []string
	deadRead time.Time
}

// heldLease is one lease the engine holds.
type heldLease struct {
	lease ledger.RunLease
	// deadline is when the lease lapses at the earliest, on the engine's
	// clock: when the claim or renewal that granted it was sent, plus the
	// TTL it asked for. The store's Until is on the store's clock, which
	// need not be the engine's.
	deadline time.Time
	// cancel cancels the context of the work on the run, while there is
	// some (work).
	cancel context.CancelCauseFunc
}

// LeaseStatus is what the lease loop last did, for /readyz.
type LeaseStatus struct {
	// Owner is this process's name as a lease owner.
	Owner string
	// Held is how many run leases the process holds now.
	Held int
	// LastClaim and LastRenew are when a claim, and a renewal, last
	// succeeded, on the engine's clock; zero if none has yet.
	LastClaim, LastRenew time.Time
	// Err is the last claim's or renewal's error, until one succeeds.
	Err error
}

func newRunLeases(e *Engine, owner string, ttl time.Duration) *runLeases {
	return &runLeases{e: e, owner: owner, ttl: ttl, held: map[ledger.RunID]*heldLease{}, status: LeaseStatus{Owner: owner}}
}

// margin is how long a lease must outlast the longest write the engine
// may still make under it: a tool is called only while the lease outlasts
// the call's timeout by this much.
func (r *runLeases) margin() time.Duration { return r.ttl / 3 }

// noteErr records the outcome of a claim or renewal for Status.
func (r *runLeases) noteErr(err error, renew bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err != nil:
		r.status.Err = err
	case renew:
		r.status.LastRenew, r.status.Err = r.e.now(), nil
	default:
		r.status.LastClaim, r.status.Err = r.e.now(), nil
	}
}

// Status is what the lease loop last did.
func (r *runLeases) Status() LeaseStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.status
	s.Held = len(r.held)
	return s
}

// claim claims runs with p (its Owner is the engine's; a TTL shorter than
// the engine's is raised to it) and holds them. A run the engine held
// already, whose lease lapsed and which it has claimed anew, is held with
// the new lease: whoever worked under the old one has lost it.
func (r *runLeases) claim(ctx context.Context, p ledger.ClaimRunsParams) ([]ledger.RunLease, error) {
	got, _, err := r.claimThen(ctx, p, nil)
	return got, err
}

// claimWork claims one run's lease with ttl and starts work on it under
// the same lock (work), so that no pool pass can take the lease as idle in
// between; false if another holds the run.
func (r *runLeases) claimWork(ctx context.Context, run ledger.RunID, states []ledger.RunState, ttl time.Duration) (context.Context, func(), bool, error) {
	var wctx context.Context
	var end func()
	got, _, err := r.claimThen(ctx, ledger.ClaimRunsParams{Limit: 1, States: states, Runs: []ledger.RunID{run}, TTL: ttl},
		func(h *heldLease) { wctx, end = r.workLocked(ctx, run, h) })
	if err != nil || len(got) == 0 {
		return nil, nil, false, err
	}
	return wctx, end, true, nil
}

// claimThen claims p's runs and records their leases; then, if set, runs
// under the lock for each lease claimed.
func (r *runLeases) claimThen(ctx context.Context, p ledger.ClaimRunsParams, then func(*heldLease)) ([]ledger.RunLease, time.Time, error) {
	p.Owner, p.TTL, p.TakeOver = r.owner, max(p.TTL, r.ttl), r.deadOwners(ctx)
	sent := r.e.now()
	got, err := r.e.store.ClaimRuns(ledger.WithoutRunLease(ctx), p)
	if ctx.Err() == nil {
		r.noteErr(err, false)
	}
	if err != nil {
		return nil, sent, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range got {
		if old := r.held[l.Run]; old != nil && old.cancel != nil {
			old.cancel(errLeaseLost)
		}
		h := &heldLease{lease: l, deadline: sent.Add(p.TTL)}
		r.held[l.Run] = h
		if then != nil {
			then(h)
		}
	}
	return got, sent, nil
}

// deadOwners are the holders of leases that are processes of this host
// that no longer exist (ownerGone), whose runs the engine may claim at
// once instead of waiting for their leases to lapse: what a restarted
// process finds of the one that crashed. Read at most every third of the
// TTL.
func (r *runLeases) deadOwners(ctx context.Context) []string {
	if localOwnerPrefix() == "" {
		return nil
	}
	r.mu.Lock()
	if !r.deadRead.IsZero() && r.e.now().Sub(r.deadRead) < r.ttl/3 {
		defer r.mu.Unlock()
		return r.dead
	}
	r.mu.Unlock()
	owners, err := r.e.store.FindRunLeaseOwners(ctx)
	if err != nil {
		r.e.log.DebugContext(ctx, "find run lease owners", "err", err)
		return nil
	}
	var dead []string
	for _, o := range owners {
		if o != r.owner && ownerGone(o) {
			dead = append(dead, o)
		}
	}
	if len(dead) > 0 {
		r.e.log.InfoContext(ctx, "taking over the runs of lease holders that no longer run on this host", "owners", dead)
	}
	r.mu.Lock()
	r.dead, r.deadRead = dead, r.e.now()
	r.mu.Unlock()
	return dead
}

// idle lists the runs the engine holds that nobody works on, oldest
// first.
func (r *runLeases) idle() []ledger.RunID {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ledger.RunID
	for id, h := range r.held {
		if h.cancel == nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// work returns the context to work on run with, under its lease, and the
// function that ends that work; false if the engine does not hold the
// run's lease (it lost it).
func (r *runLeases) work(ctx context.Context, run ledger.RunID) (context.Context, func(), bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.held[run]
	if h == nil {
		return nil, nil, false
	}
	wctx, end := r.workLocked(ctx, run, h)
	return wctx, end, true
}

// workLocked starts work on run under h, r.mu held.
func (r *runLeases) workLocked(ctx context.Context, run ledger.RunID, h *heldLease) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(ledger.WithRunLease(ctx, h.lease))
	h.cancel = cancel
	return wctx, func() {
		r.mu.Lock()
		if cur := r.held[run]; cur == h {
			h.cancel = nil
		}
		r.mu.Unlock()
		cancel(nil)
	}
}

// release gives up run's lease, in the store too, so that any process may
// claim the run at once. It is written even when ctx is done (the pool
// stopping): the run is then at once another's to take.
func (r *runLeases) release(ctx context.Context, run ledger.RunID) { r.releaseToken(ctx, run, 0) }

// releaseToken is release, of the lease with token only (any, if 0).
func (r *runLeases) releaseToken(ctx context.Context, run ledger.RunID, token int64) {
	r.mu.Lock()
	h := r.held[run]
	if h != nil && token != 0 && h.lease.Token != token {
		h = nil
	}
	if h != nil {
		delete(r.held, run)
	}
	var (
		l    ledger.RunLease
		stop context.CancelCauseFunc
	)
	if h != nil {
		l, stop = h.lease, h.cancel
	}
	r.mu.Unlock()
	if h == nil {
		return
	}
	if stop != nil {
		stop(nil)
	}
	wctx, cancel := r.lateWrite(ctx)
	defer cancel()
	if err := r.e.store.ReleaseRunLease(wctx, l); err != nil {
		// It lapses on its own.
		r.e.log.WarnContext(ctx, "release run lease", "run", run, "err", err)
	}
}

// releaseIdle releases every lease nobody works on, at once (the store
// commits them together).
func (r *runLeases) releaseIdle(ctx context.Context) {
	var wg sync.WaitGroup
	for _, id := range r.idle() {
		wg.Go(func() { r.release(ctx, id) })
	}
	wg.Wait()
}

// lateWrite is the context of a write made after ctx may have ended (a
// release, a stale holder's evidence): not cancelled with it, without a
// lease, and bounded.
func (r *runLeases) lateWrite(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ledger.WithoutRunLease(context.WithoutCancel(ctx)), max(r.ttl, 10*time.Second))
}

// lose forgets run's lease, the engine having lost it, and cancels the
// work on it.
func (r *runLeases) lose(run ledger.RunID, h *heldLease) {
	if cur := r.held[run]; cur != h {
		return
	}
	delete(r.held, run)
	if h.cancel != nil {
		h.cancel(errLeaseLost)
	}
	r.e.log.Warn("lost the lease of a run: another process may advance it", "run", run, "token", h.lease.Token)
}

// renew renews every lease the engine holds. One the store no longer
// returns is lost; if the renewal fails, every lease that would lapse
// before the next renewal is given up too, since another process may claim
// it then.
func (r *runLeases) renew(ctx context.Context) error {
	r.mu.Lock()
	held := make(map[ledger.RunID]*heldLease, len(r.held))
	leases := make([]ledger.RunLease, 0, len(r.held))
	for id, h := range r.held {
		held[id] = h
		leases = append(leases, h.lease)
	}
	r.mu.Unlock()
	sent := r.e.now()
	got, err := r.e.store.RenewRunLeases(ledger.WithoutRunLease(ctx), r.owner, leases, r.ttl)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.noteErr(err, true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		// A lease that would lapse before the next renewal may be another
		// process's by then: stop working under it now.
		for id, h := range held {
			if r.held[id] == h && r.remainingLocked(h) < r.ttl/3 {
				r.lose(id, h)
			}
		}
		return err
	}
	kept := make(map[ledger.RunID]ledger.RunLease, len(got))
	for _, l := range got {
		kept[l.Run] = l
	}
	for id, h := range held {
		if r.held[id] != h {
			continue // released or claimed anew meanwhile
		}
		l, ok := kept[id]
		if !ok || l.Token != h.lease.Token {
			r.lose(id, h)
			continue
		}
		h.lease.Until = l.Until
		h.deadline = later(h.deadline, sent.Add(r.ttl))
	}
	return nil
}

// outlasts makes sure the lease of the run ctx works on holds for at
// least d more, extending it if it does not; false if it cannot (the lease
// is lost, or the store failed). A context without a lease (Advance called
// outside the pool) needs none.
func (r *runLeases) outlasts(ctx context.Context, d time.Duration) (bool, error) {
	l, ok := ledger.RunLeaseFrom(ctx)
	if !ok {
		return true, nil
	}
	r.mu.Lock()
	h := r.held[l.Run]
	var (
		cur  ledger.RunLease
		left time.Duration
	)
	if h != nil {
		cur, left = h.lease, r.remainingLocked(h)
	}
	r.mu.Unlock()
	if h == nil || cur.Token != l.Token {
		return false, errLeaseLost
	}
	if left >= d {
		return true, nil
	}
	ttl := d + r.margin()
	sent := r.e.now()
	got, err := r.e.store.RenewRunLeases(ledger.WithoutRunLease(ctx), r.owner, []ledger.RunLease{cur}, ttl)
	if ctx.Err() == nil {
		r.noteErr(err, true)
	}
	if err != nil {
		return false, fmt.Errorf("extend the lease of run %s: %w", l.Run, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(got) == 0 || got[0].Token != h.lease.Token || r.held[l.Run] != h {
		r.lose(l.Run, h)
		return false, errLeaseLost
	}
	h.lease.Until = got[0].Until
	h.deadline = later(h.deadline, sent.Add(ttl))
	return r.remainingLocked(h) >= d, nil
}

func (r *runLeases) remainingLocked(h *heldLease) time.Duration { return h.deadline.Sub(r.e.now()) }

// keep runs the renew loop until the returned function is called; loops
// nest (the pool's, a recovery scan's), and one runs while any is kept.
func (r *runLeases) keep(ctx context.Context) (stop func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loops++
	if r.loops == 1 {
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		r.stopLoop, r.loopDone = cancel, done
		go func() {
			defer close(done)
			r.loop(lctx)
		}()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.loops--
			var (
				cancel context.CancelFunc
				done   chan struct{}
			)
			if r.loops == 0 {
				cancel, done = r.stopLoop, r.loopDone
			}
			r.mu.Unlock()
			if cancel != nil {
				cancel()
				<-done
			}
		})
	}
}

// loop renews the held leases every third of the TTL.
func (r *runLeases) loop(ctx context.Context) {
	t := time.NewTicker(r.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := r.renew(ctx); err != nil && ctx.Err() == nil {
				r.e.logFailure(ctx, "renew run leases", err)
			}
		}
	}
}

// leaseLost reports whether ctx was cancelled because its run's lease was
// lost.
func leaseLost(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ledger.ErrLeaseLost) }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
