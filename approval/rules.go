package approval

import (
	"fmt"
	"slices"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// DefaultApprovalTTL is how long a pending approval stays open when neither
// the matching rule nor Defaults set a TTL.
const DefaultApprovalTTL = 24 * time.Hour

// Defaults are what a Policy uses where the rules say nothing.
type Defaults struct {
	// ApprovalTTL bounds a pending approval whose rule sets no TTL, and
	// every approval required by the default for write actions. 0 means
	// DefaultApprovalTTL; a negative value is refused by NewPolicy.
	ApprovalTTL time.Duration
}

// Decision is what a Policy decided for one tool in one tenant.
type Decision struct {
	// Gate is the state a new action enters: ActionApproved,
	// ActionAwaitingApproval or ActionDenied.
	Gate ledger.ActionState
	// ApprovalTTL bounds the pending approval: the matching rule's TTL, else
	// the policy's default. It is set only when Gate is
	// ActionAwaitingApproval, and 0 otherwise.
	ApprovalTTL time.Duration
	// AllowSelfApproval lets the run's submitter grant the action. Only a
	// rule requiring approval can set it; the default never does.
	AllowSelfApproval bool
	// Rule is the 0-based index of the matching rule in the rules file (as
	// in the JSON Pointer /rules/N), or -1 when no rule matched and the
	// default decided.
	Rule int
	// Reason says in words why, for events, logs and people, e.g.
	// "rule 2: cards.write requires approval" or
	// "default: write actions require approval".
	Reason string
}

// Policy evaluates approval rules. It is immutable once built and safe for
// concurrent use.
type Policy struct {
	rules []contracts.Rule
	ttl   time.Duration
}

// NewPolicy builds a Policy from rules, which it copies, and defaults. Nil
// rules (or none) leave only the defaults: reads are approved without a
// person, writes require approval.
//
// Rules parsed with contracts.ParseRules already obey the schema; rules
// built in code are checked here against the same constraints (a tool, a
// known decision and effect, a TTL and self-approval only with
// require_approval), and a breach is CodeInvalid naming the rule's index.
func NewPolicy(r *contracts.Rules, defaults Defaults) (*Policy, error) {
	if defaults.ApprovalTTL < 0 {
		return nil, ledger.Errorf(ledger.CodeInvalid, "approval policy: default approval TTL cannot be negative")
	}
	p := &Policy{ttl: defaults.ApprovalTTL}
	if p.ttl == 0 {
		p.ttl = DefaultApprovalTTL
	}
	if r == nil {
		return p, nil
	}
	for i, rule := range r.Rules {
		if err := checkRule(rule); err != nil {
			return nil, ledger.Errorf(ledger.CodeInvalid, "approval policy: rule %d: %s", i, err)
		}
	}
	p.rules = slices.Clone(r.Rules)
	return p, nil
}

// checkRule mirrors the constraints of the rules schema for rules that did
// not come through contracts.ParseRules.
func checkRule(r contracts.Rule) error {
	switch {
	case r.Tool == "":
		return fmt.Errorf("tool is required (a tool name or %q)", contracts.Wildcard)
	case !r.Decision.Valid():
		return fmt.Errorf("unknown decision %q", r.Decision)
	case r.Effect != "" && !r.Effect.Valid():
		return fmt.Errorf("unknown effect %q", r.Effect)
	case r.ApprovalTTLMS < 0:
		return fmt.Errorf("approval TTL cannot be negative")
	case r.Decision != contracts.RuleDecisionRequireApproval && r.ApprovalTTLMS != 0:
		return fmt.Errorf("an approval TTL needs decision %s", contracts.RuleDecisionRequireApproval)
	case r.Decision != contracts.RuleDecisionRequireApproval && r.AllowSelfApproval:
		return fmt.Errorf("allow_self_approval needs decision %s", contracts.RuleDecisionRequireApproval)
	}
	return nil
}

// Evaluate decides what happens to an action of tool in tenant. The first
// rule that matches wins, in file order: a rule matches when its tool is the
// tool's name or "*", its tenant is empty, "*" or tenant, and its effect is
// empty or the tool's effect.
//
// When no rule matches, read actions are approved and every other action
// waits for approval. A tool whose effect is neither read nor write counts
// as a write: when in doubt, a person decides.
func (p *Policy) Evaluate(tenant string, tool contracts.ToolDescriptor) Decision {
	for i, r := range p.rules {
		if !matches(r, tenant, tool) {
			continue
		}
		d := Decision{Rule: i}
		switch r.Decision {
		case contracts.RuleDecisionAutoApprove:
			d.Gate = ledger.ActionApproved
			d.Reason = fmt.Sprintf("rule %d: %s is auto-approved", i, tool.Name)
		case contracts.RuleDecisionDeny:
			d.Gate = ledger.ActionDenied
			d.Reason = fmt.Sprintf("rule %d: %s is denied", i, tool.Name)
		default: // require_approval; NewPolicy refused anything else
			d.Gate = ledger.ActionAwaitingApproval
			d.ApprovalTTL = r.ApprovalTTL()
			if d.ApprovalTTL == 0 {
				d.ApprovalTTL = p.ttl
			}
			d.AllowSelfApproval = r.AllowSelfApproval
			d.Reason = fmt.Sprintf("rule %d: %s requires approval", i, tool.Name)
		}
		return d
	}
	switch tool.Effect {
	case contracts.EffectRead:
		return Decision{Gate: ledger.ActionApproved, Rule: -1, Reason: "default: read actions are auto-approved"}
	case contracts.EffectWrite:
		return Decision{Gate: ledger.ActionAwaitingApproval, ApprovalTTL: p.ttl, Rule: -1,
			Reason: "default: write actions require approval"}
	default:
		return Decision{Gate: ledger.ActionAwaitingApproval, ApprovalTTL: p.ttl, Rule: -1,
			Reason: fmt.Sprintf("default: %s declares no known effect and requires approval", tool.Name)}
	}
}

func matches(r contracts.Rule, tenant string, tool contracts.ToolDescriptor) bool {
	return (r.Tool == contracts.Wildcard || r.Tool == tool.Name) &&
		(r.Tenant == "" || r.Tenant == contracts.Wildcard || r.Tenant == tenant) &&
		(r.Effect == "" || r.Effect == tool.Effect)
}
