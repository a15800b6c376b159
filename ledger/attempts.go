package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// StartAttempt implements Store. Retry semantics: every call that succeeds
// makes a new attempt with the next number, so a caller that crashed after
// StartAttempt committed must not call it again for the same try; recovery
// finds the started attempt instead. The budget checks and the increments
// are in the same IMMEDIATE transaction, so no interleaving of processes can
// exceed a budget.
func (s *DB) StartAttempt(ctx context.Context, p StartAttemptParams) (*Attempt, error) {
	var out *Attempt
	err := s.inTx(ctx, "start_attempt", func(tx *txn) error {
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
		if err := tx.checkNotStale(action); err != nil {
			return nil, err
		}
	case ActionProposed, ActionAwaitingApproval:
		return nil, Errorf(CodeApprovalRequired, "action %s is %s: it needs an approval first", action.ID, action.State)
	default:
		return nil, Errorf(CodeConflict, "action %s is %s, not approved", action.ID, action.State)
	}
	run, err := tx.findRun(action.RunID)
	if err != nil {
		return nil, err
	}
	return tx.startAttemptOf(action, run, p.Actor, nil)
}

// startAttemptOf starts the attempt of action, approved, of run, both as
// this write last wrote them (CreateAction, which has just written them,
// passes them instead of reading them back). If pending is set, action is
// not stored yet: it is inserted running, as the move would leave it,
// instead of moved, and action becomes that row; a refusal inserts
// nothing.
func (tx *txn) startAttemptOf(action *Action, run *Run, actor string, pending *pendingAction) (*Attempt, error) {
	if run.State != RunRunning {
		return nil, Errorf(CodeConflict, "run %s is %s: no attempt starts", run.ID, run.State)
	}
	c, err := tx.d.GetCancellation(tx.ctx, run.ID)
	switch {
	case Code(err) == CodeNotFound:
	case err != nil:
		return nil, err
	case c.State != CancelRequested:
		return nil, Errorf(CodeConflict, "run %s: cancellation accepted, no new attempt starts", run.ID)
	}
	if err := checkAttemptBudget(run.Budget, action, tx); err != nil {
		return nil, err
	}
	// From here on it writes.
	no := action.AttemptCount + 1
	move := ActionTransition{ID: action.ID, From: ActionApproved, To: ActionRunning, Actor: actor,
		Data: map[string]any{"attempt_no": no}}
	if pending != nil {
		if err := tx.insertMoved(action, move, no, pending.argsDigest); err != nil {
			return nil, err
		}
	} else if _, err := tx.moveAction(move, no); err != nil {
		return nil, err
	}
	att := &Attempt{
		ID: AttemptID(tx.newID(PrefixAttempt)), ActionID: action.ID, RunID: action.RunID, No: no,
		Status: AttemptStarted, Effect: EffectUnknown, Version: 1, StartedAt: tx.now,
	}
	if err := tx.d.InsertAttempt(tx.ctx, att); err != nil {
		return nil, err
	}
	if err := tx.d.CountAttempt(tx.ctx, run.ID); err != nil {
		return nil, err
	}
	// run's budget is as this write read it (or, in CreateAction, as its
	// usage left it), so after the count it is that with one more attempt.
	budget := run.Budget
	budget.Used.Attempts++
	// The attempt's event also binds the budget it counted against.
	if _, err := tx.appendEvent(transitionEvent(action.RunID, "attempt", string(att.ID), AttemptStatus(""), AttemptStarted, actor,
		map[string]any{"action_id": action.ID, "attempt_no": no, "dedup_key": action.DedupKey}).
		bind(AttemptContentOf(att), BudgetContentOf(run.ID, budget))); err != nil {
		return nil, err
	}
	return att, nil
}

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
func (s *DB) FinishAttempt(ctx context.Context, p FinishAttemptParams) (FinishAttemptResult, error) {
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
	// The observation's detail is canonicalized here too, before the write
	// and its lock, and only once when it is the result (as the engine
	// passes it). A detail that is not JSON is left for the write to
	// refuse, in its turn, as it always was.
	obs, canonical := p.Observation, false
	if obs != nil && len(obs.Detail) > 0 {
		detail := result
		if !bytes.Equal(obs.Detail, p.Result) {
			detail, _ = Canonicalize(obs.Detail)
		}
		if detail != nil {
			canon := *obs
			canon.Detail, obs, canonical = detail, &canon, true
		}
	}
	var out FinishAttemptResult
	err := s.inTx(ctx, "finish_attempt", func(tx *txn) error {
		out = FinishAttemptResult{} // a driver may run the write again
		att, err := tx.findAttempt(p.AttemptID)
		if err != nil {
			return err
		}
		if p.Lease != nil {
			if err := tx.completeLease(att.ID, p.Lease); err != nil {
				return err
			}
		}
		action, o, err := tx.finishAttempt(att, attemptOutcome{Status: p.Status, Result: result, Error: p.Error,
			Observation: obs, DetailCanonical: canonical, Actor: p.Actor})
		if err != nil {
			return err
		}
		// att is the row as the write left it: not read back.
		out = FinishAttemptResult{Action: action, Observation: o, Attempt: att, Chain: tx.chainMove(att.RunID)}
		return nil
	})
	return out, err
}

// attemptOutcome is how an attempt ended, as finishAttempt records it.
type attemptOutcome struct {
	Status      AttemptStatus
	Result      []byte // canonical JSON, or nil
	Error       *AttemptError
	Observation *ObservationInput // what the answer established, if anything
	// DetailCanonical says the observation's detail is canonical JSON
	// already (FinishAttempt canonicalized it before the write).
	DetailCanonical bool
	Actor           string
}

// finishAttempt closes the started attempt att (FinishAttempt, and
// recovery closing an interrupted one): its outcome, its duration added to
// the run's execution budget, its event, the observation if any, and the
// action moved from running to where the outcome table (OutcomeOf) sends
// it, which it returns with the observation. An action the table sends to
// review takes its run to needs_review in the same write.
func (tx *txn) finishAttempt(att *Attempt, o attemptOutcome) (*Action, *Observation, error) {
	if err := ValidateAttemptTransition(att.Status, o.Status); err != nil {
		if att.Status != AttemptStarted {
			return nil, nil, Errorf(CodeConflict, "attempt %s already finished as %s", att.ID, att.Status)
		}
		return nil, nil, err
	}
	current := tx.known.actionOf(att.ActionID) // recovery's facts hold it
	if current == nil {
		var err error
		if current, err = tx.findAction(att.ActionID); err != nil {
			return nil, nil, err
		}
	}
	effectClass, wasInReview := current.Effect, current.State == ActionNeedsReview
	// The effect the close is judged on: what this outcome establishes, or
	// what an earlier observation did.
	fact := att.Effect
	if ob := o.Observation; ob != nil && ob.Effect != EffectUnknown {
		fact = ob.Effect
	}
	to, err := OutcomeOf(effectClass, o.Status, fact)
	if err != nil {
		return nil, nil, err
	}
	// att was read in this transaction and the guarded move matches it,
	// so the row then is att with the outcome: its content needs no read.
	done := *att
	now := tx.now
	done.Status, done.Result, done.Error, done.FinishedAt = o.Status, o.Result, o.Error, &now
	done.Version++
	finished, err := tx.putFinishedAttempt(att, &done)
	if err != nil {
		return nil, nil, err
	}
	if !finished {
		return nil, nil, tx.staleAttempt(att.ID, AttemptStarted)
	}
	*att = done
	// The attempt's time counts against the run's execution budget.
	spent := tx.now.Sub(att.StartedAt).Microseconds()
	budget, err := tx.spendExecution(att.RunID, time.Duration(max(spent, 0))*time.Microsecond)
	if err != nil {
		return nil, nil, err
	}
	data := map[string]any{"action_id": att.ActionID, "attempt_no": att.No, "duration_us": spent}
	if o.Error != nil {
		data["error"] = o.Error
	}
	if _, err := tx.appendEvent(transitionEvent(att.RunID, "attempt", string(att.ID), AttemptStarted, o.Status, o.Actor, data).
		bind(AttemptContentOf(att), BudgetContentOf(att.RunID, *budget))); err != nil {
		return nil, nil, err
	}
	var obs *Observation
	if ob := o.Observation; ob != nil {
		observe := tx.observe
		if o.DetailCanonical {
			observe = tx.observeCanonical
		}
		if obs, err = observe(att, ob.Source, ob.Effect, ob.Detail, o.Actor); err != nil {
			return nil, nil, err
		}
	}
	if wasInReview {
		// A person was asked while the attempt ran (evidence that an
		// earlier attempt took effect came in): its outcome is recorded
		// all the same, and the action stays in review.
		a := *current
		return &a, obs, nil
	}
	action, err := tx.moveAction(ActionTransition{ID: att.ActionID, From: ActionRunning, To: to, Actor: o.Actor,
		Data: map[string]any{"attempt_id": att.ID}}, 0)
	if err != nil {
		return nil, nil, err
	}
	if to == ActionNeedsReview {
		if err := tx.reviewRun(att.RunID, att.ActionID, o.Actor); err != nil {
			return nil, nil, err
		}
	}
	return action, obs, nil
}

// reviewRun moves the run of an action that went to review to
// needs_review, if its state machine lets it go there.
func (tx *txn) reviewRun(id RunID, action ActionID, actor string) error {
	run, err := tx.findRun(id)
	if err != nil {
		return err
	}
	if !run.State.CanMoveTo(RunNeedsReview) {
		return nil
	}
	return tx.transitionRun(RunTransition{ID: id, From: run.State, To: RunNeedsReview, Actor: actor,
		Data: map[string]any{"action_id": action, "rationale": "the call failed but took effect: a person decides"}})
}

// RecordObservation implements Store.
func (s *DB) RecordObservation(ctx context.Context, p RecordObservationParams) (*Observation, *Attempt, error) {
	var obs *Observation
	var att *Attempt
	err := s.inTx(ctx, "record_observation", func(tx *txn) error {
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
	if err := checkObservation(src, effect); err != nil {
		return nil, err
	}
	var canon []byte
	if len(detail) > 0 {
		var err error
		if canon, err = Canonicalize(detail); err != nil {
			return nil, fmt.Errorf("observation detail: %w", err)
		}
	}
	return tx.observeCanonical(att, src, effect, canon, actor)
}

func checkObservation(src ObservationSource, effect EffectFact) error {
	if !src.Valid() {
		return Errorf(CodeInvalid, "observation source %q is not known", src)
	}
	if !effect.Valid() {
		return Errorf(CodeInvalid, "observation effect %q is not known", effect)
	}
	return nil
}

// observeCanonical is observe of a detail that is canonical JSON already
// (or nil).
func (tx *txn) observeCanonical(att *Attempt, src ObservationSource, effect EffectFact, canon json.RawMessage, actor string) (*Observation, error) {
	if err := checkObservation(src, effect); err != nil {
		return nil, err
	}
	switch {
	case effect == EffectUnknown, effect == att.Effect:
	case att.Effect != EffectUnknown:
		return nil, Errorf(CodeConflict, "attempt %s effect is already %s; %s evidence saying %s needs a person",
			att.ID, att.Effect, src, effect)
	}
	obs := &Observation{
		ID: ObservationID(tx.newID(PrefixObservation)), RunID: att.RunID, ActionID: att.ActionID, AttemptID: att.ID,
		Source: src, Effect: effect, Detail: canon, ObservedAt: tx.now,
	}
	if err := tx.write(func(d Tx) error { return d.InsertObservation(tx.ctx, obs) }); err != nil {
		return nil, err
	}
	if _, err := tx.appendEvent(eventSpec{RunID: att.RunID, Type: "observation.recorded", EntityType: "observation",
		EntityID: string(obs.ID), Actor: actor, Data: map[string]any{"attempt_id": att.ID, "source": src, "effect": effect}}.
		bind(ObservationContentOf(obs))); err != nil {
		return nil, err
	}
	if effect != EffectUnknown && att.Effect == EffectUnknown {
		if err := ValidateEffectTransition(att.Effect, effect); err != nil {
			return nil, err
		}
		if err := tx.setAttemptEffect(att, effect, obs.ID); err != nil {
			return nil, err
		}
		if _, err := tx.appendEvent(eventSpec{RunID: att.RunID, Type: "attempt.effect_" + string(effect), EntityType: "attempt",
			EntityID: string(att.ID), From: string(EffectUnknown), To: string(effect), Actor: actor,
			Data: map[string]any{"observation_id": obs.ID, "source": src}}.bind(AttemptContentOf(att))); err != nil {
			return nil, err
		}
	}
	return obs, nil
}

// setAttemptEffect writes on att, as this write last read or wrote it and
// with its effect unknown, the effect the observation by established, and
// updates att to the row it leaves (as in finishAttempt, att with the
// effect: its content needs no read).
func (tx *txn) setAttemptEffect(att *Attempt, effect EffectFact, by ObservationID) error {
	if !tx.known.holdsAttempt(att) {
		set, err := tx.d.SetAttemptEffect(tx.ctx, att.ID, effect, by)
		if err != nil {
			return err
		}
		if !set {
			return Errorf(CodeConflict, "attempt %s effect changed underneath", att.ID)
		}
	}
	att.Effect, att.EffectObservation = effect, by
	att.Version++
	tx.known.changedAttempt(att)
	return nil
}

// putFinishedAttempt writes done, the outcome of att (still started as
// this write last read or wrote it), if the stored attempt is still
// started; false if it is not.
func (tx *txn) putFinishedAttempt(att, done *Attempt) (bool, error) {
	if tx.known.holdsAttempt(att) {
		if att.Status != AttemptStarted {
			return false, nil
		}
		tx.known.attemptDirty = true // done is written by flushRows
		return true, nil
	}
	return tx.d.FinishAttempt(tx.ctx, done)
}

// spendExecution adds d to a run's execution budget and returns the budget
// after it.
func (tx *txn) spendExecution(run RunID, d time.Duration) (*Budget, error) {
	if b := tx.known.budgetOf(run); b != nil {
		b.Used.Execution += d
		tx.known.budgetDirty = true
		out := *b
		return &out, nil
	}
	return tx.d.SpendExecution(tx.ctx, run, d)
}

func (tx *txn) staleAttempt(id AttemptID, from AttemptStatus) error {
	a, err := tx.findAttempt(id)
	if err != nil {
		return err
	}
	return Errorf(CodeConflict, "attempt %s is %s, not %s", id, a.Status, from)
}

func (tx *txn) findAttempt(id AttemptID) (*Attempt, error) { return tx.d.GetAttempt(tx.ctx, id) }

// FindAttempts implements Store.
func (s *DB) FindAttempts(ctx context.Context, f AttemptFilter) ([]*Attempt, error) {
	return read(ctx, s, "find_attempts", func(r Reader) ([]*Attempt, error) { return r.ListAttempts(ctx, f) })
}

// FindObservations implements Store.
func (s *DB) FindObservations(ctx context.Context, f ObservationFilter) ([]*Observation, error) {
	return read(ctx, s, "find_observations", func(r Reader) ([]*Observation, error) { return r.ListObservations(ctx, f) })
}
