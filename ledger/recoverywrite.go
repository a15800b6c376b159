package ledger

import (
	"context"
	"maps"
)

// RecordRecoveryParams is one pass of recovery over one action, written by
// RecordRecovery in one transaction: what was decided and what the tool
// answered (Steps, in order), then what is done about the final decision
// (CloseAttempt, Moves, Run, in that order).
type RecordRecoveryParams struct {
	ActionID ActionID
	// ActionState is the state the action was in when the decisions were
	// made; CodeConflict, and nothing written, if it is no longer in it.
	ActionState ActionState
	// AttemptID is the attempt the decisions are about (the action's last),
	// where observations are recorded and which CloseAttempt closes; "" if
	// the action has none.
	AttemptID AttemptID
	// Steps are recorded in order: each a decision (a recovery.decision
	// event with its rationale) or a tool's answer (an observation on the
	// attempt, as RecordObservation writes it).
	Steps []RecoveryStep
	// CloseAttempt, if set, finishes the attempt, which must still be
	// started, as FinishAttempt does (status, error, duration added to the
	// run's execution budget) and moves the action from running (so
	// ActionState must be running) where the outcome table sends it
	// (OutcomeOf, with the effect the Steps established).
	CloseAttempt *CloseAttempt
	// Moves move the action on, one edge each, from where it stands after
	// CloseAttempt; edges owned by another method are CodeInvalid, as for
	// TransitionAction.
	Moves []ActionMove
	// Run, if set, moves the action's run (its ID may be left empty);
	// CodeConflict if the run is no longer in Run.From.
	Run   *RunTransition
	Actor string
	// TellAgent, if set, records that the action's agent is told this
	// decision (agent protocol): when it was told it already, the write
	// records nothing and Told is false.
	TellAgent *AgentDecision
	// Facts, if set, are the facts the decisions were made on, as
	// FindRecoveryFacts read them: their Action is ActionID's, in
	// ActionState, and their Attempt AttemptID's if that is set. The write
	// then reads none of what they hold again — the action, the attempt,
	// the run's budget and chain head — and changes each of those rows
	// only if it is still as the facts hold it (its version; the budget's
	// usage; the chain's head): CodeConflict, and nothing written, if
	// another write changed one of them since. Without Facts the write
	// reads the action and the attempt itself and guards on ActionState.
	Facts *RecoveryFacts
}

// RecoveryStep is one record of a recovery pass: exactly one of Decision
// and Observation.
type RecoveryStep struct {
	Decision    *RecoveryDecision
	Observation *ObservationInput
}

// RecoveryDecision is one recovery decision with its rationale.
type RecoveryDecision struct {
	Decision  string // continue, reconcile, stop, review, wait, query, cancel, cancelled
	Rationale string
	Data      map[string]any // extra facts the decision used
}

// CloseAttempt finishes the interrupted attempt of a RecordRecovery.
type CloseAttempt struct {
	Status AttemptStatus // not started
	Error  *AttemptError
}

// ActionMove is one edge of the action in a RecordRecovery.
type ActionMove struct {
	To   ActionState
	Data any // recorded in the transition's event
}

// RecordRecoveryResult is what RecordRecovery wrote: the decision events in
// order, and the action's state after it.
type RecordRecoveryResult struct {
	Decisions   []*Event
	ActionState ActionState
	// Told is set when p.TellAgent was recorded now.
	Told bool
}

// RecordRecovery implements Store.
func (s *DB) RecordRecovery(ctx context.Context, p RecordRecoveryParams) (RecordRecoveryResult, error) {
	if err := p.check(); err != nil {
		return RecordRecoveryResult{}, wrapErr("record recovery", err)
	}
	var out RecordRecoveryResult
	body := func(tx *txn) error {
		out = RecordRecoveryResult{}
		run, state, att, err := tx.recoveryTarget(p)
		if err != nil {
			return err
		}
		if state != p.ActionState {
			return Errorf(CodeConflict, "action %s is %s, not %s: decided on stale facts", p.ActionID, state, p.ActionState)
		}
		if t := p.TellAgent; t != nil {
			told, err := tx.tellDecision(p.ActionID, t.DecisionID, t.Kind)
			if err != nil || !told {
				return err
			}
			out.Told = true
		}
		for _, st := range p.Steps {
			if d := st.Decision; d != nil {
				e, err := tx.appendEvent(decisionEvent(run, p.ActionID, p.AttemptID, d, p.Actor))
				if err != nil {
					return err
				}
				out.Decisions = append(out.Decisions, e)
				continue
			}
			o := st.Observation
			if _, err := tx.observe(att, o.Source, o.Effect, o.Detail, p.Actor); err != nil {
				return err
			}
		}
		if c := p.CloseAttempt; c != nil {
			action, _, err := tx.finishAttempt(att, attemptOutcome{Status: c.Status, Error: c.Error, Actor: p.Actor})
			if err != nil {
				return err
			}
			state = action.State
			if err := checkMoves(state, p.Moves, true); err != nil {
				return err
			}
		}
		for _, m := range p.Moves {
			if err := tx.transitionAction(ActionTransition{ID: p.ActionID, From: state, To: m.To, Actor: p.Actor, Data: m.Data}); err != nil {
				return err
			}
			state = m.To
		}
		if p.Run != nil {
			rt := *p.Run
			if rt.ID == "" {
				rt.ID = run
			}
			if rt.ID != run {
				return Errorf(CodeInvalid, "run %s is not the run of action %s", rt.ID, p.ActionID)
			}
			if err := tx.transitionRun(rt); err != nil {
				return err
			}
		}
		if err := tx.flushRows(); err != nil {
			return err
		}
		out.ActionState = state
		return nil
	}
	if p.plannable() {
		return out, s.planned(ctx, "record_recovery", body)
	}
	return out, s.inTx(ctx, "record_recovery", body)
}

// plannable reports whether the write of p reads nothing from the
// database, so that it can be planned before it reaches the driver
// (DB.planned): it has the facts (the rows it changes, the chain head),
// and tells no agent (which reads the decision told before), moves no run
// (whose row the move hands back) and opens or invalidates no approval.
func (p RecordRecoveryParams) plannable() bool {
	if p.Facts == nil || p.TellAgent != nil || p.Run != nil || p.ActionState == ActionAwaitingApproval {
		return false
	}
	if c := p.CloseAttempt; c != nil && c.Status != AttemptUncertain {
		return false // its close may send the action to review, and the run with it
	}
	for _, m := range p.Moves {
		if m.To == ActionAwaitingApproval {
			return false
		}
	}
	return true
}

// recoveryTarget is what RecordRecovery guards on: the action's run and
// state and, if p.AttemptID is set, that attempt of the action
// (CodeInvalid if the action has no such attempt), from p.Facts or read;
// it makes them the write's known rows (knownrows.go), with the run's
// budget and chain head if the facts hold them. The attempt it returns is
// the known one, which the write changes.
func (tx *txn) recoveryTarget(p RecordRecoveryParams) (RunID, ActionState, *Attempt, error) {
	k := &knownRows{}
	tx.known = k
	if f := p.Facts; f != nil {
		k.knowAction(f.Action)
		var att *Attempt
		if p.AttemptID != "" {
			att = k.knowAttempt(f.Attempt)
		}
		k.knowBudget(f.Run.ID, f.Run.Budget)
		if tx.heads == nil {
			tx.heads = map[RunID]*chainHead{}
		}
		tx.heads[f.Run.ID] = &chainHead{base: f.Run.EventSeq, seq: f.Run.EventSeq, hash: f.Run.EventHash}
		return f.Run.ID, f.Action.State, att, nil
	}
	a, err := tx.findAction(p.ActionID)
	if err != nil {
		return "", "", nil, err
	}
	k.knowAction(a)
	if p.AttemptID == "" {
		return a.RunID, a.State, nil, nil
	}
	att, err := tx.findAttempt(p.AttemptID)
	switch {
	case Code(err) == CodeNotFound || (err == nil && att.ActionID != p.ActionID):
		return "", "", nil, Errorf(CodeInvalid, "action %s has no attempt %s", p.ActionID, p.AttemptID)
	case err != nil:
		return "", "", nil, err
	}
	return a.RunID, a.State, k.knowAttempt(att), nil
}

// check refuses a malformed RecordRecoveryParams before anything is read.
func (p RecordRecoveryParams) check() error {
	switch {
	case p.ActionID == "":
		return Errorf(CodeInvalid, "action id is required")
	case !p.ActionState.Valid():
		return Errorf(CodeInvalid, "action state %q is not known", p.ActionState)
	}
	for i, st := range p.Steps {
		switch {
		case (st.Decision == nil) == (st.Observation == nil):
			return Errorf(CodeInvalid, "step %d: exactly one of decision and observation", i+1)
		case st.Decision != nil:
			if err := firstErr(checkText("decision", st.Decision.Decision, 32), checkText("rationale", st.Decision.Rationale, 4000)); err != nil {
				return err
			}
		case p.AttemptID == "":
			return Errorf(CodeInvalid, "step %d: an observation needs the attempt it is about", i+1)
		}
	}
	if f := p.Facts; f != nil {
		switch {
		case f.Run == nil || f.Action == nil:
			return Errorf(CodeInvalid, "the facts need the run and the action")
		case f.Action.ID != p.ActionID || f.Action.RunID != f.Run.ID:
			return Errorf(CodeInvalid, "the facts are about action %s of run %s, not action %s", f.Action.ID, f.Run.ID, p.ActionID)
		case f.Action.State != p.ActionState:
			return Errorf(CodeInvalid, "the facts hold action %s %s, not %s", p.ActionID, f.Action.State, p.ActionState)
		case p.AttemptID != "" && (f.Attempt == nil || f.Attempt.ID != p.AttemptID || f.Attempt.ActionID != p.ActionID ||
			f.Attempt.RunID != f.Run.ID):
			return Errorf(CodeInvalid, "the facts are not about attempt %s of action %s", p.AttemptID, p.ActionID)
		}
	}
	state := p.ActionState
	if c := p.CloseAttempt; c != nil {
		switch {
		case p.AttemptID == "":
			return Errorf(CodeInvalid, "closing an attempt needs the attempt")
		case c.Status == AttemptStarted || !c.Status.Valid():
			return Errorf(CodeInvalid, "%q is not an outcome of an attempt", c.Status)
		case p.ActionState != ActionRunning:
			return Errorf(CodeInvalid, "closing an attempt moves a running action, not a %s one", p.ActionState)
		}
		// Where the close leaves the action is the outcome table's answer
		// to the effect as the write finds it: its moves are checked then.
		return nil
	}
	return checkMoves(state, p.Moves, false)
}

// checkMoves refuses moves of an action from state that are not edges, or
// are edges another method owns; closed says an attempt was just closed.
func checkMoves(state ActionState, moves []ActionMove, closed bool) error {
	for _, m := range moves {
		if state == ActionRunning && m.To == ActionNeedsReview && !closed {
			// A person is asked while an attempt is in flight (a late
			// outcome says an earlier one took effect): the attempt stays
			// open, and its outcome, when it comes, leaves the action in
			// review (FinishAttempt).
			state = m.To
			continue
		}
		if owner := ActionEdgeOwner(state, m.To); owner != "" {
			return Errorf(CodeInvalid, "%s → %s is taken by %s", state, m.To, owner)
		}
		if err := ValidateActionTransition(state, m.To); err != nil {
			return err
		}
		state = m.To
	}
	return nil
}

// decisionEvent is the recovery.decision event of d about action (of
// run): the decision and its rationale (never overwritten by d.Data), the
// attempt it is about if any, and d.Data.
func decisionEvent(run RunID, action ActionID, attempt AttemptID, d *RecoveryDecision, actor string) eventSpec {
	data := make(map[string]any, len(d.Data)+3)
	if attempt != "" {
		data["attempt_id"] = attempt
	}
	maps.Copy(data, d.Data)
	data["decision"], data["rationale"] = d.Decision, d.Rationale
	return eventSpec{RunID: run, Type: "recovery.decision", EntityType: "action", EntityID: string(action),
		Actor: actor, Data: data}
}
