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
	var (
		mu     sync.Mutex
		busy   = map[ledger.RunID]bool{}
		wg     sync.WaitGroup
		ticker = time.NewTicker(e.cfg.PollInterval)
	)
	defer ticker.Stop()
	for range e.cfg.Workers {
		wg.Go(func() {
			for id := range work {
				if err := e.Advance(ctx, id); err != nil && !errors.Is(err, context.Canceled) {
					e.log.Error("advance run", "run", id, "err", err)
				}
				mu.Lock()
				delete(busy, id)
				mu.Unlock()
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
		if _, err := e.approvals.ExpireDue(ctx); err != nil && ctx.Err() == nil {
			e.log.Error("expire approvals", "err", err)
		}
		ids, err := e.Runnable(ctx)
		if err != nil && ctx.Err() == nil {
			e.log.Error("find runnable runs", "err", err)
		}
		for _, id := range ids {
			mu.Lock()
			skip := busy[id]
			busy[id] = true
			mu.Unlock()
			if skip {
				continue
			}
			select {
			case work <- id:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-p.wake:
		}
	}
}

// Runnable lists runs the engine can advance without a person: queued,
// running and stopping ones, oldest first, less those recovery told to
// wait a while.
func (e *Engine) Runnable(ctx context.Context) ([]ledger.RunID, error) {
	var ids []ledger.RunID
	for _, st := range []ledger.RunState{ledger.RunQueued, ledger.RunRunning, ledger.RunStopping} {
		runs, err := e.store.FindRuns(ctx, ledger.RunFilter{State: &st, Limit: 256})
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
