package storetest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// testRulesDigest stands for the digest of some rule set in force.
var testRulesDigest = ledger.Digest("sha256:" + strings.Repeat("0123456789abcdef", 4))

// gateEvent is the event of run that moved action from proposed to the
// gate's state.
func gateEvent(t *testing.T, s ledger.Store, run ledger.RunID, action ledger.ActionID) *ledger.Event {
	t.Helper()
	events, err := s.FindEvents(context.Background(), run)
	require.NoError(t, err)
	for _, e := range events {
		if e.EntityType == "action" && e.EntityID == string(action) && e.FromState == string(ledger.ActionProposed) {
			return e
		}
	}
	t.Fatalf("no gate event of action %s", action)
	return nil
}

// testCreateActionGateAudit: the gate's audit is recorded on the action
// and in the gate's event, whichever state the gate chose, and the chain
// binds it.
func testCreateActionGateAudit(t *testing.T, h Harness) {
	ctx := context.Background()
	params := func(run ledger.RunID, key string, gate ledger.ActionState, audit ledger.GateAudit) ledger.CreateActionParams {
		return ledger.CreateActionParams{RunID: run, IdempotencyKey: key, Tool: "cards.write", ToolVersion: "1",
			Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"cards":[]}`), Gate: gate, ApprovalTTL: time.Hour,
			GateAudit: audit, Actor: "engine"}
	}
	cases := []struct {
		name  string
		gate  ledger.ActionState
		audit ledger.GateAudit
		start bool
		data  string
	}{
		{"OK auto-approved write, attempt started", ledger.ActionApproved,
			ledger.GateAudit{Rule: 2, Reason: "rule 2: cards.write is auto-approved", RulesDigest: testRulesDigest}, true,
			`{"gate":{"reason":"rule 2: cards.write is auto-approved","rule":2,"rules_digest":"` + string(testRulesDigest) + `"}}`},
		{"OK awaiting approval by the default", ledger.ActionAwaitingApproval,
			ledger.GateAudit{Rule: -1, Reason: "default: write actions require approval", RulesDigest: testRulesDigest}, false,
			`{"gate":{"reason":"default: write actions require approval","rule":null,"rules_digest":"` + string(testRulesDigest) + `"}}`},
		{"OK denied by rule 0", ledger.ActionDenied,
			ledger.GateAudit{Rule: 0, Reason: "rule 0: cards.write is denied", RulesDigest: testRulesDigest}, false,
			`{"gate":{"reason":"rule 0: cards.write is denied","rule":0,"rules_digest":"` + string(testRulesDigest) + `"}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := openStore(t, h)
			run := b.RunningRun(t, "k", ledger.BudgetLimits{})
			p := params(run.ID, "step-1", tc.gate, tc.audit)
			p.StartAttempt = tc.start
			res, err := b.Store.CreateAction(ctx, p)
			require.NoError(t, err)
			if tc.start {
				require.NotNil(t, res.Attempt)
			}
			want := &ledger.ActionGate{Decision: tc.gate, Rule: tc.audit.Rule, Reason: tc.audit.Reason, RulesDigest: testRulesDigest}
			require.Equal(t, want, res.Action.Gate)

			// The row, by every read.
			a, err := b.Store.FindActionByID(ctx, res.Action.ID)
			require.NoError(t, err)
			require.Equal(t, want, a.Gate)
			list, err := b.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
			require.NoError(t, err)
			require.Equal(t, want, list[0].Gate)
			chain, err := b.Store.FindChain(ctx, run.ID)
			require.NoError(t, err)
			require.Equal(t, want, chain.Actions[0].Gate)
			require.True(t, chain.Report.OK, chain.Report.Reason)

			// The gate's event.
			e := gateEvent(t, b.Store, run.ID, res.Action.ID)
			require.Equal(t, string(tc.gate), e.ToState)
			require.JSONEq(t, tc.data, string(e.Data))

			// A replayed step answers with the gate as recorded.
			again, err := b.Store.CreateAction(ctx, params(run.ID, "step-1", tc.gate, tc.audit))
			require.NoError(t, err)
			require.True(t, again.Duplicate)
			require.Equal(t, want, again.Action.Gate)
		})
	}

	t.Run("OK without an audit nothing is recorded", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		res := b.Action(t, run.ID, "step-1", ledger.ActionApproved)
		require.Nil(t, res.Action.Gate)
		require.Empty(t, gateEvent(t, b.Store, run.ID, res.Action.ID).Data)
	})

	t.Run("ErrInvalid", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		ok := ledger.GateAudit{Rule: 1, Reason: "rule 1: cards.write is auto-approved", RulesDigest: testRulesDigest}
		edit := func(f func(a *ledger.GateAudit)) ledger.GateAudit {
			a := ok
			f(&a)
			return a
		}
		for _, tc := range []struct {
			name  string
			gate  ledger.ActionState
			audit ledger.GateAudit
			msg   string
		}{
			{"audit without a gate", "", ok, "a gate audit needs a gate"},
			{"no rules digest", ledger.ActionApproved, edit(func(a *ledger.GateAudit) { a.RulesDigest = "" }), "rules digest"},
			{"malformed rules digest", ledger.ActionApproved, edit(func(a *ledger.GateAudit) { a.RulesDigest = "sha256:ABC" }), "rules digest"},
			{"rule below -1", ledger.ActionApproved, edit(func(a *ledger.GateAudit) { a.Rule = -2 }), "gate rule"},
			{"no reason", ledger.ActionApproved, edit(func(a *ledger.GateAudit) { a.Reason = "" }), "gate reason is required"},
			{"control characters", ledger.ActionApproved, edit(func(a *ledger.GateAudit) { a.Reason = "rule 1\x1b[2J" }), "gate reason contains control characters"},
			{"long reason", ledger.ActionApproved, edit(func(a *ledger.GateAudit) { a.Reason = strings.Repeat("x", ledger.MaxGateReasonLength+1) }),
				"gate reason is longer than"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := b.Store.CreateAction(ctx, params(run.ID, "step-1", tc.gate, tc.audit))
				require.ErrorIs(t, err, ledger.ErrInvalid)
				require.ErrorContains(t, err, tc.msg)
			})
		}
		actions, err := b.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
		require.NoError(t, err)
		require.Empty(t, actions)
	})
}
