package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/actionledger/ledger/ledger"
)

// Approvals that no longer cover a begin. An approved action may begin
// only under the approval it got: a person's, until its execute_by (the
// ledger refuses a later attempt with CodeApprovalStale, and reask asks
// the person again for the same digest); or the rules', as they decide
// now and for the tool's descriptor as it is now (regate puts a new
// action, which supersedes it, through the gate again). Both the engine's
// own attempts and the protocol's Begin check this before they begin.

// errArgumentsDrifted is regate's refusal: the approved arguments no
// longer fit the schema of the tool as it is now.
var errArgumentsDrifted = errors.New("the arguments no longer fit the tool's schema")

// drift says why the gate must decide approved action a again before it
// begins, "" if it need not: the descriptor of its tool changed since the
// action was recorded (its version), or the rules approved it and no
// longer do (and no person has approved it since).
func (e *Engine) drift(ctx context.Context, run *ledger.Run, a *ledger.Action, tool registeredTool) (string, error) {
	if tool.desc.Version != a.ToolVersion {
		return fmt.Sprintf("tool %s changed since the action was approved: version %s, now %s", a.Tool, a.ToolVersion, tool.desc.Version), nil
	}
	if a.Gate == nil || a.Gate.Decision != ledger.ActionApproved {
		return "", nil
	}
	if d := e.approvals.Gate(run.Tenant, tool.desc); d.Gate != ledger.ActionApproved {
		granted, err := e.store.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &a.RunID, ActionID: &a.ID, State: ptr(ledger.ApprovalGranted)})
		if err != nil || len(granted) > 0 {
			return "", err // a person approved it since: their approval governs
		}
		return "the rules no longer approve it: " + d.Reason, nil
	}
	return "", nil
}

// regate records, for approved action a whose approval drifted (why), a
// new action of the same call at the tool's version that supersedes it,
// through the gate as a proposal is: the rules decide again, and a person
// is asked if they require one. errArgumentsDrifted (wrapped) if the
// arguments no longer fit the tool's schema; nothing is recorded then.
func (e *Engine) regate(ctx context.Context, run *ledger.Run, a *ledger.Action, tool registeredTool, why string) (*ledger.Action, error) {
	if err := tool.args.Validate(a.Arguments); err != nil {
		return nil, fmt.Errorf("%s, and %w: %w", why, errArgumentsDrifted, err)
	}
	gate := e.approvals.Gate(run.Tenant, tool.desc)
	audit := gateParams(gate)
	audit.Reason = truncate(why+"; "+gate.Reason, ledger.MaxGateReasonLength)
	res, err := e.store.CreateAction(ctx, ledger.CreateActionParams{
		RunID: run.ID, IdempotencyKey: "regate/" + string(a.ID), Tool: tool.desc.Name, ToolVersion: tool.desc.Version,
		Effect: tool.desc.Effect, Arguments: a.Arguments, Supersedes: a.ID, Gate: gate.Gate, ApprovalTTL: gate.ApprovalTTL,
		GateAudit: audit, Actor: "engine",
	})
	if err != nil {
		return nil, fmt.Errorf("regate action %s: %w", a.ID, err)
	}
	e.log.InfoContext(ctx, "an approved action went through the gate again", "run", run.ID, "action", a.ID,
		"new_action", res.Action.ID, "gate", gate.Gate, "why", why)
	return res.Action, nil
}

// reask asks a person again about approved action a, whose approval passed
// its execute_by (stale, the ledger's refusal), for the same digest, with
// the approval TTL of the rule that matches its tool, and returns the
// action as it waits now.
func (e *Engine) reask(ctx context.Context, run *ledger.Run, a *ledger.Action, tool registeredTool, stale error) (*ledger.Action, error) {
	d := e.approvals.PersonGate(run.Tenant, tool.desc)
	res, err := e.store.ReaskApproval(ctx, ledger.ReaskApprovalParams{ActionID: a.ID,
		Reason: truncate(stale.Error(), ledger.MaxGateReasonLength), ApprovalTTL: d.ApprovalTTL, Actor: "engine"})
	if err != nil {
		return nil, fmt.Errorf("ask for approval of action %s again: %w", a.ID, err)
	}
	e.log.InfoContext(ctx, "an approval passed its execute_by: a person is asked again", "run", run.ID, "action", a.ID,
		"approval", res.Approval.ID)
	return res.Action, nil
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
