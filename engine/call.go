package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// The call: an approved action's attempt recorded, the tool called with
// its dedup key and the run's fencing token under the run's lease, and the
// answer recorded through the ledger's outcome table. Every front end whose
// tools the ledger runs itself goes through it.

// retryVerdict is the budget's answer to "may this action have one more
// attempt?": the run's persisted budgets under its agent's policy, then the
// engine's cap.
func (e *Engine) retryVerdict(run *ledger.Run, a *ledger.Action, now time.Time) (ledger.StopReason, string) {
	policy := e.policy
	if agent, ok := e.agents[run.Agent]; ok {
		policy = e.policyOf(agent)
	}
	if v := policy.BeforeAttempt(run, a, now); v.Stopped() {
		return v.Stop, v.Rationale
	}
	if run.Budget.Limits.MaxAttemptsPerAction == 0 && a.AttemptCount >= e.cfg.MaxAttemptsPerAction {
		return ledger.StopRetryBudgetExhausted, fmt.Sprintf("action %s used %d attempts, the engine's cap when the run sets none", a.ID, a.AttemptCount)
	}
	return "", ""
}

// attempt records an attempt durably, then calls the tool with the action's
// dedup key, then records the outcome and the tool's observation.
func (e *Engine) attempt(ctx context.Context, run *ledger.Run, agent *registeredAgent, a *ledger.Action, v *runView) (bool, error) {
	tool, ok := agent.tools[a.Tool]
	if !ok {
		return false, e.finish(ctx, run, ledger.StopInternalError, map[string]any{"action_id": a.ID,
			"error": fmt.Sprintf("tool %s is no longer registered with agent %s: approved action %s (version %s) cannot run", a.Tool, agent.Name, a.ID, a.ToolVersion)})
	}
	// An approval that drifted (the tool changed, the rules changed) goes
	// through the gate again as a new action; one past its execute_by
	// asks a person again (StartAttempt's ErrApprovalStale, below). Either
	// way the next step finds the action, or the one that supersedes it,
	// waiting as any other.
	if why, err := e.drift(ctx, run, a, tool); err != nil {
		return false, err
	} else if why != "" {
		if _, err := e.regate(ctx, run, a, tool, why); errors.Is(err, errArgumentsDrifted) {
			return false, e.finish(ctx, run, ledger.StopInternalError, map[string]any{"action_id": a.ID, "error": err.Error()})
		} else if err != nil {
			return false, err
		}
		return true, nil
	}
	if reason, why := e.retryVerdict(run, a, e.now()); reason != "" {
		return false, e.finish(ctx, run, reason, map[string]any{"action_id": a.ID, "rationale": why})
	}
	if err := e.leaseForCall(ctx, tool); err != nil {
		return false, err
	}
	e.fault(FaultBeforeAttemptRecorded)
	var early *Result // only a broken test build calls the tool before recording the attempt
	var earlyErr error
	if broken("call_before_record") {
		r, err := tool.Execute(ctx, Call{RunID: run.ID, ActionID: a.ID, DedupKey: a.DedupKey, FencingToken: fencingToken(ctx), Arguments: a.Arguments})
		early, earlyErr = &r, err
		e.fault(FaultAfterToolCall)
	}
	att, err := e.store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID, Actor: "engine"})
	switch {
	case errors.Is(err, ledger.ErrBudgetExceeded):
		// The store's own guard: another process spent the budget first.
		return false, e.finish(ctx, run, ledger.StopRetryBudgetExhausted, map[string]any{"action_id": a.ID, "error": err.Error()})
	case errors.Is(err, ledger.ErrLeaseLost):
		return false, err
	case errors.Is(err, ledger.ErrApprovalStale):
		if _, err := e.reask(ctx, run, a, tool, err); err != nil {
			return false, err
		}
		return true, nil
	case errors.Is(err, ledger.ErrConflict):
		return true, nil // a cancel was accepted meanwhile: the next step handles it
	case err != nil:
		return false, err
	}
	// StartAttempt's write is not one the view follows, so neither is
	// the outcome's: the next step reads the run afresh.
	if early != nil {
		return e.finishCall(ctx, run, tool, a, att, *early, earlyErr, false, 0, v)
	}
	return e.callTool(ctx, run, tool, a, att, v)
}

// callTimeout is how long a call of tool may take.
func (e *Engine) callTimeout(tool registeredTool) time.Duration {
	if t := tool.desc.Timeout(); t > 0 {
		return t
	}
	return e.cfg.DefaultToolTimeout
}

// leaseForCall makes sure the lease of the run ctx works on outlasts a
// call of tool by the margin, extending it if need be, so that no other
// process can claim the run (and recover the attempt) while the call may
// still be running: callTool sets the call's deadline before it asks.
// Nil if ctx carries no lease.
func (e *Engine) leaseForCall(ctx context.Context, tool registeredTool) error {
	ok, err := e.leases.outlasts(ctx, e.callTimeout(tool)+e.leases.margin())
	if err == nil && !ok {
		err = fmt.Errorf("call %s: the run's lease cannot be made to outlast the call", tool.desc.Name)
	}
	return err
}

// callTool calls the tool for an attempt recorded durably, then records
// the outcome and the tool's observation; v follows the write. It does
// not call the tool if the run's lease cannot be made to outlast the call:
// the attempt, recorded and never called, is then recovered by whoever
// holds the run next, as after a crash at that point.
//
// The call's deadline is set before the lease check, which then makes the
// lease outlast it by the margin: a process paused between the check and
// the call wakes with the deadline it had, passed by then if another
// process could take the run over meanwhile, never with a fresh one. The
// call carries the lease's fencing token for a tool that cannot see the
// deadline.
func (e *Engine) callTool(ctx context.Context, run *ledger.Run, tool registeredTool, a *ledger.Action, att *ledger.Attempt, v *runView) (bool, error) {
	e.fault(FaultAfterAttemptRecorded)
	callCtx, cancelTimeout := context.WithTimeout(ctx, e.callTimeout(tool))
	defer cancelTimeout()
	if err := e.leaseForCall(ctx, tool); err != nil {
		return false, err
	}
	e.fault(FaultBeforeToolCall)
	callCtx, cancelCall := context.WithCancelCause(callCtx)
	untrack := e.trackCall(run.ID, func() { cancelCall(errRunCancelled) })
	started := e.now()
	res, callErr := tool.Execute(callCtx, Call{RunID: run.ID, ActionID: a.ID, Attempt: att.No, AttemptID: att.ID, DedupKey: a.DedupKey,
		FencingToken: fencingToken(ctx), Arguments: a.Arguments})
	took := e.now().Sub(started)
	untrack()
	cancelledByRun := errors.Is(context.Cause(callCtx), errRunCancelled)
	cancelCall(nil)
	cancelTimeout()
	e.fault(FaultAfterToolCall)
	return e.finishCall(ctx, run, tool, a, att, res, callErr, cancelledByRun, took, v)
}

// fencingToken is the fencing token of the run lease ctx carries, 0 if it
// carries none.
func fencingToken(ctx context.Context) int64 {
	l, _ := ledger.RunLeaseFrom(ctx)
	return l.Token
}

// toolCalled tells Config.OnToolCall of a call.
func (e *Engine) toolCalled(tool string, status ledger.AttemptStatus, took time.Duration) {
	if e.cfg.OnToolCall != nil {
		e.cfg.OnToolCall(ToolCallStats{Tool: tool, Status: status, Duration: max(took, 0)})
	}
}

// finishCall records what a call answered; took is how long the tool
// took; v follows the write.
func (e *Engine) finishCall(ctx context.Context, run *ledger.Run, tool registeredTool, a *ledger.Action, att *ledger.Attempt,
	res Result, callErr error, cancelledByRun bool, took time.Duration, v *runView) (bool, error) {
	if leaseLost(ctx) {
		// Another process may hold the run now: what the call answered is
		// evidence for its recovery, not this worker's to record.
		fin := outcome(tool.desc, e.redactResult(res), e.redactErr(callErr))
		if errors.Is(callErr, context.Canceled) {
			fin = ledger.FinishAttemptParams{Status: ledger.AttemptCancelled,
				Error:       &ledger.AttemptError{Code: "lease_lost", Message: "the worker lost the run's lease and cancelled the call"},
				Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}}
		}
		return false, e.staleOutcome(ctx, tool, att, fin)
	}
	if callErr != nil && ctx.Err() != nil {
		// We are shutting down, not the tool failing: leave the attempt
		// started; recovery finds it and decides with the tool's guarantees.
		e.toolCalled(tool.desc.Name, ledger.AttemptStarted, took)
		return false, ctx.Err()
	}
	fin := outcome(tool.desc, e.redactResult(res), e.redactErr(callErr))
	if callErr != nil && cancelledByRun {
		fin = ledger.FinishAttemptParams{Status: ledger.AttemptCancelled,
			Error:       &ledger.AttemptError{Code: "cancelled", Message: "the run was cancelled during the call"},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}}
	}
	fin.AttemptID, fin.Actor = att.ID, "engine"
	e.toolCalled(tool.desc.Name, fin.Status, took)
	done, err := e.store.FinishAttempt(ctx, fin)
	if err != nil {
		if e.refusedForLease(ctx, err) {
			return false, e.staleOutcome(ctx, tool, att, fin)
		}
		return false, err
	}
	v.finished(done)
	e.fault(FaultAfterResultRecorded)
	switch done.Action.State {
	case ledger.ActionFailed:
		if agent, ok := e.agents[run.Agent]; ok && agent.ContinueOnToolError {
			return true, nil // the model answers the failure (stepRunning)
		}
		return false, e.finish(ctx, run, ledger.StopToolError, map[string]any{"action_id": a.ID, "error": fin.Error})
	case ledger.ActionNeedsReview: // the call failed but took effect: the run waits for a person
		return false, nil
	default: // succeeded: the next model step; uncertain: recovery decides
		return true, nil
	}
}

// redactResult is res with its output redacted, as it is stored.
func (e *Engine) redactResult(res Result) Result {
	res.Output = e.redactJSON(res.Output)
	return res
}

// refusedForLease reports whether a write of the run ctx works on failed
// with err because the worker lost the run's lease: the store fenced it
// (ErrLeaseLost); or the engine, learning of the loss while the write was
// out, cancelled it (the write then fails with the context's error); or
// the new holder got there first and the write was refused as a plain
// conflict (an attempt its recovery closed already), the run's token being
// another's now. Its caller keeps the outcome as evidence (staleOutcome)
// in each case, never drops it.
func (e *Engine) refusedForLease(ctx context.Context, err error) bool {
	if errors.Is(err, ledger.ErrLeaseLost) || leaseLost(ctx) {
		return true
	}
	l, ok := ledger.RunLeaseFrom(ctx)
	if !ok || ledger.Code(err) != ledger.CodeConflict {
		return false
	}
	rctx, cancel := e.leases.lateWrite(ctx)
	defer cancel()
	now, ferr := e.store.FindRunLease(rctx, l.Run)
	if ferr != nil {
		e.log.WarnContext(ctx, "read the run's lease after a refused write", "run", l.Run, "err", ferr)
		return false
	}
	return now.Token != l.Token
}

// staleOutcome records the outcome of a call that reached this worker
// after it lost the run's lease, as an observation with source
// stale_holder (an effect it establishes is written on the attempt),
// instead of finishing the attempt: the run's new holder recovers the
// attempt and finds it there. It returns the lost lease as the error.
func (e *Engine) staleOutcome(ctx context.Context, tool registeredTool, att *ledger.Attempt, fin ledger.FinishAttemptParams) error {
	lost := fmt.Errorf("attempt %s of %s: %w", att.ID, tool.desc.Name, errLeaseLost)
	detail := map[string]any{"status": fin.Status}
	if len(fin.Result) > 0 {
		detail["result"] = fin.Result
	}
	if fin.Error != nil {
		detail["error"] = fin.Error
	}
	body, err := json.Marshal(detail)
	if err != nil {
		return errors.Join(lost, err)
	}
	effect := ledger.EffectUnknown
	if fin.Observation != nil {
		effect = fin.Observation.Effect
	}
	// Unfenced (the lease is lost) and written even though the worker's
	// context is cancelled.
	wctx, cancel := e.leases.lateWrite(ctx)
	defer cancel()
	p := ledger.RecordObservationParams{AttemptID: att.ID, Source: ledger.ObservedStaleHolder, Effect: effect, Detail: body, Actor: "engine"}
	_, _, err = e.store.RecordObservation(wctx, p)
	if ledger.Code(err) == ledger.CodeConflict && effect != ledger.EffectUnknown {
		// The new holder established the effect otherwise: the evidence is
		// kept, the established fact stands.
		p.Effect = ledger.EffectUnknown
		_, _, err = e.store.RecordObservation(wctx, p)
	}
	if err != nil {
		return errors.Join(lost, fmt.Errorf("record the outcome as stale_holder: %w", err))
	}
	e.log.WarnContext(ctx, "a call's outcome reached this worker after it lost the run's lease: kept as a stale_holder observation",
		"attempt", att.ID, "tool", tool.desc.Name, "status", fin.Status, "effect", effect)
	return lost
}

// outcome turns a tool's answer into the facts to record: the status of the
// call and the effect with the observation that established it. Where the
// action goes is the ledger's outcome table (ledger.OutcomeOf); an answer
// the table refuses (a write that succeeded without taking effect) is
// recorded as a failed call whose effect is unknown, for recovery to
// establish.
func outcome(d contracts.ToolDescriptor, res Result, err error) ledger.FinishAttemptParams {
	fin := answered(d, res, err)
	if _, terr := ledger.OutcomeOf(d.Effect, fin.Status, fin.Observation.Effect); terr != nil {
		return ledger.FinishAttemptParams{Status: ledger.AttemptFailed,
			Error:       &ledger.AttemptError{Code: "outcome_not_allowed", Message: "the tool's answer is not an outcome: " + terr.Error()},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown, Detail: fin.Result}}
	}
	return fin
}

// answered is the tool's answer as it was given.
func answered(d contracts.ToolDescriptor, res Result, err error) ledger.FinishAttemptParams {
	var te *ToolError
	switch {
	case err == nil:
		effect := res.Effect
		if effect == "" {
			effect = ledger.EffectHappened
			if d.Effect == contracts.EffectRead {
				effect = ledger.EffectNotHappened
			}
		}
		return ledger.FinishAttemptParams{Status: ledger.AttemptSucceeded, Result: res.Output,
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: effect, Detail: res.Output}}
	case errors.Is(err, context.DeadlineExceeded):
		return ledger.FinishAttemptParams{Status: ledger.AttemptTimedOut,
			Error:       &ledger.AttemptError{Code: "timeout", Message: "the tool did not answer in time"},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}}
	case errors.As(err, &te):
		effect := te.Effect
		if effect == "" {
			effect = ledger.EffectUnknown
		}
		return ledger.FinishAttemptParams{Status: ledger.AttemptFailed,
			Error:       &ledger.AttemptError{Code: te.Code, Message: te.Message},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: effect}}
	default:
		return ledger.FinishAttemptParams{Status: ledger.AttemptFailed,
			Error:       &ledger.AttemptError{Code: "tool_error", Message: err.Error()},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}}
	}
}

// redactJSON hides secrets in a tool's or model's JSON before it is
// stored. A document that cannot be redacted is not stored at all.
func (e *Engine) redactJSON(doc json.RawMessage) json.RawMessage {
	if len(doc) == 0 {
		return doc
	}
	out, err := e.cfg.Redactor.RedactJSON(doc, nil)
	if err != nil {
		return json.RawMessage(`{"unrecorded":"the output could not be redacted, so it was not kept"}`)
	}
	return out
}

// redactErr keeps an error's kind (timeouts, tool errors) and hides
// secrets in its text.
func (e *Engine) redactErr(err error) error {
	if err == nil {
		return nil
	}
	var te *ToolError
	if errors.As(err, &te) {
		c := *te
		c.Message = e.cfg.Redactor.RedactString(c.Message)
		return &c
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	return errors.New(e.cfg.Redactor.RedactString(err.Error()))
}
