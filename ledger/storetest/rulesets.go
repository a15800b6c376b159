package storetest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// testRuleSets: a rule set is stored once under the digest of its
// canonical JSON, found by digest or newest first, and a run's chain reads
// the rule sets its actions cite and breaks when one of them is edited.
func testRuleSets(t *testing.T, h Harness) {
	ctx := context.Background()
	const doc = `{"rules": [{"tool": "cards.write", "decision": "auto_approve"}], "defaults": {"approval_ttl_ms": 1000}}`
	canonical, err := ledger.Canonicalize([]byte(doc))
	require.NoError(t, err)
	digest := ledger.DigestCanonical(canonical)

	t.Run("OK stored once, canonical, under its digest", func(t *testing.T) {
		b := openStore(t, h)
		first, err := b.Store.PutRuleSet(ctx, json.RawMessage(doc))
		require.NoError(t, err)
		require.True(t, first.Created)
		require.Equal(t, digest, first.RuleSet.Digest)
		require.Equal(t, string(canonical), string(first.RuleSet.Document))
		require.Equal(t, b.Clock.Now().UTC(), first.RuleSet.StoredAt)

		b.Clock.Advance(time.Minute)
		again, err := b.Store.PutRuleSet(ctx, json.RawMessage(`{"defaults":{"approval_ttl_ms":1000},"rules":[{"decision":"auto_approve","tool":"cards.write"}]}`))
		require.NoError(t, err)
		require.False(t, again.Created, "the same rule set, written otherwise")
		require.Equal(t, first.RuleSet, again.RuleSet, "as first stored")

		found, err := b.Store.FindRuleSets(ctx, ledger.RuleSetFilter{Digests: []ledger.Digest{digest}})
		require.NoError(t, err)
		require.Equal(t, []*ledger.RuleSet{first.RuleSet}, found)
	})

	t.Run("OK find by digest and newest first", func(t *testing.T) {
		b := openStore(t, h)
		var stored []*ledger.RuleSet
		for _, d := range []string{`{"rules":[]}`, `{"rules":[1]}`, `{"rules":[2]}`} {
			r, err := b.Store.PutRuleSet(ctx, json.RawMessage(d))
			require.NoError(t, err)
			stored = append(stored, r.RuleSet)
			b.Clock.Advance(time.Second)
		}
		all, err := b.Store.FindRuleSets(ctx, ledger.RuleSetFilter{})
		require.NoError(t, err)
		require.Equal(t, []*ledger.RuleSet{stored[2], stored[1], stored[0]}, all)
		latest, err := b.Store.FindRuleSets(ctx, ledger.RuleSetFilter{Limit: 1})
		require.NoError(t, err)
		require.Equal(t, []*ledger.RuleSet{stored[2]}, latest)

		some, err := b.Store.FindRuleSets(ctx, ledger.RuleSetFilter{Digests: []ledger.Digest{stored[0].Digest, digest, stored[1].Digest, stored[0].Digest}})
		require.NoError(t, err)
		require.Equal(t, []*ledger.RuleSet{stored[0], stored[1]}, some, "in the order given, the unknown one left out, a repeat once")
		none, err := b.Store.FindRuleSets(ctx, ledger.RuleSetFilter{Digests: []ledger.Digest{digest}})
		require.NoError(t, err)
		require.Empty(t, none)
	})

	t.Run("ErrInvalid not JSON", func(t *testing.T) {
		b := openStore(t, h)
		_, err := b.Store.PutRuleSet(ctx, json.RawMessage(`{"rules":`))
		require.Equal(t, ledger.CodeInvalid, ledger.Code(err))
		all, err := b.Store.FindRuleSets(ctx, ledger.RuleSetFilter{})
		require.NoError(t, err)
		require.Empty(t, all, "nothing stored")
	})

	t.Run("OK concurrent puts store one", func(t *testing.T) {
		b := openStore(t, h)
		const n = 8
		created := make(chan bool, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				r, err := b.Store.PutRuleSet(ctx, json.RawMessage(doc))
				if err == nil {
					created <- r.Created
				}
			})
		}
		wg.Wait()
		close(created)
		var got []bool
		for c := range created {
			got = append(got, c)
		}
		require.Len(t, got, n)
		require.ElementsMatch(t, append([]bool{true}, make([]bool, n-1)...), got)
	})

	t.Run("ErrConflict chain breaks on an edited rule set", func(t *testing.T) {
		b := openStore(t, h)
		_, err := b.Store.PutRuleSet(ctx, json.RawMessage(doc))
		require.NoError(t, err)
		run := b.RunningRun(t, "ruled", ledger.BudgetLimits{})
		res, err := b.Store.CreateAction(ctx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: "step-1", Tool: "cards.write",
			ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"cards":[]}`), Gate: ledger.ActionApproved,
			GateAudit: ledger.GateAudit{Rule: 0, Reason: "rule 0: cards.write is auto-approved", RulesDigest: digest}, Actor: "engine"})
		require.NoError(t, err)
		// A second action cites a rule set never stored (as one recorded
		// before rule sets were): the chain does not count it against itself.
		_, err = b.Store.CreateAction(ctx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: "step-2", Tool: "cards.write",
			ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"cards":[1]}`), Gate: ledger.ActionAwaitingApproval,
			ApprovalTTL: time.Hour, GateAudit: ledger.GateAudit{Rule: -1, Reason: "default: write actions require approval",
				RulesDigest: testRulesDigest}, Actor: "engine"})
		require.NoError(t, err)

		chain, err := b.Store.FindChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, chain.Report.OK, chain.Report.Reason)
		require.Len(t, chain.RuleSets, 1, "the stored one of the two cited")
		require.Equal(t, digest, chain.RuleSets[0].Digest)
		require.Equal(t, string(canonical), string(chain.RuleSets[0].Document))

		exec(t, b.DB, `UPDATE rule_sets SET document = ? WHERE digest = ?`,
			`{"defaults":{"approval_ttl_ms":1000},"rules":[{"decision":"deny","tool":"cards.write"}]}`, digest)
		report, err := b.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.False(t, report.OK)
		require.Equal(t, "rule_set", report.Entity)
		require.Equal(t, string(digest), report.EntityID)
		require.Equal(t, gateEvent(t, b.Store, run.ID, res.Action.ID).Seq, report.BrokenSeq,
			"broken at the first event that bound the action citing it: its gate's")
		require.Contains(t, report.Reason, "not the digest it is kept under")

		_, err = b.Store.PutRuleSet(ctx, json.RawMessage(doc))
		require.Equal(t, ledger.CodeConflict, ledger.Code(err), "the edited row is not taken for the rule set")
	})
}
