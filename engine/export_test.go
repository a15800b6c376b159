package engine

import (
	"context"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// Test hooks: the pool's pass and a worker's turn, driven by a test
// without the pool's goroutines (STYLE: loops expose runOnce).

// Dispatcher is the pool's loop state.
type Dispatcher = dispatcher

// NewDispatcher returns the loop state of a pool handing runs to work.
func NewDispatcher(e *Engine, work chan<- ledger.RunID) *Dispatcher { return newDispatcher(e, work) }

// RunOnce makes one pass of the pool.
func (d *dispatcher) RunOnce(ctx context.Context) (time.Duration, bool) { return d.runOnce(ctx) }

// Done marks a run handed out as finished by its worker.
func (d *dispatcher) Done(id ledger.RunID) { d.done(context.Background(), id) }

// Work is one worker's turn on a run.
func (e *Engine) Work(ctx context.Context, id ledger.RunID) { e.work(ctx, id) }

// Failures is the run's count of failed Advances in a row.
func (e *Engine) Failures(id ledger.RunID) int {
	e.callsMu.Lock()
	defer e.callsMu.Unlock()
	return e.failures[id]
}

// OwnerGone is ownerGone, LocalOwnerPrefix localOwnerPrefix.
var (
	OwnerGone        = ownerGone
	LocalOwnerPrefix = localOwnerPrefix
)
