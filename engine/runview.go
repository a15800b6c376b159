package engine

import (
	"context"
	"errors"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/ledger"
)

// runView is what one Advance knows of its run between steps: the
// cancellation, the actions and the last attempt of each that it read or
// wrote, as of the run's chain head head. Every write to a run appends to
// its chain, so while the run's head is still head nothing of the run
// changed since, and a step reads the run alone rather than all of it
// again. The writes the engine makes on the path of every action
// (CreateAction, FinishAttempt) return the rows they wrote and how they
// moved the head; a write that began where the view is carries it forward,
// anything else (another write in between, a write whose rows the engine
// does not get back) empties it, and the next step reads the run afresh.
type runView struct {
	head int64 // the chain head the view is of; 0 for none

	// fingerprints are the loop policy's fingerprints of the run's
	// actions, by id: of a tool and arguments, which an action never
	// changes, so they outlive the rest of the view.
	fingerprints map[ledger.ActionID]ledger.Digest

	cancelRead bool
	cancel     *ledger.Cancellation // nil: the run has none

	actions  []*ledger.Action                    // in (run, seq) order; nil: not read
	attempts map[ledger.ActionID]*ledger.Attempt // the last attempt of each action; nil: not read
}

// at readies the view for a step of run, read just now: kept if the run's
// head is the view's, emptied otherwise.
func (v *runView) at(run *ledger.Run) {
	if v.head == 0 || v.head != run.EventSeq {
		v.drop()
		v.head = run.EventSeq
	}
}

// drop empties the view but for the fingerprints.
func (v *runView) drop() { *v = runView{fingerprints: v.fingerprints} }

// fingerprint is the loop policy's fingerprint of a, taken once; an error
// is not kept.
func (v *runView) fingerprint(a *ledger.Action) (ledger.Digest, error) {
	if fp, ok := v.fingerprints[a.ID]; ok {
		return fp, nil
	}
	fp, err := budget.Fingerprint(a.Tool, a.Arguments)
	if err != nil {
		return "", err
	}
	if v.fingerprints == nil {
		v.fingerprints = map[ledger.ActionID]ledger.Digest{}
	}
	v.fingerprints[a.ID] = fp
	return fp, nil
}

// cancellation is the run's cancellation, nil if it has none.
func (v *runView) cancellation(ctx context.Context, s ledger.Store, run ledger.RunID) (*ledger.Cancellation, error) {
	if !v.cancelRead {
		c, err := s.FindCancellation(ctx, run)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			c = nil
		case err != nil:
			return nil, err
		}
		v.cancel, v.cancelRead = c, true
	}
	return v.cancel, nil
}

// findActions is every action of the run in sequence order.
func (v *runView) findActions(ctx context.Context, s ledger.Store, run ledger.RunID) ([]*ledger.Action, error) {
	if v.actions == nil {
		actions, err := s.FindActions(ctx, ledger.ActionFilter{RunID: &run})
		if err != nil {
			return nil, err
		}
		if actions == nil {
			actions = []*ledger.Action{}
		}
		v.actions = actions
	}
	return v.actions, nil
}

// lastAttempts is the last attempt of each action of the run that has one.
func (v *runView) lastAttempts(ctx context.Context, s ledger.Store, run ledger.RunID) (map[ledger.ActionID]*ledger.Attempt, error) {
	if v.attempts == nil {
		attempts, err := s.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run})
		if err != nil {
			return nil, err
		}
		last := make(map[ledger.ActionID]*ledger.Attempt, len(attempts))
		for _, a := range attempts {
			last[a.ActionID] = a // ordered by (action, attempt_no): the last wins
		}
		v.attempts = last
	}
	return v.attempts, nil
}

// follows reports whether a write that moved the head by m began where
// the view is; if so the view moves with it, else it is emptied.
func (v *runView) follows(m ledger.ChainMove) bool {
	if v.head == 0 || m.From != v.head || m.To <= m.From {
		v.drop()
		return false
	}
	v.head = m.To
	return true
}

// created carries the view over CreateAction's write, which recorded a new
// action of the run (and maybe started its attempt) and changed no other.
func (v *runView) created(res ledger.CreateActionResult) {
	if res.Duplicate || res.Action == nil || !v.follows(res.Chain) {
		v.drop()
		return
	}
	if v.actions != nil {
		v.actions = append(v.actions, res.Action) // the new action has the run's highest seq
	}
	if v.attempts != nil && res.Attempt != nil {
		v.attempts[res.Action.ID] = res.Attempt
	}
}

// finished carries the view over FinishAttempt's write, which changed the
// attempt and its action.
func (v *runView) finished(res ledger.FinishAttemptResult) {
	if res.Action == nil || res.Attempt == nil || !v.follows(res.Chain) {
		v.drop()
		return
	}
	if v.actions != nil {
		i := len(v.actions) - 1
		for i >= 0 && v.actions[i].ID != res.Action.ID {
			i--
		}
		if i < 0 {
			v.drop()
			return
		}
		v.actions[i] = res.Action
	}
	if v.attempts != nil {
		v.attempts[res.Attempt.ActionID] = res.Attempt
	}
}
