package engine

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// The one way a proposed tool call becomes an action, whichever front end
// it came through: a built-in agent's model step (modelStep), the agent
// protocol (Propose), and every front end to come. A front end reads the
// run and its agent, translates its wire format into a proposal, and
// translates propose's answer back; the rules in between are here alone.

// proposal is one tool call an agent proposes, as a front end hands it to
// propose.
type proposal struct {
	run   *ledger.Run
	agent *registeredAgent
	// actions are the run's actions, oldest first, if the front end has
	// read them; nil reads them.
	actions []*ledger.Action
	// stepKey is the step's idempotency key within the run: the same key
	// with the same call is the same action; with another call,
	// step_key_reused.
	stepKey    string
	tool       string
	arguments  json.RawMessage
	supersedes ledger.ActionID
	// usage is the step's own usage (Steps 1), recorded with the action,
	// or with the stop when a policy refuses the proposal.
	usage ledger.AddUsageParams
	actor string
	// maxPendingApprovals caps the tenant's pending approvals for a
	// proposal that would wait while its run has one pending (CodePendingCap).
	maxPendingApprovals int
	// execute says the engine runs the tool itself: an action the rules
	// approve starts its attempt in the same commit, when the run's
	// budgets and lease allow it.
	execute bool
	// fingerprint, if set, is the front end's cache of budget.Fingerprint.
	fingerprint func(*ledger.Action) (ledger.Digest, error)
}

// propose checks a proposal against the ledger's rules and records it: the
// replay of a step key seen before; the run's state; the tool's lookup
// and the arguments' schema; no write while another of the run is in
// doubt; the action it supersedes; the budgets and loop policies, which
// stop the run when they refuse (CodeRunStopped, the step's usage
// counted); the gate; the action, with the step's usage, in one write. It
// answers the recorded action (Duplicate for a replay) and the tool.
// Refusals are *ProtocolError (or a ledger error): a front end translates
// them.
func (e *Engine) propose(ctx context.Context, p proposal) (ledger.CreateActionResult, registeredTool, error) {
	run, agent := p.run, p.agent
	actions := p.actions
	if actions == nil {
		var err error
		if actions, err = e.store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID}); err != nil {
			return ledger.CreateActionResult{}, registeredTool{}, err
		}
	}
	if res, err, seen := e.replayProposal(ctx, actions, p); seen {
		return res, agent.tools[p.tool], err
	}
	switch {
	case run.State.Terminal():
		return ledger.CreateActionResult{}, registeredTool{}, stopped(run)
	case run.State == ledger.RunStopping:
		return ledger.CreateActionResult{}, registeredTool{}, protoErr(CodeRunCancelled, "run %s is being cancelled", run.ID)
	case run.State == ledger.RunNeedsReview:
		return ledger.CreateActionResult{}, registeredTool{}, protoErr(CodeActionInDoubt, "run %s waits for a person to settle an action in review", run.ID)
	}
	tool, err := e.proposedTool(agent, p.tool, p.arguments)
	if err != nil {
		return ledger.CreateActionResult{}, registeredTool{}, err
	}
	if tool.desc.Effect == contracts.EffectWrite {
		for _, a := range actions {
			if a.Effect == ledger.EffectWrite && (a.State == ledger.ActionRunning || a.State == ledger.ActionUncertain || a.State == ledger.ActionNeedsReview) {
				return ledger.CreateActionResult{}, tool, protoErr(CodeActionInDoubt, "write %s of this run is %s: no other write until its effect is settled", a.ID, a.State)
			}
		}
	}
	if p.supersedes != "" {
		if err := e.checkSupersedes(ctx, run, p.supersedes); err != nil {
			return ledger.CreateActionResult{}, tool, err
		}
	}
	if err := e.checkPolicies(ctx, p, actions); err != nil {
		return ledger.CreateActionResult{}, tool, err
	}
	gate := e.approvals.Gate(run.Tenant, tool.desc)
	create := ledger.CreateActionParams{
		RunID: run.ID, IdempotencyKey: p.stepKey, Tool: tool.desc.Name, ToolVersion: tool.desc.Version, Effect: tool.desc.Effect,
		Arguments: p.arguments, Supersedes: p.supersedes, Gate: gate.Gate, ApprovalTTL: gate.ApprovalTTL, Actor: p.actor,
		Usage: &p.usage, GateAudit: gateParams(gate), MaxPendingApprovals: p.maxPendingApprovals,
	}
	// An action the rules approve, of a tool the engine runs, starts its
	// attempt in the same commit: everything that must be durable before
	// the call, at once. Not if the run's lease cannot be made to outlast
	// the call: the action is recorded approved, and the next step starts it.
	if p.execute && gate.Gate == ledger.ActionApproved {
		if reason, _ := e.retryVerdict(run, &ledger.Action{RunID: run.ID}, e.now()); reason == "" && e.leaseForCall(ctx, tool) == nil {
			create.StartAttempt = true
			e.fault(FaultBeforeAttemptRecorded)
		}
	}
	res, err := e.store.CreateAction(ctx, create)
	if ledger.Code(err) == ledger.CodeBudgetExceeded && gate.Gate == ledger.ActionAwaitingApproval && p.maxPendingApprovals > 0 {
		return ledger.CreateActionResult{}, tool, protoErr(CodePendingCap,
			"this run has an approval pending and the tenant has %d approvals pending or runs that may ask for one, its cap: wait for a decision, then propose again",
			p.maxPendingApprovals)
	}
	if ledger.Code(err) == ledger.CodeConflict {
		// Another process presented the same step key meanwhile, or the
		// run moved: answer from what is recorded now.
		if actions, ferr := e.store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID}); ferr == nil {
			if res, rerr, seen := e.replayProposal(ctx, actions, p); seen {
				return res, tool, rerr
			}
		}
	}
	if err != nil {
		return ledger.CreateActionResult{}, tool, err
	}
	if agent.Driver != DriverGateway {
		// The pool never advances a gateway's run: its caller does
		// (RunCall); waking the pool would only cost its pass's writes.
		e.Notify()
	}
	return res, tool, nil
}

// proposedTool is the agent's tool of that name, with arguments its schema
// accepts: unknown_tool for a name no agent declares, tool_not_allowed for
// another agent's, invalid_arguments with the schema's issues.
func (e *Engine) proposedTool(agent *registeredAgent, name string, arguments json.RawMessage) (registeredTool, error) {
	tool, ok := agent.tools[name]
	if !ok {
		if _, exists := e.Tool(name); exists {
			return registeredTool{}, protoErr(CodeToolNotAllowed, "agent %s may not call %s", agent.Name, name)
		}
		return registeredTool{}, protoErr(CodeUnknownTool, "no tool %q is declared", name)
	}
	if err := tool.args.Validate(arguments); err != nil {
		pe := protoErr(CodeInvalidArgs, "the arguments do not match the schema of %s", name)
		var ve *contracts.ValidationError
		if errors.As(err, &ve) {
			pe.Issues = ve.Issues
		} else {
			pe.Issues = []contracts.Issue{{Message: err.Error()}}
		}
		return registeredTool{}, pe
	}
	return tool, nil
}

// checkPolicies applies the agent's budgets and loop policies to the
// proposal, the step's own usage counted (a model step that spent the
// token budget is refused); one that refuses stops the run (stopRun).
func (e *Engine) checkPolicies(ctx context.Context, p proposal, actions []*ledger.Action) error {
	policy := e.policyOf(p.agent)
	if v := policy.BeforeStep(p.run, e.now()); v.Stopped() {
		return e.stopRun(ctx, p.run, v, &p.usage)
	}
	if v := policy.Tokens(withUsage(p.run, p.usage)); v.Stopped() {
		return e.stopRun(ctx, p.run, v, &p.usage)
	}
	history := make([]budget.Entry, len(actions))
	for i, a := range actions {
		history[i] = budget.Entry{Action: a}
		if p.fingerprint != nil {
			// An action that cannot be fingerprinted is left for Loop,
			// which says so in its own turn.
			history[i].Fingerprint, _ = p.fingerprint(a)
		}
	}
	v, err := policy.Loop(history, p.tool, p.arguments)
	if err != nil {
		return err
	}
	if v.Stopped() {
		return e.stopRun(ctx, p.run, v, &p.usage)
	}
	return nil
}

// stopRun ends a run with a policy's or budget's verdict, counting the
// step that was refused, and answers run_stopped.
func (e *Engine) stopRun(ctx context.Context, run *ledger.Run, v budget.Verdict, usage *ledger.AddUsageParams) error {
	if usage != nil {
		if _, err := e.store.AddUsage(ctx, *usage); err != nil {
			return err
		}
	}
	if err := e.finish(ctx, run, v.Stop, map[string]any{"rationale": v.Rationale}); err != nil {
		return err
	}
	pe := protoErr(CodeRunStopped, "%s", v.Rationale)
	pe.StopReason = v.Stop
	return pe
}

// checkSupersedes refuses a supersedes that names no action the run may
// replace: an unknown action or another tenant's is not found (ids leak
// nothing); another run's, or one that has begun or is settled, is
// cannot_supersede.
func (e *Engine) checkSupersedes(ctx context.Context, run *ledger.Run, id ledger.ActionID) error {
	old, err := e.store.FindActionByID(ctx, id)
	if ledger.Code(err) == ledger.CodeNotFound || err == nil && old.Tenant != run.Tenant {
		return ledger.Errorf(ledger.CodeNotFound, "action %s not found", id)
	}
	if err != nil {
		return err
	}
	switch {
	case old.RunID != run.ID:
		return protoErr(CodeCannotSupersede, "action %s belongs to another run: only an action of this run can be superseded", id)
	case old.State != ledger.ActionProposed && old.State != ledger.ActionAwaitingApproval && old.State != ledger.ActionApproved:
		return protoErr(CodeCannotSupersede, "action %s is %s: only an action that has not begun can be superseded", id, old.State)
	}
	return nil
}

// withUsage is run with usage added to what its budget used.
func withUsage(run *ledger.Run, usage ledger.AddUsageParams) *ledger.Run {
	counted := *run
	counted.Budget.Used.Tokens += usage.Tokens
	counted.Budget.Used.TokensUnavailable = counted.Budget.Used.TokensUnavailable || usage.TokensUnavailable
	return &counted
}

// replayProposal answers a step key the run has seen: the same action for
// the same call (with the approval it waits for), step_key_reused for
// another; seen is false for a new key.
func (e *Engine) replayProposal(ctx context.Context, actions []*ledger.Action, p proposal) (ledger.CreateActionResult, error, bool) {
	for _, a := range actions {
		if a.IdempotencyKey != p.stepKey {
			continue
		}
		// Recorded arguments are canonical (CreateAction keeps them so).
		same := a.Tool == p.tool && a.Supersedes == p.supersedes
		if same {
			want, err := ledger.Canonicalize(p.arguments)
			same = err == nil && string(want) == string(a.Arguments)
		}
		if !same {
			pe := protoErr(CodeStepKeyReused, "step key %q was used in this run for another call", p.stepKey)
			pe.Action = a
			return ledger.CreateActionResult{}, pe, true
		}
		res := ledger.CreateActionResult{Action: a, Duplicate: true}
		if a.State == ledger.ActionAwaitingApproval {
			pending, err := e.store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &a.ID, State: ptr(ledger.ApprovalPending)})
			if err != nil {
				return ledger.CreateActionResult{}, err, true
			}
			if len(pending) > 0 {
				res.Approval = pending[0]
			}
		}
		return res, nil, true
	}
	return ledger.CreateActionResult{}, nil, false
}

// gateParams is the gate's audit of a decision, as CreateAction records it
// with the action and in its gate event: the rule that decided (-1 for the
// default), the reason and the digest of the rules in force.
func gateParams(d approval.Decision) ledger.GateAudit {
	return ledger.GateAudit{Rule: d.Rule, Reason: d.Reason, RulesDigest: d.RulesDigest}
}

// refusalText is a refusal's message with the schema's issues, as a run
// that stopped over it records it.
func refusalText(pe *ProtocolError) string {
	msg := pe.Message
	for _, is := range pe.Issues {
		msg += "; " + is.Message
		if is.Location != "" {
			msg += " at " + is.Location
		}
	}
	return msg
}
