package approval_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

// testBundle is a fresh store, service and one pending cards.write action
// of a run alice submitted in tenant acme.
type testBundle struct {
	*ledgertest.Bundle
	svc    *approval.Service
	run    *ledger.Run
	action *ledger.Action
	apr    *ledger.Approval
}

type setupOpts struct {
	rules *contracts.Rules
	opts  approval.Options
	tools approval.ToolLookupFunc
}

func setup(t *testing.T, o setupOpts) *testBundle {
	t.Helper()
	b := ledgertest.OpenStore(t)
	policy, err := approval.NewPolicy(o.rules, approval.Defaults{})
	require.NoError(t, err)
	if o.tools == nil {
		o.tools = lookup(t)
	}
	run := b.RunningRun(t, "run-1", ledger.BudgetLimits{})
	res := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval)
	require.NotNil(t, res.Approval)
	run, err = b.Store.FindRunByID(context.Background(), run.ID)
	require.NoError(t, err)
	return &testBundle{Bundle: b, svc: approval.NewService(b.Store, policy, o.tools, o.opts),
		run: run, action: res.Action, apr: res.Approval}
}

// lookup knows cards.write, read from the contracts' test data.
func lookup(t *testing.T) approval.ToolLookupFunc {
	t.Helper()
	data, err := os.ReadFile("../contracts/testdata/tool_descriptor.cards_write.json")
	require.NoError(t, err)
	d, err := contracts.ParseToolDescriptor(data)
	require.NoError(t, err)
	return func(name string) (contracts.ToolDescriptor, bool) {
		if name == d.Name {
			return *d, true
		}
		return contracts.ToolDescriptor{}, false
	}
}

func (tb *testBundle) params(principal string, decision ledger.ApprovalDecision) approval.DecideParams {
	return approval.DecideParams{Tenant: "acme", Principal: principal, ActionID: tb.action.ID,
		ActionDigest: tb.action.ActionDigest, Decision: decision, Reason: "looks right"}
}

// requireUnchanged checks that the action still awaits approval, its
// approval is still pending, and the run's event chain did not grow.
func (tb *testBundle) requireUnchanged(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	a, err := tb.Store.FindActionByID(ctx, tb.action.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.ActionAwaitingApproval, a.State)
	apr := tb.approvalOf(t, tb.action.ID)
	require.Equal(t, ledger.ApprovalPending, apr.State)
	require.Empty(t, apr.DecidedBy)
	run, err := tb.Store.FindRunByID(ctx, tb.run.ID)
	require.NoError(t, err)
	require.Equal(t, tb.run.EventSeq, run.EventSeq)
}

func (tb *testBundle) approvalOf(t *testing.T, id ledger.ActionID) *ledger.Approval {
	t.Helper()
	aprs, err := tb.Store.FindApprovals(context.Background(), ledger.ApprovalFilter{ActionID: &id})
	require.NoError(t, err)
	require.Len(t, aprs, 1)
	return aprs[0]
}

// otherTenantAction records a pending cards.write action in a run carol
// submitted in tenant globex.
func (tb *testBundle) otherTenantAction(t *testing.T) *ledger.Action {
	t.Helper()
	ctx := context.Background()
	sub, err := tb.Store.SubmitRun(ctx, ledger.SubmitRunParams{
		Tenant: "globex", IdempotencyKey: "globex-1", Principal: "carol", Agent: "practice-cards",
		Input: json.RawMessage(`{"title":"t","markdown":"# a"}`),
	})
	require.NoError(t, err)
	_, err = tb.Store.TransitionRun(ctx, ledger.RunTransition{ID: sub.Run.ID, From: ledger.RunQueued,
		To: ledger.RunRunning, Actor: "worker"})
	require.NoError(t, err)
	return tb.Action(t, sub.Run.ID, "step-1", ledger.ActionAwaitingApproval).Action
}

var selfApprovalRules = rules(contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionRequireApproval,
	AllowSelfApproval: true})

func TestServiceDecide(t *testing.T) {
	ctx := context.Background()

	t.Run("OK grant by another principal", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		res, err := tb.svc.Decide(ctx, tb.params("bob", ledger.DecisionGrant))
		require.NoError(t, err)
		require.Equal(t, ledger.ActionApproved, res.Action.State)
		require.Equal(t, ledger.ApprovalGranted, res.Approval.State)
		require.Equal(t, "bob", res.Approval.DecidedBy)
		require.Equal(t, "looks right", res.Approval.Reason)
		require.Equal(t, tb.Clock.Now(), *res.Approval.DecidedAt)
		require.Equal(t, tb.Clock.Now().Add(approval.DefaultExecuteWithin), *res.Approval.ExecuteBy, "the default execute_by")

		a, err := tb.Store.FindActionByID(ctx, tb.action.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionApproved, a.State)
		apr := tb.approvalOf(t, tb.action.ID)
		require.Equal(t, ledger.ApprovalGranted, apr.State)
		require.Equal(t, "bob", apr.DecidedBy)
	})

	t.Run("OK grant with the rule's execute within", func(t *testing.T) {
		tb := setup(t, setupOpts{rules: rules(contracts.Rule{Tool: "cards.write", Decision: contracts.RuleDecisionRequireApproval,
			ExecuteWithinMS: 90_000})})
		res, err := tb.svc.Decide(ctx, tb.params("bob", ledger.DecisionGrant))
		require.NoError(t, err)
		require.Equal(t, tb.Clock.Now().Add(90*time.Second), *res.Approval.ExecuteBy)
	})

	t.Run("OK deny by another principal", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		res, err := tb.svc.Decide(ctx, tb.params("bob", ledger.DecisionDeny))
		require.NoError(t, err)
		require.Equal(t, ledger.ActionDenied, res.Action.State)
		require.Equal(t, ledger.ApprovalDenied, res.Approval.State)
		require.Equal(t, "bob", res.Approval.DecidedBy)
		require.Nil(t, res.Approval.ExecuteBy, "only a grant has an execute_by")
	})

	t.Run("ErrForbidden self approval", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		_, err := tb.svc.Decide(ctx, tb.params("alice", ledger.DecisionGrant))
		require.Equal(t, ledger.CodeForbidden, ledger.Code(err))
		require.ErrorIs(t, err, ledger.ErrForbidden)
		require.EqualError(t, err, "principal alice submitted run "+string(tb.run.ID)+" and cannot approve its actions")
		tb.requireUnchanged(t)
	})

	t.Run("OK self approval allowed by rule", func(t *testing.T) {
		tb := setup(t, setupOpts{rules: selfApprovalRules})
		res, err := tb.svc.Decide(ctx, tb.params("alice", ledger.DecisionGrant))
		require.NoError(t, err)
		require.Equal(t, ledger.ApprovalGranted, res.Approval.State)
		require.Equal(t, "alice", res.Approval.DecidedBy)
		require.Equal(t, ledger.ActionApproved, res.Action.State)
	})

	t.Run("ErrForbidden self approval rule for unknown tool", func(t *testing.T) {
		none := func(string) (contracts.ToolDescriptor, bool) { return contracts.ToolDescriptor{}, false }
		tb := setup(t, setupOpts{rules: selfApprovalRules, tools: none})
		_, err := tb.svc.Decide(ctx, tb.params("alice", ledger.DecisionGrant))
		require.Equal(t, ledger.CodeForbidden, ledger.Code(err))
		tb.requireUnchanged(t)
	})

	t.Run("ErrForbidden self approval rule for another tenant", func(t *testing.T) {
		tb := setup(t, setupOpts{rules: rules(
			contracts.Rule{Tool: "cards.write", Tenant: "globex", Decision: contracts.RuleDecisionRequireApproval,
				AllowSelfApproval: true},
		)})
		_, err := tb.svc.Decide(ctx, tb.params("alice", ledger.DecisionGrant))
		require.Equal(t, ledger.CodeForbidden, ledger.Code(err))
		tb.requireUnchanged(t)
	})

	t.Run("OK self approval in relaxed mode", func(t *testing.T) {
		tb := setup(t, setupOpts{opts: approval.Options{RelaxSeparationOfDuties: true}})
		res, err := tb.svc.Decide(ctx, tb.params("alice", ledger.DecisionGrant))
		require.NoError(t, err)
		require.Equal(t, ledger.ApprovalGranted, res.Approval.State)
		require.Equal(t, "alice", res.Approval.DecidedBy)
	})

	t.Run("OK self deny", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		res, err := tb.svc.Decide(ctx, tb.params("alice", ledger.DecisionDeny))
		require.NoError(t, err)
		require.Equal(t, ledger.ApprovalDenied, res.Approval.State)
		require.Equal(t, "alice", res.Approval.DecidedBy)
		require.Equal(t, ledger.ActionDenied, res.Action.State)
	})

	t.Run("ErrNotFound other tenant", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		other := tb.otherTenantAction(t)
		otherRun, err := tb.Store.FindRunByID(ctx, other.RunID)
		require.NoError(t, err)

		for _, d := range []ledger.ApprovalDecision{ledger.DecisionGrant, ledger.DecisionDeny} {
			_, err := tb.svc.Decide(ctx, approval.DecideParams{Tenant: "acme", Principal: "bob", ActionID: other.ID,
				ActionDigest: other.ActionDigest, Decision: d})
			require.Equal(t, ledger.CodeNotFound, ledger.Code(err))
			require.EqualError(t, err, "action "+string(other.ID)+" not found")
		}

		a, err := tb.Store.FindActionByID(ctx, other.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionAwaitingApproval, a.State)
		require.Equal(t, ledger.ApprovalPending, tb.approvalOf(t, other.ID).State)
		after, err := tb.Store.FindRunByID(ctx, other.RunID)
		require.NoError(t, err)
		require.Equal(t, otherRun.EventSeq, after.EventSeq)
	})

	t.Run("ErrNotFound unknown action", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		id := ledger.ActionID("act_00000000000000000000009999")
		p := tb.params("bob", ledger.DecisionGrant)
		p.ActionID = id
		_, err := tb.svc.Decide(ctx, p)
		require.Equal(t, ledger.CodeNotFound, ledger.Code(err))
		require.EqualError(t, err, "action "+string(id)+" not found")
		tb.requireUnchanged(t)
	})

	t.Run("ErrConflict stale digest", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		p := tb.params("bob", ledger.DecisionGrant)
		p.ActionDigest = ledger.Digest("sha256:" + strings.Repeat("0", 64))
		_, err := tb.svc.Decide(ctx, p)
		require.Equal(t, ledger.CodeConflict, ledger.Code(err))
		require.ErrorContains(t, err, "digest mismatch")
		tb.requireUnchanged(t)
	})

	t.Run("ErrConflict expired", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		expired, err := tb.svc.ExpireDue(ctx)
		require.NoError(t, err)
		require.Empty(t, expired)

		tb.Clock.Advance(time.Hour + time.Minute) // the fixture's TTL is one hour
		_, err = tb.svc.Decide(ctx, tb.params("bob", ledger.DecisionGrant))
		require.Equal(t, ledger.CodeConflict, ledger.Code(err))
		require.ErrorContains(t, err, "expired")
		tb.requireUnchanged(t)

		expired, err = tb.svc.ExpireDue(ctx)
		require.NoError(t, err)
		require.Len(t, expired, 1)
		require.Equal(t, tb.apr.ID, expired[0].ID)
		require.Equal(t, ledger.ApprovalExpired, expired[0].State)
		a, err := tb.Store.FindActionByID(ctx, tb.action.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ActionExpired, a.State)

		expired, err = tb.svc.ExpireDue(ctx)
		require.NoError(t, err)
		require.Empty(t, expired)
		_, err = tb.svc.Decide(ctx, tb.params("bob", ledger.DecisionGrant))
		require.Equal(t, ledger.CodeConflict, ledger.Code(err))
	})

	t.Run("ErrConflict invalidated by a superseding action", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		res, err := tb.Store.CreateAction(ctx, ledger.CreateActionParams{
			RunID: tb.run.ID, IdempotencyKey: "step-2", Tool: "cards.write", ToolVersion: "1", Effect: ledger.EffectWrite,
			Arguments: json.RawMessage(`{"cards":[{"front":"q2","back":"a2"}]}`), Supersedes: tb.action.ID,
			Gate: ledger.ActionAwaitingApproval, ApprovalTTL: time.Hour, Actor: "engine",
		})
		require.NoError(t, err)
		require.NotEqual(t, tb.action.ActionDigest, res.Action.ActionDigest)
		require.Equal(t, ledger.ApprovalInvalidated, tb.approvalOf(t, tb.action.ID).State)
		run, err := tb.Store.FindRunByID(ctx, tb.run.ID)
		require.NoError(t, err)

		_, err = tb.svc.Decide(ctx, tb.params("bob", ledger.DecisionGrant))
		require.Equal(t, ledger.CodeConflict, ledger.Code(err))

		// The old digest does not approve the new action either.
		p := tb.params("bob", ledger.DecisionGrant)
		p.ActionID = res.Action.ID
		_, err = tb.svc.Decide(ctx, p)
		require.Equal(t, ledger.CodeConflict, ledger.Code(err))

		require.Equal(t, ledger.ApprovalPending, tb.approvalOf(t, res.Action.ID).State)
		after, err := tb.Store.FindRunByID(ctx, tb.run.ID)
		require.NoError(t, err)
		require.Equal(t, run.EventSeq, after.EventSeq)
	})

	t.Run("ErrConflict already decided", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		_, err := tb.svc.Decide(ctx, tb.params("bob", ledger.DecisionGrant))
		require.NoError(t, err)
		_, err = tb.svc.Decide(ctx, tb.params("carol", ledger.DecisionDeny))
		require.Equal(t, ledger.CodeConflict, ledger.Code(err))
		require.Equal(t, "bob", tb.approvalOf(t, tb.action.ID).DecidedBy)
	})

	t.Run("ErrInvalid", func(t *testing.T) {
		tests := []struct {
			name   string
			modify func(*approval.DecideParams)
			msg    string
		}{
			{"no tenant", func(p *approval.DecideParams) { p.Tenant = "" }, "tenant is required"},
			{"no principal", func(p *approval.DecideParams) { p.Principal = "" }, "principal is required"},
			{"unknown decision", func(p *approval.DecideParams) { p.Decision = "maybe" }, `not "maybe"`},
			{"malformed digest", func(p *approval.DecideParams) { p.ActionDigest = "sha256:abc" }, "action digest"},
			{"reason too long", func(p *approval.DecideParams) { p.Reason = strings.Repeat("x", approval.MaxReasonLength+1) },
				"reason is longer than 1000 characters"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				tb := setup(t, setupOpts{})
				p := tb.params("bob", ledger.DecisionGrant)
				tt.modify(&p)
				_, err := tb.svc.Decide(ctx, p)
				require.Equal(t, ledger.CodeInvalid, ledger.Code(err))
				require.ErrorContains(t, err, tt.msg)
				tb.requireUnchanged(t)
			})
		}
	})

	t.Run("OK reason of 1000 characters", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		p := tb.params("bob", ledger.DecisionGrant)
		p.Reason = strings.Repeat("é", approval.MaxReasonLength) // 2000 bytes, 1000 characters
		res, err := tb.svc.Decide(ctx, p)
		require.NoError(t, err)
		require.Equal(t, p.Reason, res.Approval.Reason)
	})

	t.Run("OK one of concurrent grants", func(t *testing.T) {
		tb := setup(t, setupOpts{})
		const n = 10
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				_, errs[i] = tb.svc.Decide(ctx, tb.params("bob", ledger.DecisionGrant))
			})
		}
		close(start)
		wg.Wait()

		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
				continue
			}
			require.Equal(t, ledger.CodeConflict, ledger.Code(err), "error: %v", err)
		}
		require.Equal(t, 1, ok)
		require.Equal(t, ledger.ApprovalGranted, tb.approvalOf(t, tb.action.ID).State)

		events, err := tb.Store.FindEvents(ctx, tb.run.ID)
		require.NoError(t, err)
		granted := 0
		for _, e := range events {
			if e.EntityType == "approval" && e.ToState == string(ledger.ApprovalGranted) {
				granted++
			}
		}
		require.Equal(t, 1, granted)
	})
}

func TestServicePending(t *testing.T) {
	ctx := context.Background()
	tb := setup(t, setupOpts{})

	run2 := tb.RunningRun(t, "run-2", ledger.BudgetLimits{})
	second := tb.Action(t, run2.ID, "step-1", ledger.ActionAwaitingApproval)
	run3 := tb.RunningRun(t, "run-3", ledger.BudgetLimits{})
	decided := tb.Action(t, run3.ID, "step-1", ledger.ActionAwaitingApproval).Action
	_, err := tb.svc.Decide(ctx, approval.DecideParams{Tenant: "acme", Principal: "bob", ActionID: decided.ID,
		ActionDigest: decided.ActionDigest, Decision: ledger.DecisionGrant})
	require.NoError(t, err)
	other := tb.otherTenantAction(t)

	t.Run("OK", func(t *testing.T) {
		got, err := tb.svc.Pending(ctx, "acme", 0)
		require.NoError(t, err)
		require.Len(t, got, 2)
		require.Equal(t, tb.apr.ID, got[0].ID)
		require.Equal(t, second.Approval.ID, got[1].ID)
		for _, a := range got {
			require.Equal(t, "acme", a.Tenant)
			require.Equal(t, ledger.ApprovalPending, a.State)
		}
	})

	t.Run("OK other tenant", func(t *testing.T) {
		got, err := tb.svc.Pending(ctx, "globex", 0)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, other.ID, got[0].ActionID)
	})

	t.Run("OK limit", func(t *testing.T) {
		got, err := tb.svc.Pending(ctx, "acme", 1)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, tb.apr.ID, got[0].ID)
	})

	t.Run("OK none", func(t *testing.T) {
		got, err := tb.svc.Pending(ctx, "initech", 0)
		require.NoError(t, err)
		require.Empty(t, got)
	})

	t.Run("ErrInvalid", func(t *testing.T) {
		_, err := tb.svc.Pending(ctx, "", 0)
		require.Equal(t, ledger.CodeInvalid, ledger.Code(err))
		_, err = tb.svc.Pending(ctx, "acme", -1)
		require.Equal(t, ledger.CodeInvalid, ledger.Code(err))
	})
}

func TestServiceGate(t *testing.T) {
	policy, err := approval.NewPolicy(validRules(t), approval.Defaults{})
	require.NoError(t, err)
	b := ledgertest.OpenStore(t)
	svc := approval.NewService(b.Store, policy, nil, approval.Options{})
	require.Equal(t, policy.Evaluate("acme", cardsWrite), svc.Gate("acme", cardsWrite))
	require.Equal(t, policy.RulesDigest(), svc.RulesDigest())
	require.Equal(t, ledger.ActionDenied, svc.Gate("acme", refund).Gate)

	t.Run("OK nil policy means defaults", func(t *testing.T) {
		svc := approval.NewService(b.Store, nil, nil, approval.Options{})
		defaults, err := approval.NewPolicy(nil, approval.Defaults{})
		require.NoError(t, err)
		require.Equal(t, defaults.RulesDigest(), svc.RulesDigest())
		require.Equal(t, approval.Decision{Gate: ledger.ActionAwaitingApproval, ApprovalTTL: approval.DefaultApprovalTTL,
			ExecuteWithin: approval.DefaultExecuteWithin, Rule: -1, Reason: "default: write actions require approval", RulesDigest: defaults.RulesDigest()}, svc.Gate("acme", cardsWrite))
		require.Equal(t, ledger.ActionApproved, svc.Gate("acme", docsSearch).Gate)
	})
}

// TestServiceStoreRules: the rule set in force is stored under the digest
// every decision carries, once, and reads back as the rules and defaults
// that decided.
func TestServiceStoreRules(t *testing.T) {
	ctx := context.Background()
	store := ledgertest.OpenStore(t).Store
	rules, err := contracts.ParseRules([]byte(`{"schema_version":"1.0","rules":[
		{"tool":"cards.write","tenant":"acme","decision":"auto_approve"}]}`))
	require.NoError(t, err)
	policy, err := approval.NewPolicy(rules, approval.Defaults{ApprovalTTL: time.Hour})
	require.NoError(t, err)
	svc := approval.NewService(store, policy, nil, approval.Options{})

	first, err := svc.StoreRules(ctx)
	require.NoError(t, err)
	require.True(t, first.Created)
	require.Equal(t, policy.RulesDigest(), first.RuleSet.Digest)
	require.Equal(t, policy.RulesDigest(), svc.Gate("acme", contracts.ToolDescriptor{Name: "cards.write",
		Effect: contracts.EffectWrite}).RulesDigest)
	require.JSONEq(t, `{"rules":[{"tool":"cards.write","tenant":"acme","decision":"auto_approve"}],
		"defaults":{"approval_ttl_ms":3600000,"effects":{"read":"auto_approve","write":"require_approval"},
		"execute_within_ms":900000,"unknown_effect":"require_approval"}}`, string(first.RuleSet.Document))

	again, err := svc.StoreRules(ctx)
	require.NoError(t, err)
	require.False(t, again.Created, "a restart with the same rules stores nothing new")
	require.Equal(t, first.RuleSet, again.RuleSet)
}
