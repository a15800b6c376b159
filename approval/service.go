package approval

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/redact"
)

// MaxReasonLength is the longest reason, in characters (runes), a person
// may give with a decision.
const MaxReasonLength = 1000

// ToolLookupFunc returns the descriptor of a registered tool by name, and
// false for a tool the caller does not know.
type ToolLookupFunc func(name string) (contracts.ToolDescriptor, bool)

// Options tune a Service.
type Options struct {
	// RelaxSeparationOfDuties lets the principal who submitted a run grant
	// its actions. It is for development mode only, where one principal
	// tries the whole flow.
	RelaxSeparationOfDuties bool
	// Redactor hides secrets in a decision's reason before it is stored, as
	// the engine does with tool output: a person's free text may hold one,
	// and the approval and its event keep it. Give it the process's keyed
	// redactor so markers correlate with evidence exports; nil means one
	// with a random key of this process (still redacted, but its markers
	// match no other process's).
	Redactor *redact.Redactor
}

// Service runs the approval lifecycle over a Store: it gates new actions,
// lets people decide pending approvals, lists them and expires them. It is
// safe for concurrent use; the Store serializes decisions.
type Service struct {
	store  ledger.Store
	policy *Policy
	tools  ToolLookupFunc
	opts   Options
}

// NewService returns a Service over store. A nil policy means the defaults
// only; a nil tools lookup knows no tool, so no rule can allow
// self-approval. It panics if store is nil, a wiring bug.
func NewService(store ledger.Store, policy *Policy, tools ToolLookupFunc, opts Options) *Service {
	if store == nil {
		panic("approval: NewService needs a store")
	}
	if policy == nil {
		var err error
		if policy, err = NewPolicy(nil, Defaults{}); err != nil {
			panic("approval: the default policy: " + err.Error())
		}
	}
	if tools == nil {
		tools = func(string) (contracts.ToolDescriptor, bool) { return contracts.ToolDescriptor{}, false }
	}
	if opts.Redactor == nil {
		r, err := redact.NewRedactor([]byte(rand.Text()))
		if err != nil {
			panic("approval: a redactor with a random key: " + err.Error())
		}
		opts.Redactor = r
	}
	return &Service{store: store, policy: policy, tools: tools, opts: opts}
}

// DecideParams is a person's decision on an action's pending approval.
type DecideParams struct {
	// Tenant and Principal identify the person deciding.
	Tenant    string
	Principal string
	ActionID  ledger.ActionID
	// ActionDigest is the digest the person saw; the decision applies only
	// if the pending approval is bound to it.
	ActionDigest ledger.Digest
	Decision     ledger.ApprovalDecision
	// Reason is optional, at most MaxReasonLength characters.
	Reason string
}

// Decide grants or denies the pending approval of an action. The checks run
// in this order, and the first that fails decides the error:
//
//  1. The request itself: tenant and principal present, decision grant or
//     deny, a well-formed digest, a reason of at most MaxReasonLength
//     characters. CodeInvalid.
//  2. The action is loaded. An unknown action and another tenant's action
//     are the same CodeNotFound with the same message, so ids reveal
//     nothing across tenants.
//  3. Its run is loaded, and separation of duties is checked: the principal
//     who submitted the run may not grant its actions (CodeForbidden),
//     unless the rule that matches the action's tool now allows
//     self-approval, or Options.RelaxSeparationOfDuties is set. The tool is
//     looked up by the action's recorded name and evaluated with the
//     action's recorded effect; an unknown tool allows nothing. The rules
//     in force at decision time govern, so tightening them takes effect on
//     approvals already pending. Denying is always allowed to the
//     submitter: it only stops work, and a submitter who regrets a run
//     should be able to stop it.
//  4. The reason is redacted (Options.Redactor) once it has passed its
//     checks.
//  5. Store.DecideApproval checks, in the transaction that records the
//     decision, that the approval is pending, bound to p.ActionDigest and
//     not past its expiry; otherwise CodeConflict and nothing changes. Of
//     concurrent decisions on one approval exactly one succeeds. A grant
//     gets its execute_by from the rule that matches the action's tool
//     now (its execute_within_ms), else the policy's default.
//
// Steps 2 and 3 read outside the deciding transaction. That is safe because
// what they read (an action's tenant, tool and effect, a run's submitter)
// never changes once recorded.
func (s *Service) Decide(ctx context.Context, p DecideParams) (ledger.DecideApprovalResult, error) {
	if err := checkDecideParams(p); err != nil {
		return ledger.DecideApprovalResult{}, err
	}
	action, err := s.store.FindActionByID(ctx, p.ActionID)
	switch {
	case ledger.Code(err) == ledger.CodeNotFound || (err == nil && action.Tenant != p.Tenant):
		return ledger.DecideApprovalResult{}, notFound(p.ActionID)
	case err != nil:
		return ledger.DecideApprovalResult{}, wrap("decide approval", err)
	}
	if p.Decision == ledger.DecisionGrant {
		run, err := s.store.FindRunByID(ctx, action.RunID)
		if err != nil {
			return ledger.DecideApprovalResult{}, wrap("decide approval: run of action", err)
		}
		if run.SubmittedBy == p.Principal && !s.opts.RelaxSeparationOfDuties && !s.allowsSelfApproval(action) {
			return ledger.DecideApprovalResult{}, ledger.Errorf(ledger.CodeForbidden,
				"principal %s submitted run %s and cannot approve its actions", p.Principal, run.ID)
		}
	}
	res, err := s.store.DecideApproval(ctx, ledger.DecideApprovalParams{
		ActionID: p.ActionID, ActionDigest: p.ActionDigest, Decision: p.Decision,
		Principal: p.Principal, Reason: s.opts.Redactor.RedactString(p.Reason),
		ExecuteWithin: s.executeWithin(action),
	})
	if err != nil {
		// The Store's error already names the operation ("decide approval:").
		return ledger.DecideApprovalResult{}, err
	}
	return res, nil
}

func checkDecideParams(p DecideParams) error {
	switch {
	case p.Tenant == "":
		return ledger.Errorf(ledger.CodeInvalid, "decide approval: tenant is required")
	case p.Principal == "":
		return ledger.Errorf(ledger.CodeInvalid, "decide approval: principal is required")
	case p.Decision != ledger.DecisionGrant && p.Decision != ledger.DecisionDeny:
		return ledger.Errorf(ledger.CodeInvalid, "decide approval: decision must be %s or %s, not %q",
			ledger.DecisionGrant, ledger.DecisionDeny, p.Decision)
	case !p.ActionDigest.Valid():
		return ledger.Errorf(ledger.CodeInvalid, "decide approval: action digest must be sha256:<64 hex>")
	case utf8.RuneCountInString(p.Reason) > MaxReasonLength:
		return ledger.Errorf(ledger.CodeInvalid, "decide approval: reason is longer than %d characters", MaxReasonLength)
	}
	return nil
}

// notFound is the one answer for an unknown action and another tenant's.
func notFound(id ledger.ActionID) error {
	return ledger.Errorf(ledger.CodeNotFound, "action %s not found", id)
}

// allowsSelfApproval reports whether the rule matching the action's tool
// lets the run's submitter grant it. An unknown tool allows nothing.
func (s *Service) allowsSelfApproval(a *ledger.Action) bool {
	tool, ok := s.recorded(a)
	if !ok {
		return false
	}
	d := s.policy.Evaluate(a.Tenant, tool)
	return d.Gate == ledger.ActionAwaitingApproval && d.AllowSelfApproval
}

// SelfConfirmer is the principal a grant made by an MCP client's own answer
// to a form elicitation is recorded under (SelfConfirm): client code, not a
// signed-in person. No token should name it.
const SelfConfirmer = "self_confirmation"

// AllowsSelfConfirmation reports whether the rule matching the action's
// tool now lets an MCP client's own confirmation grant it
// (allow_self_confirmation). An unknown tool allows nothing.
func (s *Service) AllowsSelfConfirmation(a *ledger.Action) bool {
	tool, ok := s.recorded(a)
	if !ok {
		return false
	}
	d := s.policy.Evaluate(a.Tenant, tool)
	return d.Gate == ledger.ActionAwaitingApproval && d.AllowSelfConfirmation
}

// SelfConfirm grants the pending approval of an action of tenant, bound to
// digest, on the answer of caller's MCP client to a form elicitation: only
// where the rule allows it (else CodeForbidden), recorded as SelfConfirmer
// with a reason that names the caller. The store's checks are Decide's.
func (s *Service) SelfConfirm(ctx context.Context, tenant, caller string, id ledger.ActionID, digest ledger.Digest) (ledger.DecideApprovalResult, error) {
	action, err := s.store.FindActionByID(ctx, id)
	switch {
	case ledger.Code(err) == ledger.CodeNotFound || (err == nil && action.Tenant != tenant):
		return ledger.DecideApprovalResult{}, notFound(id)
	case err != nil:
		return ledger.DecideApprovalResult{}, wrap("self-confirm", err)
	case !s.AllowsSelfConfirmation(action):
		return ledger.DecideApprovalResult{}, ledger.Errorf(ledger.CodeForbidden,
			"no rule lets a client's own confirmation grant %s: a person approves it", action.Tool)
	}
	return s.store.DecideApproval(ctx, ledger.DecideApprovalParams{
		ActionID: id, ActionDigest: digest, Decision: ledger.DecisionGrant, Principal: SelfConfirmer,
		Reason:        clip(fmt.Sprintf("confirmed by the MCP client of %s (form elicitation), as rule allow_self_confirmation allows", caller), MaxReasonLength),
		ExecuteWithin: s.executeWithin(action),
	})
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// executeWithin is how long a grant of the action covers a begin.
func (s *Service) executeWithin(a *ledger.Action) time.Duration {
	tool, _ := s.recorded(a)
	return s.PersonGate(a.Tenant, tool).ExecuteWithin
}

// recorded is the descriptor of the action's tool, with the action's
// recorded name and effect: those are what its digest binds and what was
// gated, and a descriptor that changed since does not count. False for an
// unknown tool, whose descriptor is then the name and effect alone.
func (s *Service) recorded(a *ledger.Action) (contracts.ToolDescriptor, bool) {
	tool, ok := s.tools(a.Tool)
	tool.Name, tool.Effect = a.Tool, a.Effect
	return tool, ok
}

// PersonGate is the gate's decision when a person is asked about an action
// of tool in tenant whatever the rules decide for it now: the matching
// rule's approval TTL, execute_within and self-approval when it requires
// approval, else the policy's defaults. Decide takes a grant's execute_by
// from it; the engine asks with it again for an approved action whose
// approval no longer covers a begin.
func (s *Service) PersonGate(tenant string, tool contracts.ToolDescriptor) Decision {
	d := s.policy.Evaluate(tenant, tool)
	if d.Gate != ledger.ActionAwaitingApproval {
		d.Gate, d.ApprovalTTL, d.ExecuteWithin, d.AllowSelfApproval = ledger.ActionAwaitingApproval, s.policy.ttl, s.policy.within, false
	}
	return d
}

// ExpireDue expires every pending approval whose TTL has passed by the
// Store's clock, and its action, returning the approvals it expired. Call it
// periodically and at start-up; it is idempotent.
func (s *Service) ExpireDue(ctx context.Context) ([]*ledger.Approval, error) {
	// The Store's error already names the operation ("expire approvals:").
	return s.store.ExpireApprovals(ctx)
}

// Pending lists a tenant's pending approvals in id (creation) order, at
// most limit of them; limit 0 means all. Approvals past their expiry that
// ExpireDue has not yet expired are still listed; deciding them is
// CodeConflict. CodeInvalid for an empty tenant or a negative limit.
func (s *Service) Pending(ctx context.Context, tenant string, limit int) ([]*ledger.Approval, error) {
	switch {
	case tenant == "":
		return nil, ledger.Errorf(ledger.CodeInvalid, "pending approvals: tenant is required")
	case limit < 0:
		return nil, ledger.Errorf(ledger.CodeInvalid, "pending approvals: limit cannot be negative")
	}
	state := ledger.ApprovalPending
	out, err := s.store.FindApprovals(ctx, ledger.ApprovalFilter{Tenant: &tenant, State: &state, Limit: limit})
	if err != nil {
		return nil, wrap("pending approvals", err)
	}
	return out, nil
}

// Gate decides which state a new action of tool enters in tenant; the
// engine passes Gate and ApprovalTTL to Store.CreateAction, and the rule,
// reason and rules digest as the gate's audit. See Policy.Evaluate.
func (s *Service) Gate(tenant string, tool contracts.ToolDescriptor) Decision {
	return s.policy.Evaluate(tenant, tool)
}

// StoreRules stores the rule set in force (Policy.RuleSet) in the ledger
// under its digest, once: a process calls it when it starts with its rules,
// before any action can cite them, so that the rule an action's gate names
// can be shown (ledger rules show, evidence reports). Storing a rule set
// stored already changes nothing.
func (s *Service) StoreRules(ctx context.Context) (ledger.PutRuleSetResult, error) {
	r, err := s.store.PutRuleSet(ctx, s.policy.RuleSet())
	if err != nil {
		return ledger.PutRuleSetResult{}, wrap("store rules", err)
	}
	return r, nil
}

// RulesDigest is the digest of the rules in force (Policy.RulesDigest),
// which every decision of Gate carries.
func (s *Service) RulesDigest() ledger.Digest { return s.policy.RulesDigest() }

// wrap adds context to err and keeps its code, so the outermost error is a
// *ledger.Error with the code of the cause.
func wrap(op string, err error) error {
	return ledger.Errorf(ledger.Code(err), "%s: %w", op, err)
}
