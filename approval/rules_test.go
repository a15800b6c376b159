package approval_test

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

var (
	cardsWrite = contracts.ToolDescriptor{Name: "cards.write", Version: "1", Effect: contracts.EffectWrite}
	refund     = contracts.ToolDescriptor{Name: "payments.refund", Version: "1", Effect: contracts.EffectWrite}
	refundRead = contracts.ToolDescriptor{Name: "payments.refund", Version: "1", Effect: contracts.EffectRead}
	docsSearch = contracts.ToolDescriptor{Name: "docs.search", Version: "1", Effect: contracts.EffectRead}
	mailSend   = contracts.ToolDescriptor{Name: "mail.send", Version: "1", Effect: contracts.EffectWrite}
	noEffect   = contracts.ToolDescriptor{Name: "odd.tool", Version: "1"}
)

// validRules loads contracts/testdata/rules.valid.json:
//
//	0: cards.write, tenant acme → require_approval, TTL 1h
//	1: payments.refund → deny
//	2: *, effect read → auto_approve
//	3: *, tenant *, effect write → require_approval
func validRules(t *testing.T) *contracts.Rules {
	t.Helper()
	data, err := os.ReadFile("../contracts/testdata/rules.valid.json")
	require.NoError(t, err)
	r, err := contracts.ParseRules(data)
	require.NoError(t, err)
	return r
}

func rules(rs ...contracts.Rule) *contracts.Rules {
	return &contracts.Rules{SchemaVersion: contracts.CurrentVersion, Rules: rs}
}

func TestPolicyEvaluate(t *testing.T) {
	file := validRules(t)
	const day = 24 * time.Hour
	awaiting := func(rule int, ttl time.Duration, self bool, reason string) approval.Decision {
		return approval.Decision{Gate: ledger.ActionAwaitingApproval, ApprovalTTL: ttl, AllowSelfApproval: self,
			Rule: rule, Reason: reason, ExecuteWithin: approval.DefaultExecuteWithin}
	}
	within := func(d approval.Decision, w time.Duration) approval.Decision { d.ExecuteWithin = w; return d }
	approved := func(rule int, reason string) approval.Decision {
		return approval.Decision{Gate: ledger.ActionApproved, Rule: rule, Reason: reason}
	}
	denied := func(rule int, reason string) approval.Decision {
		return approval.Decision{Gate: ledger.ActionDenied, Rule: rule, Reason: reason}
	}

	tests := []struct {
		name     string
		rules    *contracts.Rules
		defaults approval.Defaults
		tenant   string
		tool     contracts.ToolDescriptor
		want     approval.Decision
	}{
		// The rules file.
		{"file: tenant rule with its TTL", file, approval.Defaults{}, "acme", cardsWrite,
			awaiting(0, time.Hour, false, "rule 0: cards.write requires approval")},
		{"file: other tenant falls through to write rule with default TTL", file, approval.Defaults{}, "globex", cardsWrite,
			awaiting(3, day, false, "rule 3: cards.write requires approval")},
		{"file: configured default TTL", file, approval.Defaults{ApprovalTTL: 2 * time.Hour}, "globex", cardsWrite,
			awaiting(3, 2*time.Hour, false, "rule 3: cards.write requires approval")},
		{"file: deny", file, approval.Defaults{}, "acme", refund,
			denied(1, "rule 1: payments.refund is denied")},
		{"file: first match wins over a later read rule", file, approval.Defaults{}, "acme", refundRead,
			denied(1, "rule 1: payments.refund is denied")},
		{"file: read wildcard", file, approval.Defaults{}, "globex", docsSearch,
			approved(2, "rule 2: docs.search is auto-approved")},
		{"file: tenant wildcard", file, approval.Defaults{}, "initech", mailSend,
			awaiting(3, day, false, "rule 3: mail.send requires approval")},

		// Defaults only.
		{"nil rules: read auto-approved", nil, approval.Defaults{}, "acme", docsSearch,
			approved(-1, "default: read actions are auto-approved")},
		{"nil rules: write requires approval", nil, approval.Defaults{}, "acme", cardsWrite,
			awaiting(-1, day, false, "default: write actions require approval")},
		{"nil rules: write with configured TTL", nil, approval.Defaults{ApprovalTTL: time.Minute}, "acme", cardsWrite,
			awaiting(-1, time.Minute, false, "default: write actions require approval")},
		{"no rules: unknown effect counts as write", rules(), approval.Defaults{}, "acme", noEffect,
			awaiting(-1, day, false, "default: odd.tool declares no known effect and requires approval")},
		{"no matching rule: default", rules(contracts.Rule{Tool: "mail.send", Decision: contracts.RuleDecisionDeny}),
			approval.Defaults{}, "acme", cardsWrite, awaiting(-1, day, false, "default: write actions require approval")},

		// Matching.
		{"first match wins", rules(
			contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionAutoApprove},
			contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionDeny},
		), approval.Defaults{}, "acme", cardsWrite, approved(0, "rule 0: cards.write is auto-approved")},
		{"tool must equal", rules(
			contracts.Rule{Tool: "cards", Decision: contracts.RuleDecisionDeny},
			contracts.Rule{Tool: "cards.write.x", Decision: contracts.RuleDecisionDeny},
			contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionAutoApprove},
		), approval.Defaults{}, "acme", cardsWrite, approved(2, "rule 2: cards.write is auto-approved")},
		{"tool wildcard", rules(contracts.Rule{Tool: "*", Decision: contracts.RuleDecisionDeny}),
			approval.Defaults{}, "acme", docsSearch, denied(0, "rule 0: docs.search is denied")},
		{"empty tenant matches any", rules(contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionAutoApprove}),
			approval.Defaults{}, "globex", cardsWrite, approved(0, "rule 0: cards.write is auto-approved")},
		{"tenant wildcard matches any", rules(contracts.Rule{Tool: "cards.write", Tenant: "*", Decision: contracts.RuleDecisionAutoApprove}),
			approval.Defaults{}, "globex", cardsWrite, approved(0, "rule 0: cards.write is auto-approved")},
		{"tenant must equal", rules(
			contracts.Rule{Tool: "cards.write", Tenant: "acme", Decision: contracts.RuleDecisionDeny},
			contracts.Rule{Tool: "cards.write", Tenant: "globex", Decision: contracts.RuleDecisionAutoApprove},
		), approval.Defaults{}, "globex", cardsWrite, approved(1, "rule 1: cards.write is auto-approved")},
		{"effect must equal", rules(
			contracts.Rule{Tool: "*", Effect: contracts.EffectWrite, Decision: contracts.RuleDecisionDeny},
		), approval.Defaults{}, "acme", docsSearch, approved(-1, "default: read actions are auto-approved")},
		{"effect rule can auto-approve writes", rules(
			contracts.Rule{Tool: "*", Effect: contracts.EffectWrite, Decision: contracts.RuleDecisionAutoApprove},
		), approval.Defaults{}, "acme", mailSend, approved(0, "rule 0: mail.send is auto-approved")},
		{"rule can require approval for reads", rules(
			contracts.Rule{Tool: "docs.search", Decision: contracts.RuleDecisionRequireApproval, ApprovalTTLMS: 60000},
		), approval.Defaults{}, "acme", docsSearch, awaiting(0, time.Minute, false, "rule 0: docs.search requires approval")},
		{"allow self approval", rules(
			contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionRequireApproval, AllowSelfApproval: true},
		), approval.Defaults{}, "acme", cardsWrite, awaiting(0, day, true, "rule 0: cards.write requires approval")},
		{"rule's execute within", rules(
			contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionRequireApproval, ExecuteWithinMS: 120000},
		), approval.Defaults{ExecuteWithin: time.Hour}, "acme", cardsWrite,
			within(awaiting(0, day, false, "rule 0: cards.write requires approval"), 2*time.Minute)},
		{"configured default execute within", rules(
			contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionRequireApproval},
		), approval.Defaults{ExecuteWithin: time.Hour}, "acme", cardsWrite,
			within(awaiting(0, day, false, "rule 0: cards.write requires approval"), time.Hour)},
		{"default never allows self approval", rules(
			contracts.Rule{Tool: "mail.send", Decision: contracts.RuleDecisionRequireApproval, AllowSelfApproval: true},
		), approval.Defaults{}, "acme", cardsWrite, awaiting(-1, day, false, "default: write actions require approval")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := approval.NewPolicy(tt.rules, tt.defaults)
			require.NoError(t, err)
			want := tt.want
			want.RulesDigest = p.RulesDigest()
			require.True(t, want.RulesDigest.Valid())
			require.Equal(t, want, p.Evaluate(tt.tenant, tt.tool))
		})
	}
}

func TestNewPolicy(t *testing.T) {
	t.Run("ErrInvalid", func(t *testing.T) {
		tests := []struct {
			name     string
			rules    *contracts.Rules
			defaults approval.Defaults
			msg      string
		}{
			{"negative default TTL", nil, approval.Defaults{ApprovalTTL: -time.Second}, "default approval TTL"},
			{"negative default execute within", nil, approval.Defaults{ExecuteWithin: -time.Second}, "default execute within"},
			{"no tool", rules(contracts.Rule{Decision: contracts.RuleDecisionDeny}), approval.Defaults{}, "rule 0: tool is required"},
			{"unknown decision", rules(
				contracts.Rule{Tool: "*", Decision: contracts.RuleDecisionDeny},
				contracts.Rule{Tool: "*", Decision: "maybe"},
			), approval.Defaults{}, `rule 1: unknown decision "maybe"`},
			{"unknown effect", rules(contracts.Rule{Tool: "*", Effect: "delete", Decision: contracts.RuleDecisionDeny}),
				approval.Defaults{}, `rule 0: unknown effect "delete"`},
			{"negative TTL", rules(contracts.Rule{Tool: "*", Decision: contracts.RuleDecisionRequireApproval, ApprovalTTLMS: -1}),
				approval.Defaults{}, "rule 0: approval TTL cannot be negative"},
			{"TTL without require_approval", rules(contracts.Rule{Tool: "*", Decision: contracts.RuleDecisionAutoApprove, ApprovalTTLMS: 1}),
				approval.Defaults{}, "rule 0: an approval TTL needs decision require_approval"},
			{"self approval without require_approval", rules(contracts.Rule{Tool: "*", Decision: contracts.RuleDecisionDeny, AllowSelfApproval: true}),
				approval.Defaults{}, "rule 0: allow_self_approval needs decision require_approval"},
			{"negative execute within", rules(contracts.Rule{Tool: "*", Decision: contracts.RuleDecisionRequireApproval, ExecuteWithinMS: -1}),
				approval.Defaults{}, "rule 0: execute within cannot be negative"},
			{"execute within without require_approval", rules(contracts.Rule{Tool: "*", Decision: contracts.RuleDecisionAutoApprove, ExecuteWithinMS: 1}),
				approval.Defaults{}, "rule 0: execute within needs decision require_approval"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				p, err := approval.NewPolicy(tt.rules, tt.defaults)
				require.Nil(t, p)
				require.Equal(t, ledger.CodeInvalid, ledger.Code(err))
				require.ErrorContains(t, err, tt.msg)
			})
		}
	})

	t.Run("CopiesRules", func(t *testing.T) {
		r := rules(contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionAutoApprove})
		p, err := approval.NewPolicy(r, approval.Defaults{})
		require.NoError(t, err)
		r.Rules[0].Decision = contracts.RuleDecisionDeny
		require.Equal(t, ledger.ActionApproved, p.Evaluate("acme", cardsWrite).Gate)
	})
}

// TestRulesDigest: the digest covers the rules in force, defaults
// included, in one canonical form: the same rules and defaults agree
// whatever the file's key order or spacing, and a changed rule, rule order
// or default changes it.
func TestRulesDigest(t *testing.T) {
	digest := func(t *testing.T, r *contracts.Rules, d approval.Defaults) ledger.Digest {
		t.Helper()
		p, err := approval.NewPolicy(r, d)
		require.NoError(t, err)
		return p.RulesDigest()
	}
	parse := func(t *testing.T, doc string) *contracts.Rules {
		t.Helper()
		r, err := contracts.ParseRules([]byte(doc))
		require.NoError(t, err)
		return r
	}
	file := validRules(t)

	t.Run("OK the document it covers", func(t *testing.T) {
		defaults := `"defaults":{"approval_ttl_ms":86400000,"effects":{"read":"auto_approve","write":"require_approval"},"execute_within_ms":900000,"unknown_effect":"require_approval"}`
		want, err := ledger.DigestJSON([]byte(`{` + defaults + `,"rules":[]}`))
		require.NoError(t, err)
		require.Equal(t, want, digest(t, nil, approval.Defaults{}))
		want, err = ledger.DigestJSON([]byte(`{` + defaults + `,"rules":[
			{"tool":"cards.write","tenant":"acme","decision":"require_approval","approval_ttl_ms":3600000},
			{"tool":"payments.refund","decision":"deny"},
			{"tool":"*","effect":"read","decision":"auto_approve"},
			{"tool":"*","tenant":"*","effect":"write","decision":"require_approval"}]}`))
		require.NoError(t, err)
		require.Equal(t, want, digest(t, file, approval.Defaults{}))
	})
	t.Run("OK stable across key order and spacing of the file", func(t *testing.T) {
		reordered := parse(t, `{"rules": [
			{"approval_ttl_ms": 3600000, "decision": "require_approval", "tenant": "acme", "tool": "cards.write"},
			{"decision":"deny","tool":"payments.refund"},
			{"decision": "auto_approve", "effect": "read", "tool": "*"},
			{"allow_self_approval": false, "decision": "require_approval", "effect": "write", "tenant": "*", "tool": "*"}
		], "schema_version": "1.3"}`)
		require.Equal(t, digest(t, file, approval.Defaults{}), digest(t, reordered, approval.Defaults{}))
	})
	t.Run("OK no rules and an empty list agree, as do the default TTL unset and given", func(t *testing.T) {
		require.Equal(t, digest(t, nil, approval.Defaults{}), digest(t, rules(), approval.Defaults{}))
		require.Equal(t, digest(t, file, approval.Defaults{}), digest(t, file, approval.Defaults{ApprovalTTL: approval.DefaultApprovalTTL}))
	})
	t.Run("OK every decision of a policy carries it", func(t *testing.T) {
		p, err := approval.NewPolicy(file, approval.Defaults{})
		require.NoError(t, err)
		for _, tool := range []contracts.ToolDescriptor{cardsWrite, refund, docsSearch, noEffect} {
			require.Equal(t, p.RulesDigest(), p.Evaluate("acme", tool).RulesDigest, tool.Name)
		}
	})
	t.Run("OK a changed rule, order or default changes it", func(t *testing.T) {
		base := digest(t, file, approval.Defaults{})
		seen := map[ledger.Digest]string{base: "the file"}
		changed := func(name string, d ledger.Digest) {
			t.Helper()
			require.NotContains(t, seen, d, "%s has the digest of %s", name, seen[d])
			seen[d] = name
		}
		edit := func(f func(r []contracts.Rule)) *contracts.Rules {
			r := rules(slices.Clone(file.Rules)...)
			f(r.Rules)
			return r
		}
		changed("a decision", digest(t, edit(func(r []contracts.Rule) { r[1].Decision = contracts.RuleDecisionAutoApprove }), approval.Defaults{}))
		changed("a rule's TTL", digest(t, edit(func(r []contracts.Rule) { r[0].ApprovalTTLMS = 60000 }), approval.Defaults{}))
		changed("a tenant", digest(t, edit(func(r []contracts.Rule) { r[0].Tenant = "globex" }), approval.Defaults{}))
		changed("self-approval", digest(t, edit(func(r []contracts.Rule) { r[3].AllowSelfApproval = true }), approval.Defaults{}))
		changed("the order", digest(t, edit(func(r []contracts.Rule) { r[0], r[1] = r[1], r[0] }), approval.Defaults{}))
		changed("a rule fewer", digest(t, rules(file.Rules[:3]...), approval.Defaults{}))
		changed("the default TTL", digest(t, file, approval.Defaults{ApprovalTTL: time.Hour}))
		changed("a rule's execute within", digest(t, edit(func(r []contracts.Rule) { r[0].ExecuteWithinMS = 60000 }), approval.Defaults{}))
		changed("the default execute within", digest(t, file, approval.Defaults{ExecuteWithin: time.Hour}))
		changed("no rules", digest(t, nil, approval.Defaults{}))
	})
}
