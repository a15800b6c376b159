package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// The built-in agents' front end: the stepper that drives a run of an agent
// whose model runs in this process, one model step at a time; each tool
// call it proposes goes through the one propose path (propose.go), each
// approved action through the call (call.go).

// Advance drives one run until it ends or waits for something outside the
// engine (a person's approval or review). It is safe to call again at any
// point, including after a crash: every step it takes is derived from the
// ledger, and every write is idempotent or guarded.
func (e *Engine) Advance(ctx context.Context, id ledger.RunID) error {
	conflicts := 0
	// What this Advance knows of the run from one step to the next; each
	// step reads the run, and the rest only if the run's chain moved in a
	// way the view did not follow (runview.go).
	var v runView
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		run, err := e.store.FindRunByID(ctx, id)
		if err != nil {
			return fmt.Errorf("advance %s: %w", id, err)
		}
		v.at(run)
		more, err := e.step(ctx, run, &v)
		if errors.Is(err, ledger.ErrConflict) && !errors.Is(err, ledger.ErrLeaseLost) && conflicts < 3 {
			// Someone moved the run underneath (a cancel, an approval, a
			// person's resolution): read it again and go on from there.
			conflicts++
			v.drop()
			continue
		}
		if err != nil {
			return fmt.Errorf("advance %s: %w", id, err)
		}
		conflicts = 0
		if !more {
			return nil
		}
	}
}

// step takes one step of run, of which v is what this Advance knows, and
// reports whether another may follow.
func (e *Engine) step(ctx context.Context, run *ledger.Run, v *runView) (bool, error) {
	if run.State.Terminal() {
		return false, nil
	}
	c, err := v.cancellation(ctx, e.store, run.ID)
	switch {
	case err != nil:
		return false, err
	case c != nil && (c.State == ledger.CancelAccepted || c.State == ledger.CancelStopping ||
		c.State == ledger.CancelStopped && run.State == ledger.RunStopping):
		return e.stepCancel(ctx, run, c)
	}
	switch run.State {
	case ledger.RunQueued:
		if _, ok := e.agents[run.Agent]; !ok {
			return false, e.finish(ctx, run, ledger.StopInternalError, map[string]any{"error": "agent " + run.Agent + " is not registered"})
		}
		return e.moveRun(ctx, run, ledger.RunRunning, nil)
	case ledger.RunRunning:
		return e.stepRunning(ctx, run, v)
	default:
		// awaiting_approval and needs_review wait for a person; stopping and
		// the terminal states are not the engine's to advance here.
		return false, nil
	}
}

func (e *Engine) stepRunning(ctx context.Context, run *ledger.Run, v *runView) (bool, error) {
	agent, ok := e.agents[run.Agent]
	if !ok {
		return false, e.finish(ctx, run, ledger.StopInternalError, map[string]any{"error": "agent " + run.Agent + " is not registered"})
	}
	if agent.Driver == DriverClient || agent.Driver == DriverGateway {
		return false, nil // its front end takes every step (protocol_calls.go, gateway.go)
	}
	actions, err := v.findActions(ctx, e.store, run.ID)
	if err != nil {
		return false, err
	}
	last := current(actions)
	if last != nil {
		switch last.State {
		case ledger.ActionApproved:
			return e.attempt(ctx, run, agent, last, v)
		case ledger.ActionAwaitingApproval, ledger.ActionProposed:
			more, err := e.moveRun(ctx, run, ledger.RunAwaitingApproval, map[string]any{"action_id": last.ID})
			if err == nil {
				e.fault(FaultAwaitingApproval)
			}
			return more, err
		case ledger.ActionDenied:
			reason := ledger.StopPolicyDenied
			if decided, err := e.store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &last.ID, State: ptr(ledger.ApprovalDenied)}); err != nil {
				return false, err
			} else if len(decided) > 0 {
				reason = ledger.StopApprovalDenied
			}
			return false, e.finish(ctx, run, reason, map[string]any{"action_id": last.ID})
		case ledger.ActionExpired:
			return false, e.finish(ctx, run, ledger.StopApprovalExpired, map[string]any{"action_id": last.ID})
		case ledger.ActionRunning, ledger.ActionUncertain:
			// Running here means the process that started the attempt died
			// (this one runs each run in one worker); uncertain means the
			// call ended without an established effect. Either way the
			// recovery table decides, with the tool's guarantees.
			return e.recover(ctx, run, last)
		case ledger.ActionNeedsReview:
			return e.moveRun(ctx, run, ledger.RunNeedsReview, map[string]any{"action_id": last.ID})
		case ledger.ActionFailed:
			if !agent.ContinueOnToolError {
				return false, e.finish(ctx, run, ledger.StopToolError, map[string]any{"action_id": last.ID})
			}
			// The failure is the model's to answer: on to its next step.
		case ledger.ActionAbandoned:
			return false, e.finish(ctx, run, ledger.StopUserCancelled, map[string]any{"action_id": last.ID, "cause": "a person abandoned the action in review"})
		case ledger.ActionCancelled:
			return false, e.finish(ctx, run, ledger.StopUserCancelled, map[string]any{"action_id": last.ID})
		}
	}
	if v := e.policyOf(agent).BeforeStep(run, e.now()); v.Stopped() {
		return false, e.finish(ctx, run, v.Stop, map[string]any{"rationale": v.Rationale})
	}
	return e.modelStep(ctx, run, agent, actions, v)
}

// recover applies the recovery table to an action whose outcome is not
// settled, and says whether the run can go on now.
func (e *Engine) recover(ctx context.Context, run *ledger.Run, a *ledger.Action) (bool, error) {
	d, err := e.recoverer.Recover(ctx, run, a)
	if err != nil {
		return false, err
	}
	switch d.Kind {
	case recovery.Wait:
		e.deferRun(run.ID, 2*time.Second)
		return false, nil
	case recovery.Review, recovery.Stop:
		return false, nil
	default:
		return true, nil
	}
}

// deferRun keeps the pool away from a run for a while (recovery said wait).
func (e *Engine) deferRun(id ledger.RunID, d time.Duration) {
	e.callsMu.Lock()
	e.notBefore[id] = e.now().Add(d)
	e.callsMu.Unlock()
}

// deferred reports whether the pool should leave a run alone for now.
func (e *Engine) deferred(id ledger.RunID) bool {
	e.callsMu.Lock()
	defer e.callsMu.Unlock()
	t, ok := e.notBefore[id]
	if ok && !e.now().Before(t) {
		delete(e.notBefore, id)
		return false
	}
	return ok
}

// current is the action the run is on: the last one recorded that was not
// superseded by a later one.
func current(actions []*ledger.Action) *ledger.Action {
	for i := len(actions) - 1; i >= 0; i-- {
		if actions[i].State != ledger.ActionSuperseded {
			return actions[i]
		}
	}
	return nil
}

// modelStep asks the model for the next step and records it: an action
// through the gate, or the final answer.
func (e *Engine) modelStep(ctx context.Context, run *ledger.Run, agent *registeredAgent, actions []*ledger.Action, v *runView) (bool, error) {
	model, err := agent.NewModel(run.Input)
	if err != nil {
		return false, e.finish(ctx, run, ledger.StopInvalidModelResponse, map[string]any{"error": err.Error()})
	}
	hist, err := e.history(ctx, run, actions, v)
	if err != nil {
		return false, err
	}
	started := e.now()
	s, err := model.Next(ctx, hist)
	took := e.now().Sub(started)
	usage := ledger.AddUsageParams{RunID: run.ID, Steps: 1, Execution: max(took, 0), TokensUnavailable: s.Usage == nil}
	if s.Usage != nil {
		usage.Tokens = s.Usage.InputTokens + s.Usage.OutputTokens
	}
	// A step that records an action adds its usage in the action's own
	// transaction (counted once, even when the step is replayed); every
	// other step records it alone, first.
	if err != nil || s.Kind != StepToolCall {
		if _, uerr := e.store.AddUsage(ctx, usage); uerr != nil {
			return false, uerr
		}
	}
	failStep := func(reason ledger.StopReason, data map[string]any) error {
		if _, uerr := e.store.AddUsage(ctx, usage); uerr != nil {
			return uerr
		}
		return e.finish(ctx, run, reason, data)
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, e.finish(ctx, run, ledger.StopProviderError, map[string]any{"error": err.Error()})
	}
	switch s.Kind {
	case StepFinal:
		var answer any = json.RawMessage(`null`)
		if len(s.Final) > 0 {
			if err := ledger.CheckJSON(s.Final); err != nil {
				return false, e.finish(ctx, run, ledger.StopInvalidModelResponse, map[string]any{"error": "final answer: " + err.Error()})
			}
			answer = s.Final
		}
		return false, e.finish(ctx, run, ledger.StopCompleted, map[string]any{"final": answer})
	case StepToolCall:
		res, tool, err := e.propose(ctx, proposal{run: run, agent: agent, actions: actions,
			stepKey: fmt.Sprintf("step-%d", len(actions)+1), tool: s.Tool, arguments: s.Arguments,
			usage: usage, actor: "engine", execute: true, fingerprint: v.fingerprint})
		var pe *ProtocolError
		if errors.As(err, &pe) {
			switch pe.Code {
			case CodeRunStopped: // a budget or loop policy stopped the run
				return false, nil
			case CodeUnknownTool, CodeToolNotAllowed, CodeInvalidArgs:
				// The model's mistake: the run stops with it.
				return false, failStep(ledger.StopInvalidModelResponse, map[string]any{"error": refusalText(pe)})
			}
		}
		if err != nil {
			return false, err
		}
		v.created(res)
		if res.Attempt != nil {
			return e.callTool(ctx, run, tool, res.Action, res.Attempt, v)
		}
		return true, nil
	default:
		return false, e.finish(ctx, run, ledger.StopInvalidModelResponse, map[string]any{"error": fmt.Sprintf("unknown step kind %q", s.Kind)})
	}
}

// history rebuilds what the model has seen from the ledger alone: the
// actions and their last attempts as the ledger holds them (read, or
// returned by the writes that wrote them, runview.go). The model gets
// copies, so that nothing it does to them reaches the view.
func (e *Engine) history(ctx context.Context, run *ledger.Run, actions []*ledger.Action, v *runView) (History, error) {
	h := History{RunID: run.ID, Input: run.Input}
	lastAttempt, err := v.lastAttempts(ctx, e.store, run.ID)
	if err != nil {
		return h, err
	}
	if len(actions) > 0 {
		h.Entries = make([]HistoryEntry, len(actions))
	}
	for i, a := range actions {
		ac := *a
		h.Entries[i].Action = &ac
		if att := lastAttempt[a.ID]; att != nil {
			attc := *att
			h.Entries[i].Attempt = &attc
		}
	}
	return h, nil
}

// moveRun moves a running run; true means the engine may go on.
func (e *Engine) moveRun(ctx context.Context, run *ledger.Run, to ledger.RunState, data any) (bool, error) {
	_, err := e.store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: run.State, To: to, Actor: "engine", Data: data})
	if err != nil {
		return false, err
	}
	return to == ledger.RunRunning, nil
}

// finish ends a run with a stop reason, in the state the reason belongs to.
func (e *Engine) finish(ctx context.Context, run *ledger.Run, reason ledger.StopReason, data map[string]any) error {
	if data == nil {
		data = map[string]any{}
	}
	data["stop_reason"] = reason
	// Error texts from tools and models end up here: the event is
	// append-only and hash-chained, so a secret in it could never be
	// removed. Redact before it is written.
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("finish %s: %w", run.ID, err)
	}
	_, err = e.store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: run.State, To: reason.TerminalState(),
		StopReason: reason, Actor: "engine", Data: e.redactJSON(raw)})
	if err == nil {
		e.log.Info("run finished", "run", run.ID, "state", reason.TerminalState(), "stop_reason", reason)
	}
	return err
}
