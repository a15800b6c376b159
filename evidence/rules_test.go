package evidence_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

// TestReportRuleSets: a report holds the rule set its actions' gates cite,
// as stored under its digest, and each gated action the rule that decided
// it; the report verifies, and fails verification once the rule set is
// edited, in the report or in the database.
func TestReportRuleSets(t *testing.T) {
	ctx := context.Background()
	f := openFixture(t)
	const rule0 = `{"decision":"auto_approve","tool":"cards.write"}`
	stored, err := f.store.PutRuleSet(ctx, json.RawMessage(`{"rules":[`+rule0+`],
		"defaults":{"approval_ttl_ms":86400000,"effects":{"read":"auto_approve","write":"require_approval"},"unknown_effect":"require_approval"}}`))
	require.NoError(t, err)
	digest := stored.RuleSet.Digest

	run := ledgertest.RunningRun(t, f.store, "ruled", ledger.BudgetLimits{})
	propose := func(key string, gate ledger.ActionState, audit ledger.GateAudit) {
		_, err := f.store.CreateAction(ctx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: key, Tool: "cards.write",
			ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"cards":[]}`), Gate: gate,
			ApprovalTTL: time.Hour, GateAudit: audit, Actor: "engine"})
		require.NoError(t, err)
	}
	propose("step-1", ledger.ActionApproved, ledger.GateAudit{Rule: 0, Reason: "rule 0: cards.write is auto-approved", RulesDigest: digest})
	propose("step-2", ledger.ActionAwaitingApproval, ledger.GateAudit{Rule: -1, Reason: "default: write actions require approval",
		RulesDigest: digest})

	rep, err := evidence.Build(ctx, f.store, run.ID, f.options(t))
	require.NoError(t, err)
	require.True(t, rep.Chain.OK)
	require.Equal(t, []evidence.RuleSet{{Digest: digest, Document: stored.RuleSet.Document}}, rep.RuleSets)
	require.JSONEq(t, rule0, string(rep.Actions[0].DecidingRule), "rule 0 of the cited set decided")
	require.Nil(t, rep.Actions[1].DecidingRule, "the default decided")
	var md bytes.Buffer
	require.NoError(t, rep.Markdown(&md))
	require.Contains(t, md.String(), `the rule: {"decision":"auto\_approve","tool":"cards.write"}`)

	var out bytes.Buffer
	require.NoError(t, rep.JSON(&out))
	read := func() *evidence.Report {
		r, err := evidence.ReadReport(out.Bytes())
		require.NoError(t, err)
		return r
	}
	_, err = read().Verify(nil)
	require.NoError(t, err)

	t.Run("ErrUnverified rule set edited in the report", func(t *testing.T) {
		r := read()
		r.RuleSets[0].Document = json.RawMessage(bytes.Replace(r.RuleSets[0].Document, []byte("auto_approve"), []byte("deny"), 1))
		r.Actions[0].DecidingRule = json.RawMessage(`{"decision":"deny","tool":"cards.write"}`)
		_, err := r.Verify(nil)
		require.ErrorIs(t, err, evidence.ErrUnverified)
		require.ErrorContains(t, err, "rule set "+string(digest)+": its document has digest")
	})
	t.Run("ErrUnverified gate rule edited in the report", func(t *testing.T) {
		r := read()
		r.Actions[0].DecidingRule = json.RawMessage(`{"decision":"deny","tool":"cards.write"}`)
		_, err := r.Verify(nil)
		require.ErrorIs(t, err, evidence.ErrUnverified)
		require.ErrorContains(t, err, "deciding_rule is not rule 0")
	})
	t.Run("ErrUnverified rule set no gate cites", func(t *testing.T) {
		r := read()
		other, err := ledger.DigestJSON([]byte(`{"rules":[],"defaults":{}}`))
		require.NoError(t, err)
		r.RuleSets = append(r.RuleSets, evidence.RuleSet{Digest: other, Document: json.RawMessage(`{"rules":[],"defaults":{}}`)})
		_, err = r.Verify(nil)
		require.ErrorContains(t, err, "no action's gate cites it")
	})
	t.Run("ChainBroken rule set edited in the database", func(t *testing.T) {
		db, err := sql.Open("sqlite3", "file:"+f.path+"?_busy_timeout=5000")
		require.NoError(t, err)
		defer db.Close()
		_, err = db.Exec(`UPDATE rule_sets SET document = replace(document, 'auto_approve', 'deny') WHERE digest = ?`, string(digest))
		require.NoError(t, err)
		rep, err := evidence.Build(ctx, f.store, run.ID, f.options(t))
		require.NoError(t, err)
		require.False(t, rep.Chain.OK)
		require.Contains(t, *rep.Chain.Reason, "rule set "+string(digest))
		var out bytes.Buffer
		require.NoError(t, rep.JSON(&out))
		r, err := evidence.ReadReport(out.Bytes())
		require.NoError(t, err)
		_, err = r.Verify(nil)
		require.ErrorIs(t, err, evidence.ErrUnverified)
		require.ErrorContains(t, err, "its document has digest")
	})
}
