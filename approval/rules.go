package approval

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// DefaultApprovalTTL is how long a pending approval stays open when neither
// the matching rule nor Defaults set a TTL.
const DefaultApprovalTTL = 24 * time.Hour

// DefaultExecuteWithin is how long a granted approval covers a begin when
// neither the matching rule nor Defaults say: a person approves what is
// about to happen, not something that may happen tomorrow.
const DefaultExecuteWithin = 15 * time.Minute

// Defaults are what a Policy uses where the rules say nothing.
type Defaults struct {
	// ApprovalTTL bounds a pending approval whose rule sets no TTL, and
	// every approval required by the default for write actions. 0 means
	// DefaultApprovalTTL; a negative value is refused by NewPolicy.
	ApprovalTTL time.Duration
	// ExecuteWithin is how long a granted approval covers a begin when its
	// rule says nothing. 0 means DefaultExecuteWithin; a negative value is
	// refused by NewPolicy.
	ExecuteWithin time.Duration
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
	// ExecuteWithin is how long a grant covers a begin (the approval's
	// execute_by is the grant's time plus this): the matching rule's, else
	// the policy's default. Set only when Gate is ActionAwaitingApproval.
	ExecuteWithin time.Duration
	// AllowSelfApproval lets the run's submitter grant the action. Only a
	// rule requiring approval can set it; the default never does.
	AllowSelfApproval bool
	// AllowSelfConfirmation lets an MCP client's form-elicitation answer
	// grant the action (SelfConfirmation). Only a rule requiring approval
	// can set it; the default never does.
	AllowSelfConfirmation bool
	// Rule is the 0-based index of the matching rule in the rules file (as
	// in the JSON Pointer /rules/N), or -1 when no rule matched and the
	// default decided.
	Rule int
	// Reason says in words why, for events, logs and people, e.g.
	// "rule 2: cards.write requires approval" or
	// "default: write actions require approval".
	Reason string
	// RulesDigest is the digest of the rule set that decided, defaults
	// included (Policy.RulesDigest): with Rule it says which rule of which
	// rule set the action went through.
	RulesDigest ledger.Digest
}

// Policy evaluates approval rules. It is immutable once built and safe for
// concurrent use.
type Policy struct {
	rules    []contracts.Rule
	ttl      time.Duration
	within   time.Duration
	document []byte // the canonical JSON the digest covers
	digest   ledger.Digest
}

// defaultDecisions is what the defaults decide, by the tool's effect, when
// no rule matches; a tool of any other effect gets defaultUnknownEffect.
// Evaluate and the rules digest both read them, so a changed default
// changes the digest.
var defaultDecisions = map[contracts.Effect]contracts.RuleDecision{
	contracts.EffectRead:  contracts.RuleDecisionAutoApprove,
	contracts.EffectWrite: contracts.RuleDecisionRequireApproval,
}

// defaultUnknownEffect is the default for a tool whose effect is neither
// read nor write: when in doubt, a person decides.
const defaultUnknownEffect = contracts.RuleDecisionRequireApproval

// rulesInForce is the document a rules digest covers: every rule in file
// order as the contract encodes it (absent optional fields left out, so
// neither key order nor spacing of the file counts) and the defaults that
// apply where no rule says otherwise.
type rulesInForce struct {
	Rules    []contracts.Rule `json:"rules"`
	Defaults defaultsInForce  `json:"defaults"`
}

type defaultsInForce struct {
	// ApprovalTTLMS is the TTL of an approval whose rule sets none.
	ApprovalTTLMS int64 `json:"approval_ttl_ms"`
	// ExecuteWithinMS is how long a grant whose rule sets none covers a
	// begin.
	ExecuteWithinMS int64 `json:"execute_within_ms"`
	// Effects is the decision by effect when no rule matches.
	Effects map[contracts.Effect]contracts.RuleDecision `json:"effects"`
	// UnknownEffect is the decision for a tool of neither effect.
	UnknownEffect contracts.RuleDecision `json:"unknown_effect"`
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
	if defaults.ExecuteWithin < 0 {
		return nil, ledger.Errorf(ledger.CodeInvalid, "approval policy: default execute within cannot be negative")
	}
	p := &Policy{ttl: defaults.ApprovalTTL, within: defaults.ExecuteWithin}
	if p.ttl == 0 {
		p.ttl = DefaultApprovalTTL
	}
	if p.within == 0 {
		p.within = DefaultExecuteWithin
	}
	if r != nil {
		for i, rule := range r.Rules {
			if err := checkRule(rule); err != nil {
				return nil, ledger.Errorf(ledger.CodeInvalid, "approval policy: rule %d: %s", i, err)
			}
		}
		p.rules = slices.Clone(r.Rules)
	}
	doc := rulesInForce{Rules: p.rules, Defaults: defaultsInForce{
		ApprovalTTLMS: ledger.CeilMS(p.ttl), ExecuteWithinMS: ledger.CeilMS(p.within), Effects: defaultDecisions,
		UnknownEffect: defaultUnknownEffect,
	}}
	if doc.Rules == nil {
		doc.Rules = []contracts.Rule{} // no rules is [], never null
	}
	var err error
	if p.document, err = ledger.CanonicalJSON(doc); err != nil {
		return nil, ledger.Errorf(ledger.CodeInternal, "approval policy: rules digest: %w", err)
	}
	p.digest = ledger.DigestCanonical(p.document)
	return p, nil
}

// RuleSet is the document RulesDigest covers, in its canonical JSON: what
// the ledger stores under the digest (ledger.Store.PutRuleSet) so that the
// rule an action's gate names can be shown. The caller owns the bytes.
func (p *Policy) RuleSet() json.RawMessage { return slices.Clone(p.document) }

// RulesDigest is the digest (sha256 of the RFC 8785 canonical JSON) of the
// rules in force: the rules in file order and the defaults that apply where
// none matches (the default approval TTL; reads approved, writes and tools
// of unknown effect waiting for a person; how long a grant covers a
// begin). Two policies built from the same
// rules and defaults have the same digest, however the rules file ordered
// its keys; a changed rule, rule order or default changes it. Every
// Decision carries it, and the ledger records it with the gate's decision.
//
// The document is
//
//	{"defaults": {"approval_ttl_ms": N, "effects": {"read": D, "write": D}, "execute_within_ms": N,
//	              "unknown_effect": D},
//	 "rules": [ rule, … ]}
//
// with each rule as the rules contract encodes it, optional fields that are
// absent left out.
func (p *Policy) RulesDigest() ledger.Digest { return p.digest }

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
	case r.Decision != contracts.RuleDecisionRequireApproval && r.AllowSelfConfirmation:
		return fmt.Errorf("allow_self_confirmation needs decision %s", contracts.RuleDecisionRequireApproval)
	case r.ExecuteWithinMS < 0:
		return fmt.Errorf("execute within cannot be negative")
	case r.Decision != contracts.RuleDecisionRequireApproval && r.ExecuteWithinMS != 0:
		return fmt.Errorf("execute within needs decision %s", contracts.RuleDecisionRequireApproval)
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
		d := Decision{Rule: i, RulesDigest: p.digest}
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
			d.ExecuteWithin = r.ExecuteWithin()
			if d.ExecuteWithin == 0 {
				d.ExecuteWithin = p.within
			}
			d.AllowSelfApproval, d.AllowSelfConfirmation = r.AllowSelfApproval, r.AllowSelfConfirmation
			d.Reason = fmt.Sprintf("rule %d: %s requires approval", i, tool.Name)
		}
		return d
	}
	d := Decision{Rule: -1, RulesDigest: p.digest}
	decision, known := defaultDecisions[tool.Effect]
	if !known {
		decision = defaultUnknownEffect
	}
	var does, do string // the decision in words, for one tool and for many
	switch decision {
	case contracts.RuleDecisionAutoApprove:
		d.Gate, does, do = ledger.ActionApproved, "is auto-approved", "are auto-approved"
	case contracts.RuleDecisionDeny:
		d.Gate, does, do = ledger.ActionDenied, "is denied", "are denied"
	default:
		d.Gate, d.ApprovalTTL, d.ExecuteWithin = ledger.ActionAwaitingApproval, p.ttl, p.within
		does, do = "requires approval", "require approval"
	}
	if known {
		d.Reason = fmt.Sprintf("default: %s actions %s", tool.Effect, do)
	} else {
		d.Reason = fmt.Sprintf("default: %s declares no known effect and %s", tool.Name, does)
	}
	return d
}

func matches(r contracts.Rule, tenant string, tool contracts.ToolDescriptor) bool {
	return (r.Tool == contracts.Wildcard || r.Tool == tool.Name) &&
		(r.Tenant == "" || r.Tenant == contracts.Wildcard || r.Tenant == tenant) &&
		(r.Effect == "" || r.Effect == tool.Effect)
}
