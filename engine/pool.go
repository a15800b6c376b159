package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// pool is the running worker pool: a dispatcher that finds runnable runs
// (on a tick, or at once when notified) and hands each to one worker at a
// time.
type pool struct {
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}
}

// Start launches the worker pool; it runs until ctx is done or Stop is
// called. A run is advanced by at most one worker of this process at a time.
// Several processes on one database would each advance the same run: the
// CLI takes an exclusive lock per database (cmd/ledger/lock.go) until runs
// are leased in the store.
func (e *Engine) Start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	p := &pool{cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	e.pool.Store(p)
	go func() {
		defer close(p.done)
		e.dispatch(ctx, p)
	}()
}

// Stop stops taking runs and waits for the workers to return. A worker
// stopped mid-attempt leaves the attempt started; recovery settles it.
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
	work := make(chan ledger.RunID)
	d := newDispatcher(e, work)
	var wg sync.WaitGroup
	for range e.cfg.Workers {
		wg.Go(func() {
			for id := range work {
				e.work(ctx, id)
				d.done(id)
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
		case <-e.health.recoveredC():
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

// runOnce makes one pass: expire due approvals, find the runnable runs and
// hand each one no worker holds to a worker (waiting for one to be free).
// It returns how long to wait before the next pass, and whether a wake-up
// may end that wait early: the poll interval after a good pass, the
// backoff, not to be cut short, after a pass the store failed.
func (d *dispatcher) runOnce(ctx context.Context) (time.Duration, bool) {
	e := d.e
	e.health.flush(ctx)
	e.failLogs.Flush(ctx)
	failed := false
	if _, err := e.approvals.ExpireDue(ctx); err != nil && ctx.Err() == nil {
		failed = true
		e.logFailure(ctx, "expire approvals", err)
	}
	if err := e.sweepLeases(ctx); err != nil && ctx.Err() == nil {
		failed = true
		e.logFailure(ctx, "sweep lapsed leases", err)
	}
	ids, err := e.Runnable(ctx)
	if err != nil && ctx.Err() == nil {
		failed = true
		e.logFailure(ctx, "find runnable runs", err)
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
			d.done(id)
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

// done marks a run handed out by runOnce as no longer held by a worker.
func (d *dispatcher) done(id ledger.RunID) {
	d.mu.Lock()
	delete(d.busy, id)
	d.mu.Unlock()
}

// work advances one run for the pool. A run whose Advance fails waits out
// its backoff before the pool hands it out again, so a failing store (a
// full disk) is not retried as fast as it fails; a success starts its
// backoff over. A lost race (CodeConflict, after Advance's own retries) is
// normal: the run is looked at again on the next pass.
func (e *Engine) work(ctx context.Context, id ledger.RunID) {
	err := e.Advance(ctx, id)
	switch {
	case err == nil:
		e.callsMu.Lock()
		delete(e.failures, id)
		e.callsMu.Unlock()
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
// (failureLog). While writes fail, the StoreHealth already says so, once
// per interval for every writer: a store failure then goes to the debug
// log only.
func (e *Engine) logFailure(ctx context.Context, msg string, err error, attrs ...any) {
	if IsStoreFailure(err) && e.health.failing.Load() {
		e.log.DebugContext(ctx, msg, append([]any{"err", err}, attrs...)...)
		return
	}
	e.failLogs.Error(ctx, msg, err, attrs...)
}

// Runnable lists runs the engine can advance without a person: queued,
// running and stopping ones, oldest first, less those recovery told to
// wait a while. A running run of a client-driven agent is its client's
// to advance, so it is not listed (nor counted against the page, so that
// long-lived client runs cannot crowd out the engine's own).
func (e *Engine) Runnable(ctx context.Context) ([]ledger.RunID, error) {
	var ids []ledger.RunID
	for _, st := range []ledger.RunState{ledger.RunQueued, ledger.RunRunning, ledger.RunStopping} {
		f := ledger.RunFilter{State: &st, Limit: 256}
		if st == ledger.RunRunning {
			f.NotAgents = e.clientAgents
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
