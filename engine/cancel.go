package engine

import (
	"context"
	"fmt"

	"github.com/actionledger/ledger/ledger"
)

// CancelParams asks for a run to be cancelled.
type CancelParams struct {
	RunID     ledger.RunID
	Principal string
	Reason    string
}

// Cancel records a cancellation request and accepts it: from the moment the
// acceptance commits, StartAttempt refuses every new attempt of the run. The
// rest happens as the engine advances the run: an in-flight attempt of a
// cancel-capable tool is cancelled, pending actions are cancelled, the
// cancellation goes to stopping and, once no attempt is in flight with an
// unknown effect, to stopped, and the run stops with user_cancelled.
// Acceptance says nothing about side effects; the attempts do.
//
// Cancel is idempotent: a second call returns the cancellation as it
// stands. CodeConflict if the run already ended; CodeNotFound if unknown.
func (e *Engine) Cancel(ctx context.Context, p CancelParams) (*ledger.Cancellation, error) {
	res, err := e.store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: p.RunID, Principal: p.Principal, Reason: p.Reason})
	if err != nil {
		return nil, fmt.Errorf("cancel %s: %w", p.RunID, err)
	}
	c := res.Cancellation
	if c.State == ledger.CancelRequested {
		c, err = e.store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: p.RunID,
			From: ledger.CancelRequested, To: ledger.CancelAccepted, Actor: p.Principal})
		if err != nil {
			return nil, fmt.Errorf("cancel %s: %w", p.RunID, err)
		}
	}
	e.interruptCall(p.RunID)
	e.Notify()
	return c, nil
}

// interruptCall cancels the context of the run's call in flight in this
// process, if there is one.
func (e *Engine) interruptCall(run ledger.RunID) {
	e.callsMu.Lock()
	stop := e.calls[run]
	e.callsMu.Unlock()
	if stop != nil {
		stop()
	}
}

// trackCall registers the cancel function of a run's call in flight.
func (e *Engine) trackCall(run ledger.RunID, stop func()) (untrack func()) {
	e.callsMu.Lock()
	e.calls[run] = stop
	e.callsMu.Unlock()
	return func() {
		e.callsMu.Lock()
		delete(e.calls, run)
		e.callsMu.Unlock()
	}
}
