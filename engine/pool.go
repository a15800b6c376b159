package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/storehealth"
)

// pool is the running worker pool: a dispatcher that claims runnable runs
// (on a tick, or at once when notified) and hands each to one worker at a
// time, under the run's lease.
type pool struct {
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}
}

// Start launches the worker pool; it runs until ctx is done or Stop is
// called. A run is advanced only under its lease (runleases.go): the pool
// claims the runnable runs whose lease is free or lapsed, renews the
// leases it holds while it works, and releases a run when its worker
// returns it, so several processes on one database never advance the
// same run at once.
func (e *Engine) Start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	p := &pool{cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	e.pool.Store(p)
	go func() {
		defer close(p.done)
		e.dispatch(ctx, p)
	}()
}

// Stop stops taking runs and waits for the workers to return, then
// releases the leases the pool held, so another process may take the runs
// at once. A worker stopped mid-attempt leaves the attempt started;
// recovery, by whoever claims the run next, settles it.
func (e *Engine) Stop() {
	p := e.pool.Swap(nil)
	if p == nil {
		return
	}
	p.cancel()
	<-p.done
}

// Notify asks the pool to look for runnable runs now (after a submit or an
// approval) instead of at the next tick.
func (e *Engine) Notify() {
	if p := e.pool.Load(); p != nil {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

func (e *Engine) dispatch(ctx context.Context, p *pool) {
	stopRenewing := e.leases.keep(ctx)
	work := make(chan ledger.RunID)
	d := newDispatcher(e, work)
	var wg sync.WaitGroup
	for range e.cfg.Workers {
		wg.Go(func() {
			for id := range work {
				e.work(ctx, id)
				d.done(ctx, id)
				select { // the run may be runnable again: look now, not at the next tick
				case p.wake <- struct{}{}:
				default:
				}
			}
		})
	}
	defer func() {
		close(work)
		wg.Wait()
		e.leases.releaseIdle(ctx)
		stopRenewing()
	}()
	for {
		wait, wakeable := d.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		timer := time.NewTimer(wait)
		wake := p.wake
		if !wakeable {
			// Backing off: a worker's wake-up must not cut the wait short,
			// or a failing store is hammered as fast as runs fail.
			wake = nil
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-wake:
			timer.Stop()
		case <-e.health.Recovered():
			// A write succeeded (a request, another worker): the store
			// works again, so nobody need wait out a backoff.
			timer.Stop()
			d.resetBackoff()
		}
	}
}

// dispatcher is the pool's loop state: the runs handed to a worker and not
// done yet, and the failed passes in a row, for its backoff.
type dispatcher struct {
	e    *Engine
	work chan<- ledger.RunID

	mu       sync.Mutex
	busy     map[ledger.RunID]bool
	failures int
}

func newDispatcher(e *Engine, work chan<- ledger.RunID) *dispatcher {
	return &dispatcher{e: e, work: work, busy: map[ledger.RunID]bool{}}
}

// runOnce makes one pass: expire due approvals, then hand each free worker
// a run: first the runs this process holds that no worker has and that
// are due (recovery or a failure told them to wait), then runnable runs
// it claims. It returns how long to wait before the next pass, and whether
// a wake-up may end that wait early: the poll interval after a good pass,
// the backoff, not to be cut short, after a pass the store failed.
func (d *dispatcher) runOnce(ctx context.Context) (time.Duration, bool) {
	e := d.e
	e.health.Flush(ctx)
	e.failLogs.Flush(ctx)
	if e.health.ProbeDue() {
		// Its outcome reaches the health through the store's hook; it
		// matters to nothing else.
		_ = e.store.ProbeWrite(ctx)
	}
	failed := false
	if _, err := e.approvals.ExpireDue(ctx); err != nil && ctx.Err() == nil {
		failed = true
		e.logFailure(ctx, "expire approvals", err)
	}
	if err := e.sweepLeases(ctx); err != nil && ctx.Err() == nil {
		failed = true
		e.logFailure(ctx, "sweep lapsed leases", err)
	}
	d.mu.Lock()
	free := e.cfg.Workers - len(d.busy)
	d.mu.Unlock()
	var ids []ledger.RunID
	for _, id := range e.leases.idle() {
		if len(ids) == free {
			break
		}
		d.mu.Lock()
		busy := d.busy[id]
		d.mu.Unlock()
		if !busy && !e.deferred(id) {
			ids = append(ids, id)
		}
	}
	if n := free - len(ids); n > 0 {
		claimed, err := e.claimRunnable(ctx, n)
		if err != nil && ctx.Err() == nil {
			failed = true
			e.logFailure(ctx, "claim runnable runs", err)
		}
		for _, l := range claimed {
			ids = append(ids, l.Run)
		}
	}
	for _, id := range ids {
		d.mu.Lock()
		skip := d.busy[id]
		d.busy[id] = true
		d.mu.Unlock()
		if skip {
			continue
		}
		select {
		case d.work <- id:
		case <-ctx.Done():
			d.done(ctx, id)
			return 0, false
		}
	}
	if !failed {
		d.failures = 0
		return e.cfg.PollInterval, true
	}
	d.failures++
	return e.backoff.delay(d.failures), false
}

// resetBackoff forgets the failures of the pool's passes and of every run,
// so each is tried again on the next pass.
func (d *dispatcher) resetBackoff() {
	d.failures = 0
	e := d.e
	e.callsMu.Lock()
	for id := range e.failures {
		delete(e.notBefore, id)
	}
	clear(e.failures)
	e.callsMu.Unlock()
}

// done marks a run handed out by runOnce as no longer held by a worker,
// and releases its lease unless the run was told to wait: the pool keeps
// that one until it is due, so that the oldest runs, waiting, do not take
// every claim.
func (d *dispatcher) done(ctx context.Context, id ledger.RunID) {
	d.mu.Lock()
	delete(d.busy, id)
	d.mu.Unlock()
	if ctx.Err() == nil && d.e.deferred(id) {
		return
	}
	d.e.leases.release(ctx, id)
}

// claimRunnable claims up to limit runs the engine can advance without a
// person: queued, running and stopping ones, oldest first. A running run
// of a client-driven or gateway agent is its front end's to advance, so it
// is not claimed (nor counted against the limit).
func (e *Engine) claimRunnable(ctx context.Context, limit int) ([]ledger.RunLease, error) {
	if len(e.frontDriven) == 0 {
		return e.leases.claim(ctx, ledger.ClaimRunsParams{Limit: limit,
			States: []ledger.RunState{ledger.RunQueued, ledger.RunRunning, ledger.RunStopping}})
	}
	got, err := e.leases.claim(ctx, ledger.ClaimRunsParams{Limit: limit, States: []ledger.RunState{ledger.RunQueued, ledger.RunStopping}})
	if err != nil || len(got) == limit {
		return got, err
	}
	more, err := e.leases.claim(ctx, ledger.ClaimRunsParams{Limit: limit - len(got), States: []ledger.RunState{ledger.RunRunning},
		NotAgents: e.frontDriven})
	return append(got, more...), err
}

// work advances one run for the pool, under its lease. A run whose
// Advance fails waits out its backoff before the pool hands it out again,
// so a failing store (a full disk) is not retried as fast as it fails; a
// success starts its backoff over. A lost race (CodeConflict, after
// Advance's own retries) is normal: the run is looked at again on the next
// pass. So is a lost lease: the run is another process's now.
func (e *Engine) work(ctx context.Context, id ledger.RunID) {
	wctx, end, ok := e.leases.work(ctx, id)
	if !ok {
		return // lost its lease since it was handed out
	}
	defer end()
	err := e.Advance(wctx, id)
	switch {
	case err == nil:
		e.callsMu.Lock()
		delete(e.failures, id)
		e.callsMu.Unlock()
	case errors.Is(err, ledger.ErrLeaseLost) || leaseLost(wctx):
		e.log.InfoContext(ctx, "advance run: lost its lease, another process goes on", "run", id, "err", err)
	case ctx.Err() != nil:
		// Stopping: recovery settles whatever was in flight.
	case errors.Is(err, ledger.ErrConflict):
		e.log.DebugContext(ctx, "advance run: lost a race, again on the next pass", "run", id, "err", err)
	default:
		e.callsMu.Lock()
		e.failures[id]++
		wait := e.backoff.delay(e.failures[id])
		e.notBefore[id] = e.now().Add(wait)
		e.callsMu.Unlock()
		e.logFailure(ctx, "advance run", err, "run", id, "retry_in", wait.String())
	}
}

// logFailure logs a failure of the pool once per interval with a count
// (storehealth.FailureLog). While writes fail, the store's health already
// says so, once per interval for every writer: a store failure then goes
// to the debug log only.
func (e *Engine) logFailure(ctx context.Context, msg string, err error, attrs ...any) {
	if storehealth.IsFailure(err) && e.health.Failing() {
		e.log.DebugContext(ctx, msg, append([]any{"err", err}, attrs...)...)
		return
	}
	e.failLogs.Error(ctx, msg, err, attrs...)
}

// Runnable lists runs the engine can advance without a person: queued,
// running and stopping ones, oldest first, less those recovery told to
// wait a while. A running run of a client-driven agent is its client's
// to advance, so it is not listed (nor counted against the page, so that
// long-lived client runs cannot crowd out the engine's own). It lists
// them whoever holds their leases: the pool and AdvanceRunnable claim
// instead.
func (e *Engine) Runnable(ctx context.Context) ([]ledger.RunID, error) {
	var ids []ledger.RunID
	for _, st := range []ledger.RunState{ledger.RunQueued, ledger.RunRunning, ledger.RunStopping} {
		f := ledger.RunFilter{State: &st, Limit: 256}
		if st == ledger.RunRunning {
			f.NotAgents = e.frontDriven
		}
		runs, err := e.store.FindRuns(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, r := range runs {
			if !e.deferred(r.ID) {
				ids = append(ids, r.ID)
			}
		}
	}
	return ids, nil
}

// AdvanceRunnable claims the runs the pool would take, advances each in
// turn under its lease (Advance) and releases it, and returns how many of
// them moved (their chain grew). A run whose lease it loses meanwhile is
// left to its new holder; another error stops it.
func (e *Engine) AdvanceRunnable(ctx context.Context) (int, error) {
	stop := e.leases.keep(ctx)
	defer stop()
	claimed, err := e.claimRunnable(ctx, 256)
	defer func() {
		for _, l := range claimed {
			e.leases.releaseToken(ctx, l.Run, l.Token) // those not advanced; the others are released already
		}
	}()
	if err != nil {
		return 0, err
	}
	moved := 0
	for _, l := range claimed {
		if e.deferred(l.Run) {
			continue
		}
		n, err := e.advanceHeld(ctx, l)
		moved += n
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// advanceHeld advances a run the engine holds the lease of, releases it,
// and says whether its chain grew.
func (e *Engine) advanceHeld(ctx context.Context, l ledger.RunLease) (int, error) {
	defer e.leases.releaseToken(ctx, l.Run, l.Token)
	wctx, end, ok := e.leases.work(ctx, l.Run)
	if !ok {
		return 0, nil
	}
	defer end()
	before, err := e.store.FindRunByID(ctx, l.Run)
	if err != nil {
		return 0, err
	}
	err = e.Advance(wctx, l.Run)
	if errors.Is(err, ledger.ErrLeaseLost) || leaseLost(wctx) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	after, err := e.store.FindRunByID(ctx, l.Run)
	if err != nil || after.EventSeq == before.EventSeq {
		return 0, err
	}
	return 1, nil
}
