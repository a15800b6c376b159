package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"gorm.io/gorm"
)

// StartAttempt implements Store. Retry semantics: every call that succeeds
// makes a new attempt with the next number, so a caller that crashed after
// StartAttempt committed must not call it again for the same try; recovery
// finds the started attempt instead. The budget checks and the increments
// are in the same IMMEDIATE transaction, so no interleaving of processes can
// exceed a budget.
func (s *GormStore) StartAttempt(ctx context.Context, p StartAttemptParams) (*Attempt, error) {
	var out *Attempt
	err := s.inTx(ctx, "start attempt", func(tx *txn) error {
		var err error
		out, err = tx.startAttempt(p)
		return err
	})
	return out, err
}

// startAttempt checks everything that may refuse the attempt before it
// writes anything, so a refusal leaves the transaction untouched (which
// CreateAction relies on when it starts the attempt of the action it
// records).
func (tx *txn) startAttempt(p StartAttemptParams) (*Attempt, error) {
	action, err := tx.findAction(p.ActionID)
	if err != nil {
		return nil, err
	}
	switch action.State {
	case ActionApproved:
	case ActionProposed, ActionAwaitingApproval:
		return nil, Errorf(CodeApprovalRequired, "action %s is %s: it needs an approval first", action.ID, action.State)
	default:
		return nil, Errorf(CodeConflict, "action %s is %s, not approved", action.ID, action.State)
	}
	run, err := tx.findRun(action.RunID)
	if err != nil {
		return nil, err
	}
	return tx.startAttemptOf(action, run, p.Actor)
}

// startAttemptOf starts the attempt of action, approved, of run, both as
// this write last wrote them (CreateAction, which has just written them,
// passes them instead of reading them back).
func (tx *txn) startAttemptOf(action *Action, run *Run, actor string) (*Attempt, error) {
	if run.State != RunRunning {
		return nil, Errorf(CodeConflict, "run %s is %s: no attempt starts", run.ID, run.State)
	}
	var cancelled bool
	rows, err := tx.query(cancelAcceptedSQL, string(run.ID), string(CancelRequested))
	if err := scanOne(rows, err, "cancellation", func(rows *sql.Rows) error { return rows.Scan(&cancelled) }); err != nil {
		return nil, err
	}
	if cancelled {
		return nil, Errorf(CodeConflict, "run %s: cancellation accepted, no new attempt starts", run.ID)
	}
	if err := checkAttemptBudget(run.Budget, action, tx); err != nil {
		return nil, err
	}
	// From here on it writes.
	no := action.AttemptCount + 1
	if _, err := tx.moveAction(ActionTransition{ID: action.ID, From: ActionApproved, To: ActionRunning, Actor: actor,
		Data: map[string]any{"attempt_no": no}}, no); err != nil {
		return nil, err
	}
	row := attemptRow{
		ID: tx.newID(PrefixAttempt), ActionID: string(action.ID), RunID: string(action.RunID), AttemptNo: no,
		Status: string(AttemptStarted), Effect: string(EffectUnknown), Version: 1, StartedAt: micros(tx.now),
	}
	if _, err := tx.exec(insertAttemptSQL, row.ID, row.ActionID, row.RunID, row.AttemptNo, row.Status, row.Effect,
		row.Version, row.StartedAt); err != nil {
		return nil, err
	}
	if _, err := tx.exec(countAttemptSQL, string(run.ID)); err != nil {
		return nil, err
	}
	// run's budget is as this write read it (or, in CreateAction, as its
	// usage left it), so after the count it is that with one more attempt.
	budget := run.Budget
	budget.Used.Attempts++
	att, err := row.toAttempt()
	if err != nil {
		return nil, err
	}
	// The attempt's event also binds the budget it counted against.
	if _, err := tx.appendEvent(transitionEvent(action.RunID, "attempt", row.ID, AttemptStatus(""), AttemptStarted, actor,
		map[string]any{"action_id": action.ID, "attempt_no": no, "dedup_key": action.DedupKey}).
		bind(AttemptContentOf(att), BudgetContentOf(run.ID, budget))); err != nil {
		return nil, err
	}
	return att, nil
}

// spend runs one of the statements that count an attempt against a run's
// budget and returns the budget after it.
func (tx *txn) spend(s *stmt, args ...any) (*budgetRow, error) {
	var b budgetRow
	rows, err := tx.query(s, args...)
	if err := scanOne(rows, err, "budget", func(rows *sql.Rows) error { return rows.Scan(b.targets()...) }); err != nil {
		return nil, err
	}
	return &b, nil
}

var (
	cancelAcceptedSQL = writeStmt(`SELECT EXISTS (SELECT 1 FROM cancellations WHERE run_id = ? AND state <> ?)`)
	insertAttemptSQL  = writeStmt(`INSERT INTO attempts (id, action_id, run_id, attempt_no, status, effect, version, started_at)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?)`)
	countAttemptSQL = writeStmt(`UPDATE budgets SET attempts_used = attempts_used + 1, version = version + 1 WHERE run_id = ?`)
)

// checkAttemptBudget refuses another attempt when a persisted budget is
// spent: attempts per action, attempts per run, execution time, deadline.
func checkAttemptBudget(b Budget, a *Action, tx *txn) error {
	l, u := b.Limits, b.Used
	switch {
	case l.MaxAttemptsPerAction > 0 && a.AttemptCount >= l.MaxAttemptsPerAction:
		return Errorf(CodeBudgetExceeded, "action %s used %d of %d attempts", a.ID, a.AttemptCount, l.MaxAttemptsPerAction)
	case l.MaxAttemptsPerRun > 0 && u.Attempts >= l.MaxAttemptsPerRun:
		return Errorf(CodeBudgetExceeded, "run %s used %d of %d attempts", a.RunID, u.Attempts, l.MaxAttemptsPerRun)
	case l.MaxExecution > 0 && u.Execution >= l.MaxExecution:
		return Errorf(CodeBudgetExceeded, "run %s used %s of %s execution time", a.RunID, u.Execution, l.MaxExecution)
	case b.Deadline != nil && !tx.now.Before(*b.Deadline):
		return Errorf(CodeBudgetExceeded, "run %s passed its deadline %s", a.RunID, b.Deadline.Format("2006-01-02T15:04:05Z07:00"))
	}
	return nil
}

// FinishAttempt implements Store.
func (s *GormStore) FinishAttempt(ctx context.Context, p FinishAttemptParams) (FinishAttemptResult, error) {
	if p.Status == AttemptStarted || !p.Status.Valid() {
		return FinishAttemptResult{}, Errorf(CodeInvalid, "finish attempt: %q is not an outcome", p.Status)
	}
	var result []byte
	if len(p.Result) > 0 {
		var err error
		if result, err = Canonicalize(p.Result); err != nil {
			return FinishAttemptResult{}, fmt.Errorf("finish attempt: result: %w", err)
		}
	}
	var out FinishAttemptResult
	err := s.inTx(ctx, "finish attempt", func(tx *txn) error {
		att, err := tx.findAttempt(p.AttemptID)
		if err != nil {
			return err
		}
		if p.Lease != nil {
			if err := tx.completeLease(att.ID, p.Lease); err != nil {
				return err
			}
		}
		action, obs, err := tx.finishAttempt(att, attemptOutcome{Status: p.Status, Result: result, Error: p.Error,
			Observation: p.Observation, ActionState: p.ActionState, Actor: p.Actor})
		if err != nil {
			return err
		}
		out.Action, out.Observation = action.toAction(), obs
		out.Attempt, err = tx.findAttempt(att.ID)
		return err
	})
	return out, err
}

// attemptOutcome is how an attempt ended, as finishAttempt records it.
type attemptOutcome struct {
	Status      AttemptStatus
	Result      []byte // canonical JSON, or nil
	Error       *AttemptError
	Observation *ObservationInput // what the answer established, if anything
	ActionState ActionState       // where the action goes from running
	Actor       string
}

// finishAttempt closes the started attempt att (FinishAttempt, and
// recovery closing an interrupted one): its outcome, its duration added to
// the run's execution budget, its event, the observation if any, and the
// action moved from running to o.ActionState, which it returns with the
// observation.
func (tx *txn) finishAttempt(att *Attempt, o attemptOutcome) (*actionRow, *Observation, error) {
	var errJSON *string
	if o.Error != nil {
		b, err := json.Marshal(o.Error)
		if err != nil {
			return nil, nil, Errorf(CodeInvalid, "attempt error: %w", err)
		}
		errJSON = rawPtr(b)
	}
	if err := ValidateAttemptTransition(att.Status, o.Status); err != nil {
		if att.Status != AttemptStarted {
			return nil, nil, Errorf(CodeConflict, "attempt %s already finished as %s", att.ID, att.Status)
		}
		return nil, nil, err
	}
	finished, err := tx.execOne(finishAttemptSQL, string(o.Status), rawPtr(o.Result), errJSON, micros(tx.now),
		string(att.ID), string(AttemptStarted))
	if err != nil {
		return nil, nil, err
	}
	if !finished {
		return nil, nil, tx.staleAttempt(att.ID, AttemptStarted)
	}
	// att was read in this transaction and the guarded UPDATE matched it,
	// so the row now is att with the outcome: its content needs no read.
	now := tx.now
	att.Status, att.Result, att.Error, att.FinishedAt = o.Status, o.Result, o.Error, &now
	// The attempt's time counts against the run's execution budget.
	spent := tx.now.Sub(att.StartedAt).Microseconds()
	budget, err := tx.spend(spendExecutionSQL, max(spent, 0), string(att.RunID))
	if err != nil {
		return nil, nil, err
	}
	data := map[string]any{"action_id": att.ActionID, "attempt_no": att.No, "duration_us": spent}
	if o.Error != nil {
		data["error"] = o.Error
	}
	if _, err := tx.appendEvent(transitionEvent(att.RunID, "attempt", string(att.ID), AttemptStarted, o.Status, o.Actor, data).
		bind(AttemptContentOf(att), budget.content())); err != nil {
		return nil, nil, err
	}
	var obs *Observation
	if o.Observation != nil {
		if obs, err = tx.observe(att, o.Observation.Source, o.Observation.Effect, o.Observation.Detail, o.Actor); err != nil {
			return nil, nil, err
		}
	}
	action, err := tx.moveAction(ActionTransition{ID: att.ActionID, From: ActionRunning, To: o.ActionState, Actor: o.Actor,
		Data: map[string]any{"attempt_id": att.ID}}, 0)
	if err != nil {
		return nil, nil, err
	}
	return action, obs, nil
}

var (
	finishAttemptSQL = writeStmt(`UPDATE attempts SET status = ?, result = ?, error = ?, finished_at = ?, version = version + 1
	WHERE id = ? AND status = ?`)
	spendExecutionSQL = writeStmt(`UPDATE budgets SET execution_used_us = execution_used_us + ?, version = version + 1
	WHERE run_id = ? RETURNING ` + budgetCols)
)

// RecordObservation implements Store.
func (s *GormStore) RecordObservation(ctx context.Context, p RecordObservationParams) (*Observation, *Attempt, error) {
	var obs *Observation
	var att *Attempt
	err := s.inTx(ctx, "record observation", func(tx *txn) error {
		a, err := tx.findAttempt(p.AttemptID)
		if err != nil {
			return err
		}
		if p.DecisionID != "" {
			if err := tx.answerDecision(a.ActionID, p.DecisionID); err != nil {
				return err
			}
		}
		if obs, err = tx.observe(a, p.Source, p.Effect, p.Detail, p.Actor); err != nil {
			return err
		}
		att, err = tx.findAttempt(p.AttemptID)
		return err
	})
	return obs, att, err
}

// observe appends an observation about att and, if it establishes an effect
// the attempt did not know yet, writes that effect fact on the attempt.
func (tx *txn) observe(att *Attempt, src ObservationSource, effect EffectFact, detail json.RawMessage, actor string) (*Observation, error) {
	if !src.Valid() {
		return nil, Errorf(CodeInvalid, "observation source %q is not known", src)
	}
	if !effect.Valid() {
		return nil, Errorf(CodeInvalid, "observation effect %q is not known", effect)
	}
	var canon []byte
	if len(detail) > 0 {
		var err error
		if canon, err = Canonicalize(detail); err != nil {
			return nil, fmt.Errorf("observation detail: %w", err)
		}
	}
	switch {
	case effect == EffectUnknown, effect == att.Effect:
	case att.Effect != EffectUnknown:
		return nil, Errorf(CodeConflict, "attempt %s effect is already %s; %s evidence saying %s needs a person",
			att.ID, att.Effect, src, effect)
	}
	row := observationRow{
		ID: tx.newID(PrefixObservation), RunID: string(att.RunID), ActionID: string(att.ActionID),
		AttemptID: strPtr(string(att.ID)), Source: string(src), Effect: string(effect), Detail: rawPtr(canon),
		ObservedAt: micros(tx.now),
	}
	if _, err := tx.exec(insertObservationSQL, row.ID, row.RunID, row.ActionID, row.AttemptID, row.Source, row.Effect,
		row.Detail, row.ObservedAt); err != nil {
		return nil, err
	}
	obs := row.toObservation()
	if _, err := tx.appendEvent(eventSpec{RunID: att.RunID, Type: "observation.recorded", EntityType: "observation",
		EntityID: row.ID, Actor: actor, Data: map[string]any{"attempt_id": att.ID, "source": src, "effect": effect}}.
		bind(ObservationContentOf(obs))); err != nil {
		return nil, err
	}
	if effect != EffectUnknown && att.Effect == EffectUnknown {
		if err := ValidateEffectTransition(att.Effect, effect); err != nil {
			return nil, err
		}
		set, err := tx.execOne(setEffectSQL, string(effect), row.ID, string(att.ID), string(EffectUnknown))
		if err != nil {
			return nil, err
		}
		if !set {
			return nil, Errorf(CodeConflict, "attempt %s effect changed underneath", att.ID)
		}
		// As in finishAttempt, the row is att (as this write last read or
		// wrote it) with the effect.
		att.Effect, att.EffectObservation = effect, ObservationID(row.ID)
		if _, err := tx.appendEvent(eventSpec{RunID: att.RunID, Type: "attempt.effect_" + string(effect), EntityType: "attempt",
			EntityID: string(att.ID), From: string(EffectUnknown), To: string(effect), Actor: actor,
			Data: map[string]any{"observation_id": row.ID, "source": src}}.bind(AttemptContentOf(att))); err != nil {
			return nil, err
		}
	}
	return obs, nil
}

var (
	insertObservationSQL = writeStmt(`INSERT INTO observations (id, run_id, action_id, attempt_id, source, effect, detail,
	observed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`)
	setEffectSQL = writeStmt(`UPDATE attempts SET effect = ?, effect_observation_id = ?, version = version + 1
	WHERE id = ? AND effect = ?`)
)

func (tx *txn) staleAttempt(id AttemptID, from AttemptStatus) error {
	a, err := tx.findAttempt(id)
	if err != nil {
		return err
	}
	return Errorf(CodeConflict, "attempt %s is %s, not %s", id, a.Status, from)
}

func (tx *txn) findAttempt(id AttemptID) (*Attempt, error) {
	var row attemptRow
	rows, err := tx.query(findAttemptSQL, string(id))
	if err := scanOne(rows, err, "attempt "+string(id), func(rows *sql.Rows) error { return scanAttempt(rows, &row) }); err != nil {
		return nil, err
	}
	return row.toAttempt()
}

var findAttemptSQL = writeStmt(`SELECT ` + attemptCols + ` FROM attempts WHERE id = ?`)

// FindAttempts implements Store.
func (s *GormStore) FindAttempts(ctx context.Context, f AttemptFilter) ([]*Attempt, error) {
	var w where
	if f.ActionID != nil {
		w.eq("action_id", string(*f.ActionID))
	}
	if f.RunID != nil {
		w.eq("run_id", string(*f.RunID))
	}
	if f.Status != nil {
		w.eq("status", string(*f.Status))
	}
	rows, err := s.rs.query(ctx, w.query(`SELECT `+attemptCols+` FROM attempts`, "action_id, attempt_no", f.Limit), w.args...)
	if err != nil {
		return nil, wrapErr("find attempts", err)
	}
	defer rows.Close()
	out := []*Attempt{}
	for rows.Next() {
		var r attemptRow
		if err := scanAttempt(rows, &r); err != nil {
			return nil, wrapErr("find attempts", err)
		}
		a, err := r.toAttempt()
		if err != nil {
			return nil, wrapErr("find attempts", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, wrapErr("find attempts", err)
	}
	return out, nil
}

// FindObservations implements Store.
func (s *GormStore) FindObservations(ctx context.Context, f ObservationFilter) ([]*Observation, error) {
	var rows []observationRow
	if err := observationsQuery(s.r.WithContext(ctx), f).Find(&rows).Error; err != nil {
		return nil, wrapErr("find observations", err)
	}
	out := make([]*Observation, len(rows))
	for i := range rows {
		out[i] = rows[i].toObservation()
	}
	return out, nil
}

// observationsQuery is FindObservations' query.
func observationsQuery(db *gorm.DB, f ObservationFilter) *gorm.DB {
	q := db.Model(&observationRow{})
	if f.RunID != nil {
		// Through the run's actions, so that observations_action serves
		// the read instead of a scan of every observation.
		q = q.Where("run_id = ? AND action_id IN (SELECT id FROM actions WHERE run_id = ?)", *f.RunID, *f.RunID)
	}
	if f.ActionID != nil {
		q = q.Where("action_id = ?", *f.ActionID)
	}
	if f.AttemptID != nil {
		q = q.Where("attempt_id = ?", *f.AttemptID)
	}
	return q.Order("observed_at, id")
}
