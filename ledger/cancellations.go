package ledger

import (
	"context"
	"database/sql"

	"gorm.io/gorm"
)

// cancellationTimeColumn is the column that records when each fact became
// true.
var cancellationTimeColumn = map[CancellationState]string{
	CancelAccepted: "accepted_at",
	CancelStopping: "stopping_at",
	CancelStopped:  "stopped_at",
}

// RequestCancel implements Store.
func (s *GormStore) RequestCancel(ctx context.Context, p RequestCancelParams) (RequestCancelResult, error) {
	if p.Principal == "" {
		return RequestCancelResult{}, Errorf(CodeInvalid, "request cancel: principal is required")
	}
	var out RequestCancelResult
	err := s.inTx(ctx, "request cancel", func(tx *txn) error {
		existing, err := tx.findCancellation(p.RunID)
		switch {
		case err == nil:
			out = RequestCancelResult{Cancellation: existing}
			return nil
		case Code(err) != CodeNotFound:
			return err
		}
		run, err := tx.findRun(p.RunID)
		if err != nil {
			return err
		}
		if run.State.Terminal() {
			return Errorf(CodeConflict, "run %s is already %s (%s): nothing to cancel", run.ID, run.State, run.StopReason)
		}
		row := cancellationRow{
			ID: tx.newID(PrefixCancellation), RunID: string(run.ID), Tenant: run.Tenant, State: string(CancelRequested),
			RequestedBy: p.Principal, Reason: strPtr(p.Reason), Version: 1, RequestedAt: micros(tx.now),
		}
		if err := tx.db.Create(&row).Error; err != nil {
			return err
		}
		c := row.toCancellation()
		if _, err := tx.appendEvent(transitionEvent(run.ID, "cancellation", row.ID, CancellationState(""), CancelRequested,
			p.Principal, map[string]any{"reason": p.Reason}).bind(CancellationContentOf(c))); err != nil {
			return err
		}
		out = RequestCancelResult{Cancellation: c, Created: true}
		return nil
	})
	return out, err
}

// TransitionCancellation implements Store.
func (s *GormStore) TransitionCancellation(ctx context.Context, p CancellationTransition) (*Cancellation, error) {
	if err := ValidateCancellationTransition(p.From, p.To); err != nil {
		return nil, wrapErr("transition cancellation", err)
	}
	var out *Cancellation
	err := s.inTx(ctx, "transition cancellation", func(tx *txn) error {
		if p.To == CancelStopped {
			if err := tx.checkNothingInFlight(p.RunID); err != nil {
				return err
			}
		}
		res := tx.db.Model(&cancellationRow{}).Where("run_id = ? AND state = ?", p.RunID, p.From).Updates(map[string]any{
			"state": p.To, cancellationTimeColumn[p.To]: micros(tx.now), "version": gorm.Expr("version + 1"),
		})
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			c, err := tx.findCancellation(p.RunID)
			if err != nil {
				return err
			}
			return Errorf(CodeConflict, "cancellation of run %s is %s, not %s", p.RunID, c.State, p.From)
		}
		c, err := tx.findCancellation(p.RunID)
		if err != nil {
			return err
		}
		if _, err := tx.appendEvent(transitionEvent(p.RunID, "cancellation", string(c.ID), p.From, p.To, p.Actor, nil).
			bind(CancellationContentOf(c))); err != nil {
			return err
		}
		out = c
		return nil
	})
	return out, err
}

// checkNothingInFlight is the condition for confirming a cancellation
// (DESIGN.md section 3): no attempt of the run is still started with an
// unknown effect. An attempt whose effect a query established may still be
// open; one handed to review has been finished as uncertain.
func (tx *txn) checkNothingInFlight(run RunID) error {
	var open []string
	if err := tx.db.Model(&attemptRow{}).Where("run_id = ? AND status = ? AND effect = ?", run, AttemptStarted, EffectUnknown).
		Limit(3).Pluck("id", &open).Error; err != nil {
		return err
	}
	if len(open) > 0 {
		return Errorf(CodeConflict, "cancellation of run %s cannot be confirmed: attempt %s is in flight with an unknown effect", run, open[0])
	}
	return nil
}

func (tx *txn) findCancellation(run RunID) (*Cancellation, error) {
	rows, err := tx.query(findCancellationSQL, string(run))
	return scanCancellation(rows, err, run)
}

var findCancellationSQL = writeStmt(`SELECT id, run_id, tenant, state, requested_by, reason, version, requested_at,
	accepted_at, stopping_at, stopped_at FROM cancellations WHERE run_id = ?`)

// scanCancellation scans the answer of findCancellationSQL.
func scanCancellation(rows *sql.Rows, err error, run RunID) (*Cancellation, error) {
	var r cancellationRow
	err = scanOne(rows, err, "cancellation of run "+string(run), func(rows *sql.Rows) error {
		return rows.Scan(&r.ID, &r.RunID, &r.Tenant, &r.State, &r.RequestedBy, &r.Reason, &r.Version, &r.RequestedAt,
			&r.AcceptedAt, &r.StoppingAt, &r.StoppedAt)
	})
	if err != nil {
		return nil, err
	}
	return r.toCancellation(), nil
}

// FindCancellation implements Store.
func (s *GormStore) FindCancellation(ctx context.Context, run RunID) (*Cancellation, error) {
	rows, err := s.rs.query(ctx, findCancellationSQL.sql, string(run))
	c, err := scanCancellation(rows, err, run)
	if err != nil {
		return nil, wrapErr("find cancellation", err)
	}
	return c, nil
}
