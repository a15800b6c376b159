package evidence_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// TestReportShowsGate: a report shows, for each action, what the gate
// decided and why, in JSON, Markdown and HTML; null for an action recorded
// without an audit, as before the gate was audited.
func TestReportShowsGate(t *testing.T) {
	ctx := context.Background()
	f := openFixture(t)
	id := goldenRun(t, f)
	rep, err := evidence.Build(ctx, f.store, id, f.options(t))
	require.NoError(t, err)
	rule := int64(0)
	require.Equal(t, &ledger.GateContent{Decision: ledger.ActionAwaitingApproval, Reason: "default: write actions require approval",
		RulesDigest: goldenRulesDigest}, rep.Actions[0].Gate)
	require.Equal(t, &ledger.GateContent{Decision: ledger.ActionApproved, Rule: &rule, Reason: "rule 0: cards.write is auto-approved",
		RulesDigest: goldenRulesDigest}, rep.Actions[1].Gate)

	var doc struct {
		Actions []struct {
			Gate json.RawMessage `json:"gate"`
		} `json:"actions"`
	}
	require.NoError(t, json.Unmarshal(render(t, rep, "json"), &doc))
	require.JSONEq(t, `{"decision":"awaiting_approval","rule":null,"reason":"default: write actions require approval","rules_digest":"`+
		string(goldenRulesDigest)+`"}`, string(doc.Actions[0].Gate))
	require.Contains(t, string(render(t, rep, "md")), "| Gate | approved by rule 0: cards.write is auto-approved |")
	require.Contains(t, string(render(t, rep, "html")), "<tr><th>Gate</th><td>approved by rule 0: cards.write is auto-approved</td></tr>")

	t.Run("OK not recorded", func(t *testing.T) {
		f := openFixture(t)
		run, err := f.store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k", Principal: "alice",
			Agent: "practice-cards", Input: json.RawMessage(`{}`)})
		require.NoError(t, err)
		_, err = f.store.TransitionRun(ctx, ledger.RunTransition{ID: run.Run.ID, From: ledger.RunQueued, To: ledger.RunRunning})
		require.NoError(t, err)
		_, err = f.store.CreateAction(ctx, ledger.CreateActionParams{RunID: run.Run.ID, IdempotencyKey: "step-1", Tool: "cards.write",
			ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{}`), Gate: ledger.ActionApproved})
		require.NoError(t, err)
		rep, err := evidence.Build(ctx, f.store, run.Run.ID, f.options(t))
		require.NoError(t, err)
		require.Nil(t, rep.Actions[0].Gate)
		out := render(t, rep, "json")
		require.Contains(t, string(out), `"gate": null`)
		require.Contains(t, string(render(t, rep, "md")), "| Gate | not recorded: the action was recorded before the gate was audited |")
		read, err := evidence.ReadReport(out)
		require.NoError(t, err)
		_, err = read.Verify(nil)
		require.NoError(t, err)
	})
}
