package ledger

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"gorm.io/gorm"
)

// openApproval opens the pending approval of an action that just entered
// awaiting_approval, bound to its digest.
func (tx *txn) openApproval(a *actionRow, ttl time.Duration, actor string) (*Approval, error) {
	row := approvalRow{
		ID: tx.newID(PrefixApproval), ActionID: a.ID, RunID: a.RunID, Tenant: a.Tenant,
		ActionDigest: a.ActionDigest, State: string(ApprovalPending), Version: 1, RequestedAt: micros(tx.now),
	}
	if us := ttl.Microseconds(); us > 0 {
		exp := micros(tx.now) + us
		row.ExpiresAt = &exp
	}
	if err := tx.db.Create(&row).Error; err != nil {
		return nil, err
	}
	data := map[string]any{"action_id": a.ID, "action_digest": a.ActionDigest}
	if row.ExpiresAt != nil {
		data["expires_at"] = fromMicros(*row.ExpiresAt)
	}
	apr := row.toApproval()
	if _, err := tx.appendEvent(transitionEvent(RunID(a.RunID), "approval", row.ID, ApprovalState(""), ApprovalPending, actor, data).
		bind(ApprovalContentOf(apr))); err != nil {
		return nil, err
	}
	return apr, nil
}

// pendingApproval returns an action's pending approval; CodeConflict if it
// has none.
func (tx *txn) pendingApproval(action ActionID) (*Approval, error) {
	var row approvalRow
	err := tx.db.Where("action_id = ? AND state = ?", action, ApprovalPending).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, Errorf(CodeConflict, "action %s has no pending approval", action)
	}
	if err != nil {
		return nil, err
	}
	return row.toApproval(), nil
}

// transitionApproval is the one place an approval's state changes.
func (tx *txn) transitionApproval(a *Approval, to ApprovalState, actor, reason string, decidedBy *string) error {
	if err := ValidateApprovalTransition(a.State, to); err != nil {
		return err
	}
	var row approvalRow
	rows, err := tx.query(decideApprovalSQL, string(to), micros(tx.now), strPtr(reason), decidedBy, string(a.ID), string(a.State))
	err = scanOne(rows, err, "approval "+string(a.ID), func(rows *sql.Rows) error { return rows.Scan(row.targets()...) })
	if Code(err) == CodeNotFound {
		return tx.staleState(&approvalRow{}, "approval", string(a.ID), string(a.State))
	}
	if err != nil {
		return err
	}
	if _, err := tx.appendEvent(transitionEvent(a.RunID, "approval", string(a.ID), a.State, to, actor,
		map[string]any{"action_id": a.ActionID, "action_digest": a.ActionDigest, "reason": reason}).
		bind(ApprovalContentOf(row.toApproval()))); err != nil {
		return err
	}
	return tx.resumeAfterApproval(a.RunID, actor)
}

// decideApprovalSQL settles an approval (decided_by only when given) and
// hands back its row, whose content the event binds.
var decideApprovalSQL = writeStmt(`UPDATE approvals SET state = ?, version = version + 1, decided_at = ?, reason = ?,
	decided_by = COALESCE(?, decided_by) WHERE id = ? AND state = ? RETURNING ` + approvalCols)

// DecideApproval implements Store.
func (s *GormStore) DecideApproval(ctx context.Context, p DecideApprovalParams) (DecideApprovalResult, error) {
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
	err := s.inTx(ctx, "decide approval", func(tx *txn) error {
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
func (s *GormStore) ExpireApprovals(ctx context.Context) ([]*Approval, error) {
	// The engine asks on every pass of its pool; nearly always nothing is
	// due, which a reader answers without taking the writer's lock.
	rows, err := s.rs.query(ctx, anyDueSQL, string(ApprovalPending), micros(s.now()))
	var due bool
	if err := scanOne(rows, err, "due approvals", func(rows *sql.Rows) error { return rows.Scan(&due) }); err != nil {
		return nil, wrapErr("expire approvals", err)
	}
	if !due {
		return nil, nil
	}
	var out []*Approval
	err = s.inTx(ctx, "expire approvals", func(tx *txn) error {
		var rows []approvalRow
		if err := tx.db.Where("state = ? AND expires_at IS NOT NULL AND expires_at <= ?", ApprovalPending, micros(tx.now)).
			Order("id").Find(&rows).Error; err != nil {
			return err
		}
		for i := range rows {
			apr := rows[i].toApproval()
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

const anyDueSQL = `SELECT EXISTS (SELECT 1 FROM approvals WHERE state = ? AND expires_at IS NOT NULL AND expires_at <= ?)`

// resumeAfterApproval moves a run waiting for approval back to running once
// none of its approvals is pending (granted, denied, expired or invalidated), so whoever drives runs (the engine's
// workers, in this or another process) finds it runnable: a decision or an
// expiry is always the engine's to act on, and a run's state never claims it
// waits for a person when it does not.
func (tx *txn) resumeAfterApproval(run RunID, actor string) error {
	var pending int64
	if err := tx.db.Model(&approvalRow{}).Where("run_id = ? AND state = ?", run, ApprovalPending).Count(&pending).Error; err != nil {
		return err
	}
	if pending > 0 {
		return nil
	}
	var state string
	if err := tx.db.Model(&runRow{}).Select("state").Where("id = ?", run).Take(&state).Error; err != nil {
		return err
	}
	if RunState(state) != RunAwaitingApproval {
		return nil
	}
	return tx.transitionRun(RunTransition{ID: run, From: RunAwaitingApproval, To: RunRunning, Actor: actor,
		Data: map[string]any{"cause": "approval settled"}})
}

func (tx *txn) findApproval(id ApprovalID) (*Approval, error) {
	var row approvalRow
	if err := tx.db.Where("id = ?", id).Take(&row).Error; err != nil {
		return nil, err
	}
	return row.toApproval(), nil
}

// FindApprovals implements Store.
func (s *GormStore) FindApprovals(ctx context.Context, f ApprovalFilter) ([]*Approval, error) {
	var rows []approvalRow
	if err := approvalsQuery(s.r.WithContext(ctx), f).Find(&rows).Error; err != nil {
		return nil, wrapErr("find approvals", err)
	}
	out := make([]*Approval, len(rows))
	for i := range rows {
		out[i] = rows[i].toApproval()
	}
	return out, nil
}

// approvalsQuery is FindApprovals' query.
func approvalsQuery(db *gorm.DB, f ApprovalFilter) *gorm.DB {
	q := db.Model(&approvalRow{})
	if f.Tenant != nil {
		q = q.Where("tenant = ?", *f.Tenant)
	}
	if f.State != nil {
		q = q.Where("state = ?", *f.State)
	}
	if f.ActionID != nil {
		q = q.Where("action_id = ?", *f.ActionID)
	}
	if f.RunID != nil {
		q = q.Where("run_id = ?", *f.RunID)
	}
	if f.AfterID != nil {
		q = q.Where("id > ?", *f.AfterID)
	}
	if f.Limit > 0 {
		q = q.Limit(f.Limit)
	}
	return q.Order("id")
}
