package ledger

import (
	"context"
	"fmt"
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
// resumes if no other approval of it is pending. executeBy, if set, is the
// granted approval's execute_by.
func (tx *txn) transitionApproval(a *Approval, to ApprovalState, actor, reason string, decidedBy *string, executeBy *time.Time) error {
	if err := ValidateApprovalTransition(a.State, to); err != nil {
		return err
	}
	var by string
	if decidedBy != nil {
		by = *decidedBy
	}
	moved, ok, err := tx.d.MoveApproval(tx.ctx, a.ID, a.State, to, tx.now, reason, by, executeBy)
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
	data := map[string]any{"action_id": a.ActionID, "action_digest": a.ActionDigest, "reason": reason}
	if moved.ExecuteBy != nil {
		data["execute_by"] = *moved.ExecuteBy
	}
	if _, err := tx.appendEvent(transitionEvent(a.RunID, "approval", string(a.ID), a.State, to, actor, data).
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
	if p.ExecuteWithin < 0 {
		return DecideApprovalResult{}, Errorf(CodeInvalid, "decide approval: execute within cannot be negative")
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
			return tx.noPendingApproval(action)
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
		var executeBy *time.Time
		if to == ApprovalGranted && p.ExecuteWithin > 0 {
			by := tx.now.Add(p.ExecuteWithin.Truncate(time.Microsecond))
			executeBy = &by
		}
		if err := tx.transitionApproval(apr, to, p.Principal, p.Reason, &p.Principal, executeBy); err != nil {
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
			if err := tx.transitionApproval(apr, ApprovalExpired, "ledger", "approval TTL passed", nil, nil); err != nil {
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

// noPendingApproval is DecideApproval's refusal of an action with no
// pending approval; for an approved action whose approval passed its
// execute_by it says that a new one is asked at the next begin, so that a
// person approving it again learns why nothing is pending.
func (tx *txn) noPendingApproval(action *Action) error {
	if action.State == ActionApproved {
		granted, err := tx.d.GrantedApproval(tx.ctx, action.ID)
		switch {
		case err == nil && granted.ExecuteBy != nil && !tx.now.Before(*granted.ExecuteBy):
			return Errorf(CodeConflict, "action %s is approved, but its approval %s passed its execute_by %s: a new approval is asked when it next begins",
				action.ID, granted.ID, granted.ExecuteBy.Format(time.RFC3339))
		case err != nil && Code(err) != CodeNotFound:
			return err
		}
	}
	return Errorf(CodeConflict, "action %s is %s: no approval is pending", action.ID, action.State)
}

// checkNotStale refuses (CodeApprovalStale) an attempt of an approved
// action whose newest granted approval passed its execute_by. An action
// with no granted approval (the rules approved it) or whose approval has
// no execute_by is not refused.
func (tx *txn) checkNotStale(action *Action) error {
	granted, err := tx.d.GrantedApproval(tx.ctx, action.ID)
	switch {
	case Code(err) == CodeNotFound:
		return nil
	case err != nil:
		return err
	case granted.ExecuteBy != nil && !tx.now.Before(*granted.ExecuteBy):
		return Errorf(CodeApprovalStale, "action %s: its approval %s passed its execute_by %s: it needs a new approval",
			action.ID, granted.ID, granted.ExecuteBy.Format(time.RFC3339))
	}
	return nil
}

// ReaskApproval implements Store.
func (s *DB) ReaskApproval(ctx context.Context, p ReaskApprovalParams) (ReaskApprovalResult, error) {
	switch {
	case p.Reason == "":
		return ReaskApprovalResult{}, Errorf(CodeInvalid, "reask approval: a reason is required")
	case p.ApprovalTTL < 0:
		return ReaskApprovalResult{}, Errorf(CodeInvalid, "reask approval: the approval TTL cannot be negative")
	}
	if err := checkText("reason", p.Reason, MaxGateReasonLength); err != nil {
		return ReaskApprovalResult{}, fmt.Errorf("reask approval: %w", err)
	}
	var out ReaskApprovalResult
	err := s.inTx(ctx, "reask_approval", func(tx *txn) error {
		out = ReaskApprovalResult{} // a driver may run the write again
		action, err := tx.findAction(p.ActionID)
		if err != nil {
			return err
		}
		if action.State != ActionApproved {
			return Errorf(CodeConflict, "action %s is %s: only an approved action is asked for approval again", action.ID, action.State)
		}
		granted, err := tx.d.GrantedApproval(tx.ctx, action.ID)
		switch {
		case err == nil && granted.StaleAt == nil:
			stale, ok, err := tx.d.StaleApproval(tx.ctx, granted.ID, tx.now, p.Reason)
			if err != nil {
				return err
			}
			if !ok {
				return Errorf(CodeConflict, "approval %s is no longer granted and current", granted.ID)
			}
			if _, err := tx.appendEvent(eventSpec{RunID: action.RunID, Type: "approval.stale", EntityType: "approval",
				EntityID: string(stale.ID), Actor: p.Actor,
				Data: map[string]any{"action_id": action.ID, "action_digest": stale.ActionDigest, "reason": p.Reason}}.
				bind(ApprovalContentOf(stale))); err != nil {
				return err
			}
			out.Stale = stale
		case err != nil && Code(err) != CodeNotFound:
			return err
		}
		data := map[string]any{"cause": "reask", "reason": p.Reason}
		if out.Stale != nil {
			data["stale_approval_id"] = out.Stale.ID
		}
		if out.Action, err = tx.moveAction(ActionTransition{ID: action.ID, From: ActionApproved, To: ActionAwaitingApproval,
			ApprovalTTL: p.ApprovalTTL, Actor: p.Actor, Data: data}, 0); err != nil {
			return err
		}
		out.Approval, err = tx.pendingApproval(action.ID)
		return err
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
