package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// TestActionGate: an action shows what the gate decided and why, with the
// rule absent when the default decided and the gate absent for an action
// recorded without an audit (as before the gate was audited).
func TestActionGate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx := context.Background()
	// rawGate is the action's "gate" as the answer holds it; nil if absent.
	rawGate := func(t *testing.T, body []byte) map[string]any {
		t.Helper()
		var v map[string]any
		require.NoError(t, json.Unmarshal(body, &v))
		g, _ := v["gate"].(map[string]any)
		return g
	}
	record := func(t *testing.T, key string, audit ledger.GateAudit) *ledger.Action {
		t.Helper()
		run := e.RunningRun(t, key, ledger.BudgetLimits{})
		res, err := e.Store.CreateAction(ctx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: "step-1",
			Tool: simulator.CardsWriteTool, ToolVersion: "1", Effect: ledger.EffectWrite,
			Arguments: json.RawMessage(`{"title":"t","cards":[]}`), Gate: ledger.ActionApproved, GateAudit: audit, Actor: "engine"})
		require.NoError(t, err)
		return res.Action
	}

	t.Run("OK the default decided", func(t *testing.T) {
		id, a := e.awaiting(t, "alice", "k1")
		res := e.get(t, "carol", "/v1/actions/"+string(a.ID))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var v server.Action
		decode(t, res, &v)
		want := &server.ActionGate{Decision: ledger.ActionAwaitingApproval, Reason: "default: write actions require approval",
			RulesDigest: e.approvals.RulesDigest()}
		require.Equal(t, want, v.Gate)
		require.NotContains(t, rawGate(t, res.Body), "rule", "no rule decided")

		var r server.Run
		decode(t, e.get(t, "carol", "/v1/runs/"+string(id)), &r)
		require.Equal(t, want, r.Actions[0].Gate)
	})
	t.Run("OK a rule decided", func(t *testing.T) {
		digest := ledger.Digest("sha256:" + strings.Repeat("ab", 32))
		a := record(t, "k2", ledger.GateAudit{Rule: 0, Reason: "rule 0: cards.write is auto-approved", RulesDigest: digest})
		res := e.get(t, "carol", "/v1/actions/"+string(a.ID))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var v server.Action
		decode(t, res, &v)
		rule := 0
		require.Equal(t, &server.ActionGate{Decision: ledger.ActionApproved, Rule: &rule, Reason: "rule 0: cards.write is auto-approved",
			RulesDigest: digest}, v.Gate)
		require.Equal(t, float64(0), rawGate(t, res.Body)["rule"])
	})
	t.Run("OK recorded before the gate was audited", func(t *testing.T) {
		a := record(t, "k3", ledger.GateAudit{})
		res := e.get(t, "carol", "/v1/actions/"+string(a.ID))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		require.Nil(t, rawGate(t, res.Body))
		require.NotContains(t, string(res.Body), `"gate"`)
	})
}
