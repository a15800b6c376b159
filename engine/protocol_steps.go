package engine

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

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
	if run.State != ledger.RunRunning && run.State != ledger.RunAwaitingApproval {
		return nil
	}
	return &ledger.RunTransition{ID: run.ID, From: run.State, To: ledger.RunNeedsReview, Actor: "recovery"}
}

// reviewRun moves a run with an action in review to needs_review.
func (e *Engine) reviewRun(ctx context.Context, id ledger.RunID, action ledger.ActionID, why string) error {
	run, err := e.store.FindRunByID(ctx, id)
	if err != nil {
		return err
	}
	if m := reviewMove(run); m != nil {
		m.Data = map[string]any{"action_id": action, "rationale": why}
		if _, err := e.store.TransitionRun(ctx, *m); err != nil && ledger.Code(err) != ledger.CodeConflict {
			return err
		}
	}
	return nil
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

// sweepLeases applies the recovery table to attempts whose lease lapsed,
// so that an agent that never comes back leaves its unknown effects in
// review, not open; then to the decisions told to agents that have gone
// unanswered past their tool's decision timeout (sweepDecisions). It runs
// with the pool's passes. A lapsed attempt whose agent was told a decision
// since is not listed again (the store leaves it out): it waits for its
// answer or its timeout, and a backlog of such attempts never keeps the
// sweep from the others.
func (e *Engine) sweepLeases(ctx context.Context) error {
	lapsed, err := e.store.FindLapsedLeases(ctx, e.now(), sweepPage)
	if err != nil {
		return err
	}
	for _, l := range lapsed {
		if _, err := e.recoverClient(ctx, l.RunID, l.ActionID); err != nil && ledger.Code(err) != ledger.CodeConflict {
			return err
		}
	}
	return e.sweepDecisions(ctx)
}

// sweepPage is how many lapsed leases, or told decisions, one pass of the
// sweep reads.
const sweepPage = 100

// sweepCursor is where the next pass over told decisions starts.
type sweepCursor struct {
	mu    sync.Mutex
	after *ledger.AgentDecision
}

// sweepDecisions hands to a person each action whose agent was told a
// decision (query, cancel, resend) and has not acted on it within its
// tool's decision timeout. Each pass reads one page of the decisions told
// longer ago than the shortest timeout, from where the last pass stopped,
// and starts again from the oldest once it reaches the end, so that
// decisions not due yet (a tool with a longer timeout) never keep the
// sweep from the rest.
func (e *Engine) sweepDecisions(ctx context.Context) error {
	if e.minDecisionTimeout <= 0 {
		return nil // no client tool
	}
	c := &e.decisionSweep
	c.mu.Lock()
	defer c.mu.Unlock()
	now := e.now()
	told, err := e.store.FindAgentDecisions(ctx, ledger.AgentDecisionFilter{DecidedBefore: now.Add(-e.minDecisionTimeout),
		After: c.after, Limit: sweepPage})
	if err != nil {
		return err
	}
	if len(told) < sweepPage {
		c.after = nil
	} else {
		c.after = told[len(told)-1]
	}
	for _, d := range told {
		if err := e.escalateUnanswered(ctx, d, now); err != nil && ledger.Code(err) != ledger.CodeConflict && ledger.Code(err) != ledger.CodeNotFound {
			return err
		}
	}
	return nil
}

// escalateUnanswered lets recovery decide again about an action whose
// agent has left the decision d unanswered past its tool's timeout; the
// table then hands it to a person if d is still the decision its facts
// call for. An action whose attempt holds a live lease is in flight, not
// waiting for an answer.
func (e *Engine) escalateUnanswered(ctx context.Context, d *ledger.AgentDecision, now time.Time) error {
	a, err := e.store.FindActionByID(ctx, d.ActionID)
	if err != nil {
		return err
	}
	probe, ok := e.probe(a.Tool, a.ToolVersion)
	if !ok || !probe.Client || !recovery.Overdue(*d, probe.Tool, now) {
		return nil
	}
	switch a.State {
	case ledger.ActionRunning:
		if live, err := e.leaseLive(ctx, a.ID); err != nil || live {
			return err
		}
	case ledger.ActionApproved:
		// Only a resend still due: anything else of an approved action is
		// no question to the agent.
		atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		if err != nil || len(atts) == 0 {
			return err
		}
		if recovery.ResendDecisionID(recovery.Facts{Action: a, Attempt: atts[len(atts)-1]}) != d.DecisionID {
			return nil
		}
	case ledger.ActionUncertain:
	default:
		return nil
	}
	run, err := e.store.FindRunByID(ctx, a.RunID)
	if err != nil || run.State.Terminal() {
		return err
	}
	if _, err := e.recoverer.Recover(ctx, run, a); err != nil {
		return err
	}
	e.Notify()
	return nil
}
