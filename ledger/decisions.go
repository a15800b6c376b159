package ledger

import (
	"context"
	"maps"
)

// RecordDecision implements Store.
func (s *GormStore) RecordDecision(ctx context.Context, p RecordDecisionParams) (*Event, error) {
	if err := firstErr(checkText("decision", p.Decision, 32), checkText("rationale", p.Rationale, 4000)); err != nil {
		return nil, wrapErr("record decision", err)
	}
	var out *Event
	err := s.inTx(ctx, "record decision", func(tx *txn) error {
		a, err := tx.findAction(p.ActionID)
		if err != nil {
			return err
		}
		data := map[string]any{"decision": p.Decision, "rationale": p.Rationale}
		if p.AttemptID != "" {
			data["attempt_id"] = p.AttemptID
		}
		maps.Copy(data, p.Data)
		data["decision"], data["rationale"] = p.Decision, p.Rationale // never overwritten by Data
		out, err = tx.appendEvent(eventSpec{RunID: a.RunID, Type: "recovery.decision", EntityType: "action",
			EntityID: string(a.ID), Actor: p.Actor, Data: data})
		return err
	})
	return out, err
}
