package ledger

import (
	"context"
)

// RequestCancel implements Store. The whole decision is this one write:
// between reading the run and moving it nothing else can commit (the
// transaction began IMMEDIATE), so a run that completes "at the same time"
// either completed first (CodeConflict, nothing written) or finds itself
// stopping and loses its guarded update.
func (s *DB) RequestCancel(ctx context.Context, p RequestCancelParams) (RequestCancelResult, error) {
	if p.Principal == "" {
		return RequestCancelResult{}, Errorf(CodeInvalid, "request cancel: principal is required")
	}
	var out RequestCancelResult
	err := s.inTx(ctx, "request_cancel", func(tx *txn) error {
		run, err := tx.findRun(p.RunID)
		if err != nil {
			return err
		}
		existing, err := tx.findCancellation(p.RunID)
		switch {
		case err == nil:
			// A repeat: the same cancellation, brought up to date if an
			// older build or a crash left it half-done.
			c, err := tx.settleCancellation(existing, run, p.Principal)
			out = RequestCancelResult{Cancellation: c}
			return err
		case Code(err) != CodeNotFound:
			return err
		}
		if run.State.Terminal() {
			return Errorf(CodeConflict, "run %s is already %s (%s): nothing to cancel", run.ID, run.State, run.StopReason)
		}
		c := &Cancellation{
			ID: CancellationID(tx.newID(PrefixCancellation)), RunID: run.ID, Tenant: run.Tenant, State: CancelRequested,
			RequestedBy: p.Principal, Reason: p.Reason, Version: 1, RequestedAt: tx.now,
		}
		if err := tx.d.InsertCancellation(tx.ctx, c); err != nil {
			return err
		}
		if _, err := tx.appendEvent(transitionEvent(run.ID, "cancellation", string(c.ID), CancellationState(""), CancelRequested,
			p.Principal, map[string]any{"reason": p.Reason}).bind(CancellationContentOf(c))); err != nil {
			return err
		}
		c, err = tx.settleCancellation(c, run, p.Principal)
		out = RequestCancelResult{Cancellation: c, Created: true}
		return err
	})
	return out, err
}

// settleCancellation brings a cancellation into line with its run, in the
// transaction that read both: on a run that ended, a cancellation not yet
// confirmed is too late; on a live run, a requested one is accepted, and an
// accepted or stopping one has its run stopping (from then on no attempt
// starts, and the engine takes it from there). It returns the
// cancellation as it now stands.
func (tx *txn) settleCancellation(c *Cancellation, run *Run, actor string) (*Cancellation, error) {
	if c.State.Terminal() {
		return c, nil
	}
	if run.State.Terminal() {
		return tx.transitionCancellation(CancellationTransition{RunID: run.ID, From: c.State, To: CancelTooLate, Actor: actor,
			Data: map[string]any{"cause": "the run ended before the cancel took effect", "run_state": run.State,
				"stop_reason": run.StopReason}})
	}
	// A cancellation this write does not move (an accepted row an older
	// version left, perhaps before rows were bound) is bound by the run's
	// event instead.
	var also []Content
	if c.State == CancelRequested {
		var err error
		if c, err = tx.transitionCancellation(CancellationTransition{RunID: run.ID, From: CancelRequested, To: CancelAccepted,
			Actor: actor}); err != nil {
			return nil, err
		}
	} else {
		also = []Content{CancellationContentOf(c)}
	}
	if run.State != RunStopping {
		if err := tx.transitionRun(RunTransition{ID: run.ID, From: run.State, To: RunStopping, Actor: actor,
			Data: map[string]any{"cause": "cancel accepted", "cancellation": c.ID}, also: also}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// SettleCancellations implements Store.
func (s *DB) SettleCancellations(ctx context.Context) ([]*Cancellation, error) {
	var out []*Cancellation
	err := s.inTx(ctx, "settle_cancellations", func(tx *txn) error {
		out = nil // a driver may run the write again
		unsettled, err := tx.d.ListUnsettledCancellations(tx.ctx)
		if err != nil {
			return err
		}
		for _, c := range unsettled {
			run, err := tx.findRun(c.RunID)
			if err != nil {
				return err
			}
			if !run.State.Terminal() && c.State != CancelRequested && run.State == RunStopping {
				continue // in line already: the engine is stopping the run
			}
			got, err := tx.settleCancellation(c, run, "recovery")
			if err != nil {
				return err
			}
			out = append(out, got)
		}
		return nil
	})
	return out, err
}

// TransitionCancellation implements Store.
func (s *DB) TransitionCancellation(ctx context.Context, p CancellationTransition) (*Cancellation, error) {
	if err := ValidateCancellationTransition(p.From, p.To); err != nil {
		return nil, wrapErr("transition cancellation", err)
	}
	var out *Cancellation
	err := s.inTx(ctx, "transition_cancellation", func(tx *txn) error {
		var err error
		out, err = tx.transitionCancellation(p)
		return err
	})
	return out, err
}

// transitionCancellation is the one place a cancellation's state changes.
// Confirming it needs nothing in flight; calling it too late needs a run
// that has ended.
func (tx *txn) transitionCancellation(p CancellationTransition) (*Cancellation, error) {
	if err := ValidateCancellationTransition(p.From, p.To); err != nil {
		return nil, err
	}
	switch p.To {
	case CancelStopped:
		if err := tx.checkNothingInFlight(p.RunID); err != nil {
			return nil, err
		}
	case CancelTooLate:
		run, err := tx.findRun(p.RunID)
		if err != nil {
			return nil, err
		}
		if !run.State.Terminal() {
			return nil, Errorf(CodeConflict, "cancellation of run %s cannot be too late: the run is %s", p.RunID, run.State)
		}
	}
	moved, err := tx.d.MoveCancellation(tx.ctx, p.RunID, p.From, p.To, tx.now)
	if err != nil {
		return nil, err
	}
	if !moved {
		c, err := tx.findCancellation(p.RunID)
		if err != nil {
			return nil, err
		}
		return nil, Errorf(CodeConflict, "cancellation of run %s is %s, not %s", p.RunID, c.State, p.From)
	}
	c, err := tx.findCancellation(p.RunID)
	if err != nil {
		return nil, err
	}
	if _, err := tx.appendEvent(transitionEvent(p.RunID, "cancellation", string(c.ID), p.From, p.To, p.Actor, p.Data).
		bind(CancellationContentOf(c))); err != nil {
		return nil, err
	}
	return c, nil
}

// checkNothingInFlight is the condition for confirming a cancellation
// (docs/state-machines.md): no attempt of the run is still started with an
// unknown effect. An attempt whose effect a query established may still be
// open; one handed to review has been finished as uncertain.
func (tx *txn) checkNothingInFlight(run RunID) error {
	started := AttemptStarted
	open, err := tx.d.ListAttempts(tx.ctx, AttemptFilter{RunID: &run, Status: &started})
	if err != nil {
		return err
	}
	for _, a := range open {
		if a.Effect == EffectUnknown {
			return Errorf(CodeConflict, "cancellation of run %s cannot be confirmed: attempt %s is in flight with an unknown effect", run, a.ID)
		}
	}
	return nil
}

func (tx *txn) findCancellation(run RunID) (*Cancellation, error) {
	return tx.d.GetCancellation(tx.ctx, run)
}

// FindCancellation implements Store.
func (s *DB) FindCancellation(ctx context.Context, run RunID) (*Cancellation, error) {
	return read(ctx, s, "find_cancellation", func(r Reader) (*Cancellation, error) { return r.GetCancellation(ctx, run) })
}
