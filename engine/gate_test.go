package engine_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// gateEventData is the data of the event that moved action out of
// proposed.
func gateEventData(t *testing.T, s ledger.Store, run ledger.RunID, action ledger.ActionID) (ledger.ActionState, string) {
	t.Helper()
	events, err := s.FindEvents(context.Background(), run)
	require.NoError(t, err)
	for _, e := range events {
		if e.EntityID == string(action) && e.FromState == string(ledger.ActionProposed) {
			return ledger.ActionState(e.ToState), string(e.Data)
		}
	}
	t.Fatalf("no gate event of action %s", action)
	return "", ""
}

// TestGateAuditRecorded: the engine records, with each action it gates,
// the rule that decided and the digest of the rules in force, on the
// action and in the gate's event, so an auto-approved write says why it
// ran without a person.
func TestGateAuditRecorded(t *testing.T) {
	ctx := context.Background()
	t.Run("OK auto-approved write", func(t *testing.T) {
		policy, err := approval.NewPolicy(&contracts.Rules{SchemaVersion: contracts.CurrentVersion, Rules: []contracts.Rule{
			{Tool: "mail.send", Decision: contracts.RuleDecisionDeny},
			{Tool: "cards.write", Decision: contracts.RuleDecisionAutoApprove},
		}}, approval.Defaults{})
		require.NoError(t, err)
		b := setupWith(t, simulator.Config{}, func(c *engine.Config) {
			c.Approvals = approval.NewService(c.Store, policy, nil, approval.Options{})
		})
		run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
		require.Equal(t, ledger.RunCompleted, run.State)
		require.Equal(t, 1, b.effectCount(t), "the write ran without a person")
		actions, err := b.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Len(t, actions, 1)
		a := actions[0]
		require.Equal(t, &ledger.ActionGate{Decision: ledger.ActionApproved, Rule: 1, Reason: "rule 1: cards.write is auto-approved",
			RulesDigest: policy.RulesDigest()}, a.Gate)
		to, data := gateEventData(t, b.Store, run.ID, a.ID)
		require.Equal(t, ledger.ActionApproved, to)
		want, err := json.Marshal(map[string]any{"gate": map[string]any{"rule": 1, "reason": "rule 1: cards.write is auto-approved",
			"rules_digest": policy.RulesDigest()}})
		require.NoError(t, err)
		require.JSONEq(t, string(want), data)
		b.chainOK(t, run.ID)
	})
	t.Run("OK the default sends a write to a person", func(t *testing.T) {
		b := setup(t, simulator.Config{})
		run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
		a := b.pendingAction(t, run.ID)
		defaults, err := approval.NewPolicy(nil, approval.Defaults{})
		require.NoError(t, err)
		require.Equal(t, &ledger.ActionGate{Decision: ledger.ActionAwaitingApproval, Rule: -1,
			Reason: "default: write actions require approval", RulesDigest: defaults.RulesDigest()}, a.Gate)
		to, data := gateEventData(t, b.Store, run.ID, a.ID)
		require.Equal(t, ledger.ActionAwaitingApproval, to)
		require.JSONEq(t, `{"gate":{"rule":null,"reason":"default: write actions require approval","rules_digest":"`+
			string(defaults.RulesDigest())+`"}}`, data)
	})
}
