package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// The agent protocol after a crash or a lapse: late outcomes, a person
// asked, the agent's observations, and what Next tells it to do.

// lateOutcome keeps an outcome reported for a closed attempt as evidence,
// lets a happened in it settle the action as a query's answer would, and
// refuses the complete with attempt_closed. A happened when a later
// attempt has begun (the effect may have happened twice), or an effect that
// contradicts the one established for the attempt, goes to a person; a
// later attempt still in flight is left to finish, and its outcome is
// recorded when it comes.
func (e *Engine) lateOutcome(ctx context.Context, run *ledger.Run, a *ledger.Action, att *ledger.Attempt, p CompleteParams, effect ledger.EffectFact) error {
	closed := protoErr(CodeAttemptClosed, "attempt %s is closed: its lease lapsed or recovery moved on; the outcome is kept as a late_outcome observation", att.ID)
	recorded := e.redactOutcome(p.Outcome)
	detail, err := ledger.CanonicalJSON(recorded)
	if err != nil {
		return err
	}
	reported := effect
	contradicts := att.Effect != ledger.EffectUnknown && effect != att.Effect
	if contradicts {
		effect = ledger.EffectUnknown // contradicting evidence is kept, the established fact stands
	}
	if _, _, err := e.store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: att.ID, Source: ledger.ObservedLate,
		Effect: effect, Detail: detail, Actor: p.Caller.Principal}); err != nil {
		return err
	}
	if effect != ledger.EffectHappened && !contradicts {
		return closed
	}
	if a, err = e.store.FindActionByID(ctx, a.ID); err != nil {
		return err
	}
	switch a.State {
	case ledger.ActionApproved, ledger.ActionRunning, ledger.ActionUncertain:
	default:
		return closed // settled, or with a person already: the observation is theirs to weigh
	}
	atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
	if err != nil {
		return err
	}
	last := atts[len(atts)-1]
	if run, err = e.store.FindRunByID(ctx, run.ID); err != nil {
		return err
	}
	switch {
	case contradicts:
		err = e.handToPerson(ctx, run, a, last, fmt.Sprintf("a late outcome says attempt %s's effect %s, but it was established as %s: a person decides",
			att.ID, effectText(reported), att.Effect), "recovery", false)
	case last.ID != att.ID:
		err = e.handToPerson(ctx, run, a, last, "a late outcome says attempt "+string(att.ID)+" took effect after a later attempt began: the effect may have happened twice, a person decides",
			"recovery", false)
	case a.State == ledger.ActionApproved:
		// Recovery allowed a retry, which has not begun: the effect is
		// established, so the action is reconciled instead.
		_, err = e.store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: ledger.ActionApproved, To: ledger.ActionSucceeded,
			Actor: "recovery", Data: map[string]any{"decision": recovery.Reconcile, "attempt_id": att.ID,
				"rationale": "a late outcome established that the attempt's effect happened before a retry began"}})
	default:
		_, err = e.recoverClient(ctx, run.ID, a.ID)
	}
	if err != nil && ledger.Code(err) != ledger.CodeConflict {
		return err
	}
	e.Notify()
	return closed
}

// effectText is an effect as a rationale says it.
func effectText(f ledger.EffectFact) string {
	switch f {
	case ledger.EffectHappened:
		return "happened"
	case ledger.EffectNotHappened:
		return "did not happen"
	}
	return "is unknown"
}

// handToPerson moves an action to review over why, recorded as a review
// decision, with its run if it can go there: closing its last attempt as
// interrupted first when interrupted is set (the action is running, its
// lease lapsed), else leaving an attempt still in flight open.
func (e *Engine) handToPerson(ctx context.Context, run *ledger.Run, a *ledger.Action, last *ledger.Attempt, why, actor string, interrupted bool) error {
	w := ledger.RecordRecoveryParams{ActionID: a.ID, ActionState: a.State, AttemptID: last.ID, Actor: actor,
		Steps: []ledger.RecoveryStep{{Decision: &ledger.RecoveryDecision{Decision: string(recovery.Review), Rationale: why}}},
		Moves: []ledger.ActionMove{{To: ledger.ActionNeedsReview, Data: map[string]any{"decision": recovery.Review, "rationale": why}}},
		Run:   reviewMove(run)}
	if interrupted {
		w.CloseAttempt = &ledger.CloseAttempt{Status: ledger.AttemptUncertain,
			Error: &ledger.AttemptError{Code: "interrupted", Message: "no outcome was recorded for this attempt: " + why}}
	}
	if w.Run != nil {
		w.Run.Data = map[string]any{"action_id": a.ID, "rationale": why}
	}
	_, err := e.store.RecordRecovery(ctx, w)
	return err
}

// reviewMove moves a run to needs_review, if it can go there.
func reviewMove(run *ledger.Run) *ledger.RunTransition {
	if !run.State.CanMoveTo(ledger.RunNeedsReview) {
		return nil
	}
	return &ledger.RunTransition{ID: run.ID, From: run.State, To: ledger.RunNeedsReview, Actor: "recovery"}
}

// Observe records what the agent learned from its tool in answer to a
// query or cancel directive, and decides.
func (e *Engine) Observe(ctx context.Context, p ObserveParams) (ObserveResult, error) {
	att, _, run, _, err := e.clientAttempt(ctx, p.Caller, p.AttemptID)
	if err != nil {
		return ObserveResult{}, err
	}
	told, err := e.store.FindAgentDecision(ctx, att.ActionID)
	if err != nil && ledger.Code(err) != ledger.CodeNotFound {
		return ObserveResult{}, err
	}
	if err != nil || told.DecisionID != p.DecisionID || told.Answered || told.Kind != string(p.Kind) {
		return ObserveResult{}, protoErr(CodeStaleDecision, "decision %s is not the current one about this attempt's action: follow /next", p.DecisionID)
	}
	// A decision is answered only while the facts it rests on stand: a
	// late outcome, or a person, may have settled the action since.
	a, err := e.store.FindActionByID(ctx, att.ActionID)
	if err != nil {
		return ObserveResult{}, err
	}
	if a.State != ledger.ActionRunning && a.State != ledger.ActionUncertain || att.Effect != ledger.EffectUnknown {
		return ObserveResult{}, protoErr(CodeStaleDecision, "decision %s was superseded: action %s is %s now; follow /next", p.DecisionID, a.ID, a.State)
	}
	obs := ledger.RecordObservationParams{AttemptID: att.ID, Actor: p.Caller.Principal, DecisionID: p.DecisionID,
		Detail: e.redactJSON(p.Detail), Effect: ledger.EffectUnknown}
	switch p.Kind {
	case ObserveQuery:
		obs.Source = ledger.ObservedQuery
		if p.Error == nil {
			if !p.Effect.Valid() {
				return ObserveResult{}, ledger.Errorf(ledger.CodeInvalid, "a query's answer needs an effect: happened, not_happened or unknown")
			}
			obs.Effect = p.Effect
		}
	case ObserveCancel:
		obs.Source = ledger.ObservedCancel
		if p.Error == nil && p.Confirmed {
			obs.Effect = ledger.EffectNotHappened
		}
	default:
		return ObserveResult{}, ledger.Errorf(ledger.CodeInvalid, "kind must be query or cancel")
	}
	if p.Error != nil {
		raw, err := json.Marshal(map[string]string{"error": p.Error.Code + ": " + e.cfg.Redactor.RedactString(p.Error.Message)})
		if err != nil {
			return ObserveResult{}, err
		}
		obs.Detail = raw
	}
	o, _, err := e.store.RecordObservation(ctx, obs)
	if ledger.Code(err) == ledger.CodeConflict {
		return ObserveResult{}, protoErr(CodeStaleDecision, "decision %s was answered or superseded meanwhile, or the answer contradicts an established effect: follow /next", p.DecisionID)
	}
	if err != nil {
		return ObserveResult{}, err
	}
	if _, err := e.recoverClient(ctx, run.ID, att.ActionID); err != nil && ledger.Code(err) != ledger.CodeConflict {
		return ObserveResult{}, err
	}
	next, err := e.Next(ctx, p.Caller, run.ID)
	if err != nil {
		return ObserveResult{}, err
	}
	return ObserveResult{Observation: o, Next: next.Directives}, nil
}

// recoverClient applies the recovery table to an unsettled action of a
// client-driven run, with the agent as its tool's hands.
func (e *Engine) recoverClient(ctx context.Context, runID ledger.RunID, id ledger.ActionID) (recovery.Decision, error) {
	var last error
	for range 3 {
		run, err := e.store.FindRunByID(ctx, runID)
		if err != nil {
			return recovery.Decision{}, err
		}
		a, err := e.store.FindActionByID(ctx, id)
		if err != nil {
			return recovery.Decision{}, err
		}
		switch a.State {
		case ledger.ActionRunning, ledger.ActionUncertain:
		default:
			return recovery.Decision{}, nil
		}
		d, err := e.recoverer.Recover(ctx, run, a)
		if ledger.Code(err) == ledger.CodeConflict {
			last = err
			continue
		}
		return d, err
	}
	return recovery.Decision{}, last
}

// Next says what the agent of a run must do now: one directive per
// action that is not settled, or one propose, or one stop. Where an
// attempt was interrupted (its lease lapsed) or its effect is unknown, it
// applies the recovery table first, recording a decision only when the
// facts changed.
func (e *Engine) Next(ctx context.Context, c Caller, id ledger.RunID) (NextResult, error) {
	run, agent, err := e.clientRun(ctx, c, id)
	if err != nil {
		return NextResult{}, err
	}
	// Each pass in which recovery moved an action reads the run again; the
	// moves converge (each takes an action one edge on), and after a few
	// passes the directives of the last one are answered as they stand.
	for pass := 0; ; pass++ {
		actions, err := e.store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
		if err != nil {
			return NextResult{}, err
		}
		var out []Directive
		recovered := false
		for _, a := range actions {
			if a.State.Terminal() {
				continue
			}
			d, moved, err := e.directive(ctx, run, agent, a)
			if err != nil {
				return NextResult{}, err
			}
			recovered = recovered || moved
			out = append(out, d)
		}
		if run, err = e.store.FindRunByID(ctx, run.ID); err != nil {
			return NextResult{}, err
		}
		if recovered && pass < 3 {
			continue // recovery moved something: read the run again
		}
		switch {
		case run.State.Terminal():
			return NextResult{Run: run, Directives: []Directive{{Kind: DirectiveStop, StopReason: run.StopReason,
				DecisionID: factsID(string(run.ID), run.Version, "stop"), Rationale: "the run has ended"}}}, nil
		case len(out) == 0 && run.State == ledger.RunStopping:
			return NextResult{Run: run, Directives: []Directive{{Kind: DirectiveStop, StopReason: ledger.StopUserCancelled,
				DecisionID: factsID(string(run.ID), run.Version, "stop"), Rationale: "the run's cancel was accepted"}}}, nil
		case len(out) == 0:
			out = []Directive{{Kind: DirectivePropose, DecisionID: factsID(string(run.ID), run.Version, "propose"),
				Rationale: "no action is open: propose the next tool call, or finish"}}
		}
		return NextResult{Run: run, Directives: out}, nil
	}
}

// factsID is the decision id of a directive that records nothing: it names
// the object and version it rests on.
func factsID(id string, version int64, kind string) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%s", id, version, kind))
	return "dec_" + hex.EncodeToString(h[:])[:32]
}

// directive is what the agent must do about one action that is not
// settled; moved says recovery changed the facts (read them again).
func (e *Engine) directive(ctx context.Context, run *ledger.Run, agent *registeredAgent, a *ledger.Action) (Directive, bool, error) {
	d := Directive{ActionID: a.ID, Tool: a.Tool, DedupKey: a.DedupKey}
	switch a.State {
	case ledger.ActionProposed, ledger.ActionAwaitingApproval:
		d.Kind, d.Rationale = DirectiveWaitApproval, "a person must approve the action's digest"
	case ledger.ActionNeedsReview:
		d.Kind, d.Rationale = DirectiveReview, "the effect is in doubt: a person decides"
	case ledger.ActionApproved:
		if run.State == ledger.RunStopping {
			d.Kind, d.StopReason, d.Rationale = DirectiveStop, ledger.StopUserCancelled, "the run's cancel was accepted: do not begin"
			break
		}
		if reason, why := e.retryVerdict(run, a, e.now()); reason != "" && run.State == ledger.RunRunning {
			err := e.stopRun(ctx, run, budget.Verdict{Stop: reason, Rationale: why}, nil)
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				return d, false, err
			}
			return d, true, nil
		}
		d.Kind, d.Rationale = DirectiveExecute, "approved: begin an attempt"
		if a.AttemptCount == 0 {
			break
		}
		atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		if err != nil {
			return d, false, err
		}
		if len(atts) > 0 {
			if id := recovery.ResendDecisionID(recovery.Facts{Action: a, Attempt: atts[len(atts)-1]}); id != "" {
				// A retry after an attempt whose effect is unknown: the
				// decision told to the agent, until its timeout.
				d.DecisionID = id
				if due, err := e.resendDue(ctx, a, id); err != nil || due {
					if err == nil {
						_, err = e.recoverer.Recover(ctx, run, a)
					}
					return d, err == nil, err
				}
			}
		}
		if tool, ok := agent.tools[a.Tool]; ok && tool.desc.Guarantees.Dedup {
			d.Kind, d.Rationale = DirectiveResend, "begin a new attempt: the tool gets the same dedup key"
		} else {
			d.Rationale = "begin a new attempt (the last one's effect is established, or the tool only reads)"
		}
	case ledger.ActionRunning, ledger.ActionUncertain:
		atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		if err != nil {
			return d, false, err
		}
		if len(atts) > 0 {
			d.AttemptID = atts[len(atts)-1].ID
		}
		if a.State == ledger.ActionRunning {
			lease, err := e.store.FindAttemptLease(ctx, d.AttemptID)
			if err != nil && ledger.Code(err) != ledger.CodeNotFound {
				return d, false, err
			}
			if err == nil && !lease.Lapsed(e.now()) {
				d.Kind, d.LeaseRemaining = DirectiveInFlight, lease.Until.Sub(e.now())
				d.Rationale = "an attempt is open: complete it, or abandon it if this process lost the call"
				break
			}
		}
		rd, err := e.recoverClient(ctx, run.ID, a.ID)
		if err != nil {
			return d, false, err
		}
		switch rd.Kind {
		case recovery.Query:
			d.Kind = DirectiveQuery
		case recovery.Cancel:
			d.Kind = DirectiveCancel
		case recovery.Wait:
			d.Kind = DirectiveInFlight
		default:
			return d, true, nil // the action moved: its next directive follows from the new facts
		}
		d.DecisionID, d.Rationale = rd.ID, rd.Rationale
	default:
		d.Kind, d.Rationale = DirectiveReview, fmt.Sprintf("action is %s", a.State)
	}
	if d.DecisionID == "" {
		d.DecisionID = factsID(string(a.ID), a.Version, string(d.Kind))
	}
	return d, false, nil
}

// resendDue reports whether the agent was told the resend id about a and
// has not begun it within the tool's decision timeout.
func (e *Engine) resendDue(ctx context.Context, a *ledger.Action, id string) (bool, error) {
	told, err := e.store.FindAgentDecision(ctx, a.ID)
	if ledger.Code(err) == ledger.CodeNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	probe, ok := e.probe(a.Tool, a.ToolVersion)
	return ok && told.DecisionID == id && recovery.Overdue(told, probe.Tool, e.now()), nil
}
