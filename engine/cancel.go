package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// CancelParams asks for a run to be cancelled.
type CancelParams struct {
	RunID     ledger.RunID
	Principal string
	Reason    string
}

// Cancel cancels a run in one write (Store.RequestCancel): the
// cancellation is recorded, accepted and the run moved to stopping
// together, so from the moment it commits StartAttempt refuses every new
// attempt of the run, and the pool picks the run up even when it was
// waiting for a person (a worker advancing it meanwhile loses its guarded
// update and re-reads). The rest happens as the engine advances the run:
// an in-flight attempt of a cancel-capable tool is cancelled, pending
// actions are cancelled, the cancellation goes to stopping and, once no
// attempt is in flight with an unknown effect, to stopped, and the run
// stops with user_cancelled. Acceptance says nothing about side effects;
// the attempts do.
//
// The reason is a person's free text: it is redacted with the engine's
// Redactor before it is stored, like tool output.
//
// Cancel is idempotent: a repeat returns the same cancellation as it
// stands, whatever its state, with Created false. CodeConflict if the run
// ended without a cancellation (nothing is written); CodeNotFound if
// unknown.
func (e *Engine) Cancel(ctx context.Context, p CancelParams) (ledger.RequestCancelResult, error) {
	res, err := e.store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: p.RunID, Principal: p.Principal,
		Reason: e.cfg.Redactor.RedactString(p.Reason)})
	if err != nil {
		return ledger.RequestCancelResult{}, fmt.Errorf("cancel %s: %w", p.RunID, err)
	}
	if !res.Cancellation.State.Terminal() {
		e.interruptCall(p.RunID)
		e.Notify()
	}
	return res, nil
}

// Resolve settles an action in review (recovery.Resolve), with the
// person's note redacted by the engine's Redactor before it is stored,
// and notifies the pool so the run goes on.
//
// An action of a client-driven run whose effect waits on its agent — an
// attempt whose lease lapsed, an uncertain action, a retry after an
// attempt whose effect is unknown — is handed to the person first, with
// that recorded as a review decision: a person can always settle what an
// agent that never came back left open.
func (e *Engine) Resolve(ctx context.Context, p recovery.ResolveParams) (*ledger.Action, error) {
	p.RedactFunc = e.cfg.Redactor.RedactString
	a, err := recovery.Resolve(ctx, e.store, p)
	if ledger.Code(err) == ledger.CodeConflict {
		if moved, herr := e.reviewForPerson(ctx, p); herr != nil {
			return nil, herr
		} else if moved {
			a, err = recovery.Resolve(ctx, e.store, p)
		}
	}
	if err != nil {
		return nil, err
	}
	e.Notify()
	return a, nil
}

// reviewForPerson moves to review an action of a client-driven run that a
// person asks to settle while it waits on its agent; false if it is no
// such action (Resolve then answers from the action as it stands).
func (e *Engine) reviewForPerson(ctx context.Context, p recovery.ResolveParams) (bool, error) {
	a, err := e.store.FindActionByID(ctx, p.ActionID)
	if err != nil || a.Tenant != p.Tenant {
		return false, nil // Resolve has said not found
	}
	run, err := e.store.FindRunByID(ctx, a.RunID)
	if err != nil {
		return false, err
	}
	if !e.ClientDriven(run.Agent) {
		return false, nil
	}
	atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
	if err != nil || len(atts) == 0 {
		return false, err
	}
	last := atts[len(atts)-1]
	why := "a person asked to settle the action"
	switch a.State {
	case ledger.ActionRunning:
		if live, err := e.leaseLive(ctx, a.ID); err != nil || live {
			return false, err // in flight: its agent may still report it
		}
		why += " after its attempt's lease lapsed with no outcome"
	case ledger.ActionUncertain:
		why += " whose effect is unknown"
	case ledger.ActionApproved:
		if last.Effect != ledger.EffectUnknown || a.Effect == ledger.EffectRead {
			return false, nil
		}
		why += " before a retry began, with the earlier attempt's effect unknown"
	default:
		return false, nil
	}
	err = e.handToPerson(ctx, run, a, last, why, p.Principal, a.State == ledger.ActionRunning)
	if ledger.Code(err) == ledger.CodeConflict {
		return true, nil // moved meanwhile: Resolve answers from what it is now
	}
	return err == nil, err
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

// stepCancel moves a run whose cancel was accepted towards stopped, one
// fact at a time: the cancellation goes to stopping with its run (which
// RequestCancel moved already; an older build's row may still need it);
// actions not yet running are cancelled; an attempt left in flight is
// settled by recovery (cancelled by the tool, established by query, or
// handed to review); then the cancellation is confirmed and the run stops
// with user_cancelled. A confirmed cancellation whose run is still
// stopping (a crash between the two writes) only needs the run stopped.
func (e *Engine) stepCancel(ctx context.Context, run *ledger.Run, c *ledger.Cancellation) (bool, error) {
	if c.State == ledger.CancelStopped {
		return false, e.finish(ctx, run, ledger.StopUserCancelled, map[string]any{"cancellation": c.ID})
	}
	if c.State == ledger.CancelAccepted {
		if run.State != ledger.RunStopping {
			if _, err := e.store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: run.State, To: ledger.RunStopping,
				Actor: "engine", Data: map[string]any{"cause": "cancel accepted"}}); err != nil {
				return false, err
			}
		}
		if _, err := e.store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID,
			From: ledger.CancelAccepted, To: ledger.CancelStopping, Actor: "engine"}); err != nil {
			return false, err
		}
		e.fault(FaultCancelStopping)
		return true, nil
	}
	actions, err := e.store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
	if err != nil {
		return false, err
	}
	for _, a := range actions {
		switch a.State {
		case ledger.ActionApproved:
			if a.AttemptCount == 0 {
				if _, err := e.store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: a.State, To: ledger.ActionCancelled,
					Actor: "engine", Data: map[string]any{"cause": "run cancelled"}}); err != nil {
					return false, err
				}
				break
			}
			// A retry that has not begun: recovery cancels it, or hands it
			// to a person if the earlier attempt's effect is unknown.
			if _, err := e.recoverer.Recover(ctx, run, a); err != nil {
				return false, err
			}
		case ledger.ActionProposed, ledger.ActionAwaitingApproval:
			if _, err := e.store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: a.State, To: ledger.ActionCancelled,
				Actor: "engine", Data: map[string]any{"cause": "run cancelled"}}); err != nil {
				return false, err
			}
		case ledger.ActionRunning, ledger.ActionUncertain:
			if e.ClientDriven(run.Agent) && a.State == ledger.ActionRunning {
				// The client's call is in flight until its lease lapses:
				// its heartbeat says cancel_requested.
				if live, err := e.leaseLive(ctx, a.ID); err != nil || live {
					e.deferRun(run.ID, time.Second)
					return false, err
				}
			}
			d, err := e.recoverer.Recover(ctx, run, a)
			if err != nil {
				return false, err
			}
			if d.Kind == recovery.Query || d.Kind == recovery.Cancel {
				// A client's tool: its agent was told to ask it.
				e.deferRun(run.ID, time.Second)
				return false, nil
			}
			if d.Kind == recovery.Wait {
				e.deferRun(run.ID, 2*time.Second)
				return false, nil
			}
		}
	}
	if _, err := e.store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID,
		From: ledger.CancelStopping, To: ledger.CancelStopped, Actor: "engine"}); err != nil {
		return false, err
	}
	run, err = e.store.FindRunByID(ctx, run.ID)
	if err != nil {
		return false, err
	}
	if !run.State.Terminal() {
		return false, e.finish(ctx, run, ledger.StopUserCancelled, map[string]any{"cancellation": c.ID})
	}
	return false, nil
}

// leaseLive reports whether the last attempt of a client's action holds a
// lease that has not lapsed.
func (e *Engine) leaseLive(ctx context.Context, id ledger.ActionID) (bool, error) {
	atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &id})
	if err != nil || len(atts) == 0 {
		return false, err
	}
	last := atts[len(atts)-1]
	if last.Status != ledger.AttemptStarted {
		return false, nil
	}
	l, err := e.store.FindAttemptLease(ctx, last.ID)
	if ledger.Code(err) == ledger.CodeNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return !l.Lapsed(e.now()), nil
}
