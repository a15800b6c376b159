package ledger

import (
	"context"
	"time"
)

// openApproval opens the pending approval of an action that just entered
// awaiting_approval, bound to its digest.
func (tx *txn) openApproval(a *Action, ttl time.Duration, actor string) (*Approval, error) {
	apr := &Approval{
		ID: ApprovalID(tx.newID(PrefixApproval)), ActionID: a.ID, RunID: a.RunID, Tenant: a.Tenant,
		ActionDigest: a.ActionDigest, State: ApprovalPending, Version: 1, RequestedAt: tx.now,
	}
	if ttl = ttl.Truncate(time.Microsecond); ttl > 0 {
		exp := tx.now.Add(ttl)
		apr.ExpiresAt = &exp
	}
	if err := tx.d.InsertApproval(tx.ctx, apr); err != nil {
		return nil, err
	}
	data := map[string]any{"action_id": a.ID, "action_digest": a.ActionDigest}
	if apr.ExpiresAt != nil {
		data["expires_at"] = *apr.ExpiresAt
	}
	if _, err := tx.appendEvent(transitionEvent(a.RunID, "approval", string(apr.ID), ApprovalState(""), ApprovalPending, actor, data).
		bind(ApprovalContentOf(apr))); err != nil {
		return nil, err
	}
	return apr, nil
}

// pendingApproval returns an action's pending approval; CodeConflict if it
// has none.
func (tx *txn) pendingApproval(action ActionID) (*Approval, error) {
	apr, err := tx.d.PendingApproval(tx.ctx, action)
	if Code(err) == CodeNotFound {
		return nil, Errorf(CodeConflict, "action %s has no pending approval", action)
	}
	return apr, err
}

// transitionApproval is the one place an approval's state changes; the run
// resumes if no other approval of it is pending.
func (tx *txn) transitionApproval(a *Approval, to ApprovalState, actor, reason string, decidedBy *string) error {
	if err := ValidateApprovalTransition(a.State, to); err != nil {
		return err
	}
	var by string
	if decidedBy != nil {
		by = *decidedBy
	}
	moved, ok, err := tx.d.MoveApproval(tx.ctx, a.ID, a.State, to, tx.now, reason, by)
	if err != nil {
		return err
	}
	if !ok {
		cur, err := tx.d.GetApproval(tx.ctx, a.ID)
		if err != nil {
			return err
		}
		return Errorf(CodeConflict, "approval %s is %s, not %s", a.ID, cur.State, a.State)
	}
	if _, err := tx.appendEvent(transitionEvent(a.RunID, "approval", string(a.ID), a.State, to, actor,
		map[string]any{"action_id": a.ActionID, "action_digest": a.ActionDigest, "reason": reason}).
		bind(ApprovalContentOf(moved))); err != nil {
		return err
	}
	return tx.resumeAfterApproval(a.RunID, actor)
}

// DecideApproval implements Store.
func (s *DB) DecideApproval(ctx context.Context, p DecideApprovalParams) (DecideApprovalResult, error) {
	var to ApprovalState
	var actionTo ActionState
	switch p.Decision {
	case DecisionGrant:
		to, actionTo = ApprovalGranted, ActionApproved
	case DecisionDeny:
		to, actionTo = ApprovalDenied, ActionDenied
	default:
		return DecideApprovalResult{}, Errorf(CodeInvalid, "decide approval: decision must be grant or deny, not %q", p.Decision)
	}
	if p.Principal == "" {
		return DecideApprovalResult{}, Errorf(CodeInvalid, "decide approval: principal is required")
	}
	if !p.ActionDigest.Valid() {
		return DecideApprovalResult{}, Errorf(CodeInvalid, "decide approval: action digest must be sha256:<64 hex>")
	}
	var out DecideApprovalResult
	err := s.inTx(ctx, "decide_approval", func(tx *txn) error {
		out = DecideApprovalResult{} // a driver may run the write again
		action, err := tx.findAction(p.ActionID)
		if err != nil {
			return err
		}
		apr, err := tx.pendingApproval(p.ActionID)
		if Code(err) == CodeConflict {
			return Errorf(CodeConflict, "action %s is %s: no approval is pending", p.ActionID, action.State)
		}
		if err != nil {
			return err
		}
		if apr.ActionDigest != p.ActionDigest {
			return Errorf(CodeConflict, "digest mismatch: action %s is bound to %s, not %s", p.ActionID, apr.ActionDigest, p.ActionDigest)
		}
		if apr.ExpiresAt != nil && !tx.now.Before(*apr.ExpiresAt) {
			return Errorf(CodeConflict, "approval %s expired at %s", apr.ID, apr.ExpiresAt.Format("2006-01-02T15:04:05Z07:00"))
		}
		if err := tx.transitionApproval(apr, to, p.Principal, p.Reason, &p.Principal); err != nil {
			return err
		}
		if err := tx.transitionAction(ActionTransition{ID: p.ActionID, From: ActionAwaitingApproval, To: actionTo,
			Actor: p.Principal, Data: map[string]any{"approval_id": apr.ID}}); err != nil {
			return err
		}
		if out.Action, err = tx.findAction(p.ActionID); err != nil {
			return err
		}
		out.Approval, err = tx.findApproval(apr.ID)
		return err
	})
	return out, err
}

// ExpireApprovals implements Store.
func (s *DB) ExpireApprovals(ctx context.Context) ([]*Approval, error) {
	// The engine asks on every pass of its pool; nearly always nothing is
	// due, which a reader answers without taking the writer's lock.
	anyDue := func(r Reader) (bool, error) {
		due, err := r.ListDueApprovals(ctx, s.now())
		return len(due) > 0, err
	}
	var out []*Approval
	err := s.inTxIf(ctx, "expire_approvals", anyDue, func(tx *txn) error {
		out = nil // a driver may run the write again
		due, err := tx.d.ListDueApprovals(tx.ctx, tx.now)
		if err != nil {
			return err
		}
		for _, apr := range due {
			if err := tx.transitionApproval(apr, ApprovalExpired, "ledger", "approval TTL passed", nil); err != nil {
				return err
			}
			if err := tx.transitionAction(ActionTransition{ID: apr.ActionID, From: ActionAwaitingApproval, To: ActionExpired,
				Actor: "ledger", Data: map[string]any{"approval_id": apr.ID}}); err != nil {
				return err
			}
			got, err := tx.findApproval(apr.ID)
			if err != nil {
				return err
			}
			out = append(out, got)
		}
		return nil
	})
	return out, err
}

// resumeAfterApproval moves a run waiting for approval back to running once
// none of its approvals is pending (granted, denied, expired or invalidated), so whoever drives runs (the engine's
// workers, in this or another process) finds it runnable: a decision or an
// expiry is always the engine's to act on, and a run's state never claims it
// waits for a person when it does not.
func (tx *txn) resumeAfterApproval(run RunID, actor string) error {
	pending, err := tx.d.CountPendingApprovals(tx.ctx, run)
	if err != nil || pending > 0 {
		return err
	}
	r, err := tx.d.GetRun(tx.ctx, run)
	if err != nil {
		return err
	}
	if r.State != RunAwaitingApproval {
		return nil
	}
	return tx.transitionRun(RunTransition{ID: run, From: RunAwaitingApproval, To: RunRunning, Actor: actor,
		Data: map[string]any{"cause": "approval settled"}})
}

func (tx *txn) findApproval(id ApprovalID) (*Approval, error) { return tx.d.GetApproval(tx.ctx, id) }

// FindApprovals implements Store.
func (s *DB) FindApprovals(ctx context.Context, f ApprovalFilter) ([]*Approval, error) {
	return read(ctx, s, "find_approvals", func(r Reader) ([]*Approval, error) { return r.ListApprovals(ctx, f) })
}
