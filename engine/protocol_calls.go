package engine

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// The agent protocol's calls: a client's proposal (the protocol's front end
// on the one propose path), begin, heartbeat, complete, abandon and finish.

// ClientDriven reports whether runs of agent are driven by a client.
func (e *Engine) ClientDriven(agent string) bool {
	a, ok := e.agents[agent]
	return ok && a.Driver == DriverClient
}

// clientRun reads a run the caller may drive, of a client-driven agent.
func (e *Engine) clientRun(ctx context.Context, c Caller, id ledger.RunID) (*ledger.Run, *registeredAgent, error) {
	run, err := e.store.FindRunByID(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if run.Tenant != c.Tenant || c.MayDrive != nil && !c.MayDrive(run) {
		return nil, nil, ledger.Errorf(ledger.CodeNotFound, "run %s not found", id)
	}
	agent, ok := e.agents[run.Agent]
	if !ok || agent.Driver != DriverClient {
		return nil, nil, protoErr(CodeNotClientDriven, "run %s is driven by the ledger, not by a client", id)
	}
	return run, agent, nil
}

// clientAction reads an action of a run the caller may drive.
func (e *Engine) clientAction(ctx context.Context, c Caller, id ledger.ActionID) (*ledger.Action, *ledger.Run, *registeredAgent, error) {
	a, err := e.store.FindActionByID(ctx, id)
	if err != nil {
		return nil, nil, nil, err
	}
	run, agent, err := e.clientRun(ctx, c, a.RunID)
	if ledger.Code(err) == ledger.CodeNotFound {
		err = ledger.Errorf(ledger.CodeNotFound, "action %s not found", id)
	}
	return a, run, agent, err
}

// clientAttempt reads an attempt with its lease, of a run the caller may
// drive.
func (e *Engine) clientAttempt(ctx context.Context, c Caller, id ledger.AttemptID) (*ledger.Attempt, *ledger.AttemptLease, *ledger.Run, *registeredAgent, error) {
	lease, err := e.store.FindAttemptLease(ctx, id)
	if err != nil {
		if ledger.Code(err) == ledger.CodeNotFound {
			err = ledger.Errorf(ledger.CodeNotFound, "attempt %s not found", id)
		}
		return nil, nil, nil, nil, err
	}
	run, agent, err := e.clientRun(ctx, c, lease.RunID)
	if err != nil {
		if ledger.Code(err) == ledger.CodeNotFound {
			err = ledger.Errorf(ledger.CodeNotFound, "attempt %s not found", id)
		}
		return nil, nil, nil, nil, err
	}
	atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &lease.ActionID})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	for _, a := range atts {
		if a.ID == id {
			return a, lease, run, agent, nil
		}
	}
	return nil, nil, nil, nil, ledger.Errorf(ledger.CodeNotFound, "attempt %s not found", id)
}

// stopped is the run_stopped refusal of a run that has ended.
func stopped(run *ledger.Run) *ProtocolError {
	pe := protoErr(CodeRunStopped, "run %s has ended: %s", run.ID, run.StopReason)
	pe.StopReason = run.StopReason
	return pe
}

// Propose implements the first step of a client's tool call: the agent
// protocol's front end on the engine's one propose path (propose.go).
func (e *Engine) Propose(ctx context.Context, p ProposeParams) (ProposeResult, error) {
	if !ledger.ValidIdempotencyKey(p.StepKey) {
		return ProposeResult{}, ledger.Errorf(ledger.CodeInvalid, "the step key must be 1–255 printable ASCII characters")
	}
	run, agent, err := e.clientRun(ctx, p.Caller, p.RunID)
	if err != nil {
		return ProposeResult{}, err
	}
	usage := ledger.AddUsageParams{RunID: run.ID, Steps: 1, TokensUnavailable: p.Usage == nil}
	if p.Usage != nil {
		usage.Tokens = p.Usage.InputTokens + p.Usage.OutputTokens
	}
	res, _, err := e.propose(ctx, proposal{run: run, agent: agent, stepKey: p.StepKey, tool: p.Tool, arguments: p.Arguments,
		supersedes: p.Supersedes, usage: usage, actor: p.Caller.Principal, maxPendingApprovals: p.MaxPendingApprovals})
	if err != nil {
		return ProposeResult{}, err
	}
	return ProposeResult{Action: res.Action, Approval: res.Approval, Replayed: res.Duplicate}, nil
}

// attemptToken is an attempt's secret token: derived from the engine's
// token key, the action and the begin's key, so that a replay of the begin
// can answer it again while only its hash is stored.
func (e *Engine) attemptToken(action ledger.ActionID, key string) string {
	m := hmac.New(sha256.New, e.tokenKey)
	m.Write([]byte(action))
	m.Write([]byte{0})
	m.Write([]byte(key))
	return "at_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// Begin begins an attempt of an approved action, durable before it
// answers, with a lease and a secret token.
func (e *Engine) Begin(ctx context.Context, p BeginParams) (BeginResult, error) {
	if !ledger.ValidIdempotencyKey(p.Key) {
		return BeginResult{}, ledger.Errorf(ledger.CodeInvalid, "the key must be 1–255 printable ASCII characters")
	}
	a, run, agent, err := e.clientAction(ctx, p.Caller, p.ActionID)
	if err != nil {
		return BeginResult{}, err
	}
	tool, ok := agent.tools[a.Tool]
	if !ok {
		return BeginResult{}, protoErr(CodeToolNotAllowed, "agent %s may no longer call %s", agent.Name, a.Tool)
	}
	if a.State == ledger.ActionApproved && run.State == ledger.RunRunning {
		if err := e.beginDrifted(ctx, run, a, tool); err != nil {
			return BeginResult{}, err
		}
		if reason, why := e.retryVerdict(run, a, e.now()); reason != "" {
			return BeginResult{}, e.stopRun(ctx, run, budget.Verdict{Stop: reason, Rationale: why}, nil)
		}
		if v := e.policyOf(agent).Tokens(run); v.Stopped() {
			return BeginResult{}, e.stopRun(ctx, run, v, nil)
		}
	}
	lease, _ := LeaseOf(tool.Tool) // every tool of a client agent is a ClientTool (New)
	token := e.attemptToken(a.ID, p.Key)
	res, err := e.store.BeginAttempt(ctx, ledger.BeginAttemptParams{ActionID: a.ID, Key: p.Key, TokenSHA256: tokenHash(token),
		Lease: lease.HeartbeatTimeout, MaxDuration: lease.MaxDuration, Actor: p.Caller.Principal})
	if errors.Is(err, ledger.ErrApprovalStale) {
		asked, rerr := e.reask(ctx, run, a, tool, err)
		if rerr != nil {
			return BeginResult{}, rerr
		}
		e.Notify()
		pe := protoErr(CodeApprovalStale, "%s: a person is asked again; wait for the action's approval, then begin", err.Error())
		pe.Action = asked
		return BeginResult{}, pe
	}
	if err != nil {
		return BeginResult{}, e.whyNoAttempt(ctx, a.ID, err)
	}
	if res.Replayed && res.Lease.TokenSHA256 != tokenHash(token) {
		// The token key changed since (a restart without a fixed key).
		return BeginResult{}, protoErr(CodeAttemptOpen, "attempt %s was begun with this key, but its token cannot be given again: abandon it and follow /next", res.Attempt.ID)
	}
	action, err := e.store.FindActionByID(ctx, a.ID)
	if err != nil {
		return BeginResult{}, err
	}
	return BeginResult{Attempt: res.Attempt, Action: action, Token: token, Replayed: res.Replayed,
		LeaseRemaining: max(res.Lease.Until.Sub(e.now()), 0)}, nil
}

// beginDrifted refuses the begin of approved action a whose approval
// drifted (the tool's descriptor or the rules changed since: drift) with
// approval_stale, after putting a new action that supersedes it through
// the gate; the refusal carries that action, which the agent follows
// instead (wait for its approval, then begin it). Arguments that no longer
// fit the tool's schema are invalid_arguments, nothing recorded: propose
// again, superseding a. Nil if a's approval still covers a begin.
func (e *Engine) beginDrifted(ctx context.Context, run *ledger.Run, a *ledger.Action, tool registeredTool) error {
	why, err := e.drift(ctx, run, a, tool)
	if err != nil || why == "" {
		return err
	}
	next, err := e.regate(ctx, run, a, tool, why)
	if errors.Is(err, errArgumentsDrifted) {
		pe := protoErr(CodeInvalidArgs, "%s: propose the call again, superseding action %s", err.Error(), a.ID)
		var ve *contracts.ValidationError
		if errors.As(err, &ve) {
			pe.Issues = ve.Issues
		}
		return pe
	}
	if err != nil {
		return err
	}
	e.Notify()
	pe := protoErr(CodeApprovalStale, "%s: action %s supersedes it (%s); follow it", why, next.ID, next.State)
	pe.Action = next
	return pe
}

// whyNoAttempt turns the store's refusal of an attempt into the protocol's
// code, from the facts as they stand now.
func (e *Engine) whyNoAttempt(ctx context.Context, id ledger.ActionID, err error) error {
	code := ledger.Code(err)
	switch code {
	case ledger.CodeApprovalRequired:
		return protoErr(CodeNotApproved, "%s", err.Error())
	case ledger.CodeBudgetExceeded, ledger.CodeConflict:
	default:
		return err
	}
	a, ferr := e.store.FindActionByID(ctx, id)
	if ferr != nil {
		return ferr
	}
	run, ferr := e.store.FindRunByID(ctx, a.RunID)
	if ferr != nil {
		return ferr
	}
	if code == ledger.CodeBudgetExceeded {
		return e.stopRun(ctx, run, budget.Verdict{Stop: ledger.StopRetryBudgetExhausted, Rationale: err.Error()}, nil)
	}
	c, ferr := e.store.FindCancellation(ctx, run.ID)
	switch {
	case ferr != nil && ledger.Code(ferr) != ledger.CodeNotFound:
		return ferr
	case run.State.Terminal():
		return stopped(run)
	case ferr == nil && c.State != ledger.CancelRequested:
		return protoErr(CodeRunCancelled, "run %s: its cancel was accepted, no attempt starts", run.ID)
	case a.State == ledger.ActionRunning:
		return protoErr(CodeAttemptOpen, "action %s has an attempt open: follow /next", a.ID)
	case a.State != ledger.ActionApproved:
		return protoErr(CodeNotApproved, "action %s is %s, not approved", a.ID, a.State)
	}
	return err
}

// Heartbeat renews an attempt's lease and says whether the run's cancel
// was accepted.
func (e *Engine) Heartbeat(ctx context.Context, p HeartbeatParams) (HeartbeatResult, error) {
	att, _, run, _, err := e.clientAttempt(ctx, p.Caller, p.AttemptID)
	if err != nil {
		return HeartbeatResult{}, err
	}
	lease, err := e.store.RenewLease(ctx, ledger.RenewLeaseParams{AttemptID: att.ID, TokenSHA256: tokenHash(p.Token),
		Progress: e.redactJSON(p.Progress)})
	switch ledger.Code(err) {
	case "":
	case ledger.CodeForbidden:
		return HeartbeatResult{}, protoErr(CodeBadToken, "that is not the token of attempt %s", att.ID)
	case ledger.CodeConflict:
		e.Notify()
		return HeartbeatResult{}, protoErr(CodeAttemptClosed, "attempt %s is closed: its lease lapsed or it was finished; follow /next", att.ID)
	default:
		return HeartbeatResult{}, err
	}
	c, err := e.store.FindCancellation(ctx, run.ID)
	if err != nil && ledger.Code(err) != ledger.CodeNotFound {
		return HeartbeatResult{}, err
	}
	return HeartbeatResult{LeaseRemaining: max(lease.Until.Sub(e.now()), 0),
		CancelRequested: err == nil && c.State != ledger.CancelRequested}, nil
}

// outcomeOf checks a reported outcome against the ledger's outcome table
// (ledger.OutcomeOf, shown in docs/agent-protocol.md) and returns the
// effect to record. A client reports an answered call: status uncertain is
// what an abandon records, never an outcome; a read carries no effect.
func outcomeOf(d contracts.ToolDescriptor, o Outcome) (ledger.EffectFact, error) {
	bad := func(why string) error {
		return protoErr(CodeOutcomeInvalid, "status %q with effect %q is not an outcome of a %s: %s", o.Status, o.Effect, d.Effect, why)
	}
	switch o.Status {
	case ledger.AttemptSucceeded, ledger.AttemptFailed, ledger.AttemptTimedOut, ledger.AttemptCancelled:
	default:
		return "", bad("the status must be succeeded, failed, timed_out or cancelled")
	}
	fact := o.Effect
	if d.Effect == contracts.EffectRead {
		if o.Effect != "" {
			return "", bad("a read carries no effect")
		}
		fact = ledger.EffectNotHappened
	}
	if _, err := ledger.OutcomeOf(d.Effect, o.Status, fact); err != nil {
		return "", protoErr(CodeOutcomeInvalid, "%s", err.Error())
	}
	return fact, nil
}

// Complete records what a client's call did, through the attempt's lease.
// A replay of the same outcome answers the same; another outcome is
// outcome_conflict. An outcome that arrives after the lease lapsed, or
// after the attempt was closed otherwise, is kept as a late_outcome
// observation and refused with attempt_closed; a late happened counts as
// a query's answer.
func (e *Engine) Complete(ctx context.Context, p CompleteParams) (CompleteResult, error) {
	att, lease, run, agent, err := e.clientAttempt(ctx, p.Caller, p.AttemptID)
	if err != nil {
		return CompleteResult{}, err
	}
	if !hmac.Equal([]byte(tokenHash(p.Token)), []byte(lease.TokenSHA256)) {
		return CompleteResult{}, protoErr(CodeBadToken, "that is not the token of attempt %s", att.ID)
	}
	a, err := e.store.FindActionByID(ctx, att.ActionID)
	if err != nil {
		return CompleteResult{}, err
	}
	tool, ok := agent.tools[a.Tool]
	desc := tool.desc
	if !ok {
		d, found := e.Tool(a.Tool)
		if !found {
			return CompleteResult{}, protoErr(CodeToolNotAllowed, "tool %s is no longer declared", a.Tool)
		}
		desc = d
	}
	effect, err := outcomeOf(desc, p.Outcome)
	if err != nil {
		return CompleteResult{}, err
	}
	if len(p.Outcome.Output) > 0 {
		if err := ledger.CheckJSON(p.Outcome.Output); err != nil {
			return CompleteResult{}, ledger.Errorf(ledger.CodeInvalid, "output: %s", err.Error())
		}
	}
	body, err := ledger.CanonicalJSON(p.Outcome)
	if err != nil {
		return CompleteResult{}, ledger.Errorf(ledger.CodeInvalid, "outcome: %v", err)
	}
	digest := ledger.DigestCanonical(body)
	for range 2 {
		if lease.OutcomeDigest != "" {
			return e.replayOutcome(ctx, att, lease, digest)
		}
		if att.Status != ledger.AttemptStarted || lease.Lapsed(e.now()) {
			return CompleteResult{}, e.lateOutcome(ctx, run, a, att, p, effect)
		}
		recorded := e.redactOutcome(p.Outcome)
		recordedJSON, err := ledger.CanonicalJSON(recorded)
		if err != nil {
			return CompleteResult{}, err
		}
		fin := ledger.FinishAttemptParams{AttemptID: att.ID, Status: p.Outcome.Status,
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: effect, Detail: recorded.Output},
			Result:      recorded.Output, Error: recorded.Error, Actor: p.Caller.Principal,
			Lease: &ledger.LeaseOutcome{TokenSHA256: lease.TokenSHA256, Digest: digest, Outcome: recordedJSON}}
		res, err := e.store.FinishAttempt(ctx, fin)
		switch ledger.Code(err) {
		case "":
			e.toolCalled(a.Tool, p.Outcome.Status, res.Attempt.FinishedAt.Sub(att.StartedAt))
			e.Notify()
			return CompleteResult{Attempt: res.Attempt, Action: res.Action}, nil
		case ledger.CodeForbidden:
			return CompleteResult{}, protoErr(CodeBadToken, "that is not the token of attempt %s", att.ID)
		case ledger.CodeConflict:
			// Closed meanwhile (a lapse, an abandon, another complete):
			// read again and answer from what is recorded.
			if att, lease, run, _, err = e.clientAttempt(ctx, p.Caller, p.AttemptID); err != nil {
				return CompleteResult{}, err
			}
			continue
		default:
			return CompleteResult{}, err
		}
	}
	return CompleteResult{}, protoErr(CodeAttemptClosed, "attempt %s is closed", att.ID)
}

// redactOutcome is an outcome as it is stored: output and error text
// redacted.
func (e *Engine) redactOutcome(o Outcome) Outcome {
	o.Output = e.redactJSON(o.Output)
	if o.Error != nil {
		er := *o.Error
		er.Message = e.cfg.Redactor.RedactString(er.Message)
		o.Error = &er
	}
	return o
}

// replayOutcome answers a complete of an attempt completed before: the
// same outcome is a replay, another a conflict.
func (e *Engine) replayOutcome(ctx context.Context, att *ledger.Attempt, lease *ledger.AttemptLease, digest ledger.Digest) (CompleteResult, error) {
	if lease.OutcomeDigest != digest {
		pe := protoErr(CodeOutcomeConflict, "attempt %s was completed with another outcome", att.ID)
		var o Outcome
		if err := json.Unmarshal(lease.Outcome, &o); err == nil {
			pe.Recorded = &o
		}
		return CompleteResult{}, pe
	}
	a, err := e.store.FindActionByID(ctx, att.ActionID)
	if err != nil {
		return CompleteResult{}, err
	}
	return CompleteResult{Attempt: att, Action: a, Replayed: true}, nil
}

// Abandon closes an open attempt whose call the agent lost: uncertain,
// effect unknown, its token of no more use; recovery decides by the tool's
// guarantees and /next says what.
func (e *Engine) Abandon(ctx context.Context, p AbandonParams) (CompleteResult, error) {
	att, _, _, _, err := e.clientAttempt(ctx, p.Caller, p.AttemptID)
	if err != nil {
		return CompleteResult{}, err
	}
	if att.Status != ledger.AttemptStarted {
		return CompleteResult{}, protoErr(CodeAttemptClosed, "attempt %s is already %s", att.ID, att.Status)
	}
	msg := "the agent lost the call"
	if p.Reason != "" {
		msg += ": " + e.cfg.Redactor.RedactString(p.Reason)
	}
	res, err := e.store.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptUncertain,
		Error: &ledger.AttemptError{Code: "abandoned", Message: msg}, Actor: p.Caller.Principal})
	if ledger.Code(err) == ledger.CodeConflict {
		return CompleteResult{}, protoErr(CodeAttemptClosed, "attempt %s was closed meanwhile", att.ID)
	}
	if err != nil {
		return CompleteResult{}, err
	}
	e.Notify()
	return CompleteResult{Attempt: res.Attempt, Action: res.Action}, nil
}

// FinishRun ends a client-driven run: completed, or failed with a stop
// reason of the failed family. Actions that never began are cancelled
// (their pending approvals invalidated); an action in doubt refuses it.
func (e *Engine) FinishRun(ctx context.Context, p FinishParams) (*ledger.Run, error) {
	run, _, err := e.clientRun(ctx, p.Caller, p.RunID)
	if err != nil {
		return nil, err
	}
	reason := ledger.StopCompleted
	switch p.Outcome {
	case "completed":
		if p.StopReason != "" && p.StopReason != ledger.StopCompleted {
			return nil, protoErr(CodeFinishInvalid, "a completed run's stop reason is completed")
		}
	case "failed":
		reason = ledger.StopInternalError
		if p.StopReason != "" {
			reason = p.StopReason
		}
		if !reason.Valid() || reason.TerminalState() != ledger.RunFailed {
			return nil, protoErr(CodeFinishInvalid, "a failed run's stop reason is provider_error, tool_error, invalid_model_response or internal_error")
		}
	default:
		return nil, protoErr(CodeFinishInvalid, "outcome must be completed or failed")
	}
	if run.State.Terminal() {
		if run.StopReason == reason {
			return run, nil
		}
		return nil, stopped(run)
	}
	actions, err := e.store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
	if err != nil {
		return nil, err
	}
	for _, a := range actions {
		switch a.State {
		case ledger.ActionRunning, ledger.ActionUncertain, ledger.ActionNeedsReview:
			return nil, protoErr(CodeActionInDoubt, "action %s is %s: settle it before the run finishes", a.ID, a.State)
		}
	}
	for _, a := range actions {
		switch a.State {
		case ledger.ActionProposed, ledger.ActionAwaitingApproval, ledger.ActionApproved:
			if _, err := e.store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: a.State, To: ledger.ActionCancelled,
				Actor: p.Caller.Principal, Data: map[string]any{"cause": "the run finished"}}); err != nil {
				return nil, err
			}
		}
	}
	if p.Usage != nil {
		if _, err := e.store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, Tokens: p.Usage.InputTokens + p.Usage.OutputTokens}); err != nil {
			return nil, err
		}
	}
	data := map[string]any{"finished_by": p.Caller.Principal}
	if len(p.Output) > 0 {
		if err := ledger.CheckJSON(p.Output); err != nil {
			return nil, ledger.Errorf(ledger.CodeInvalid, "output: %s", err.Error())
		}
		data["output"] = p.Output
	}
	if run, err = e.store.FindRunByID(ctx, run.ID); err != nil {
		return nil, err
	}
	if err := e.finish(ctx, run, reason, data); err != nil {
		return nil, err
	}
	return e.store.FindRunByID(ctx, run.ID)
}
