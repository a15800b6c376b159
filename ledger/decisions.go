package ledger

import "context"

// SettleReview implements Store.
func (s *DB) SettleReview(ctx context.Context, p SettleReviewParams) (*Action, error) {
	if p.Actor == "" {
		return nil, Errorf(CodeInvalid, "settle review: actor is required")
	}
	var out *Action
	err := s.inTx(ctx, "settle_review", func(tx *txn) error {
		a, err := tx.findAction(p.ActionID)
		if err != nil {
			return err
		}
		if a.State != ActionNeedsReview {
			return Errorf(CodeConflict, "action %s is %s, not in review", a.ID, a.State)
		}
		att, err := tx.d.LastAttempt(tx.ctx, a.ID)
		switch {
		case err == nil:
			if _, err := tx.observe(att, ObservedPerson, p.Effect, p.Detail, p.Actor); err != nil {
				return err
			}
		case Code(err) != CodeNotFound:
			return err
		}
		if err := tx.transitionAction(ActionTransition{ID: a.ID, From: ActionNeedsReview, To: p.To, Actor: p.Actor, Data: p.Data}); err != nil {
			return err
		}
		waiting, err := tx.d.CountActions(tx.ctx, a.RunID, ActionNeedsReview)
		if err != nil {
			return err
		}
		run, err := tx.findRun(a.RunID)
		if err != nil {
			return err
		}
		if waiting == 0 && run.State == RunNeedsReview {
			if err := tx.transitionRun(RunTransition{ID: run.ID, From: RunNeedsReview, To: RunRunning, Actor: p.Actor,
				Data: map[string]any{"cause": "review settled"}}); err != nil {
				return err
			}
		}
		out, err = tx.findAction(a.ID)
		return err
	})
	return out, err
}
