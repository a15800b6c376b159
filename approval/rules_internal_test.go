package approval

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// TestRulesDigestCoversTheDefaults: the defaults Evaluate applies are the
// ones the digest covers, so a build whose default for reads changed
// gates differently and says so by its digest, with the same rules file.
func TestRulesDigestCoversTheDefaults(t *testing.T) {
	read := contracts.ToolDescriptor{Name: "docs.search", Version: "1", Effect: contracts.EffectRead}
	before, err := NewPolicy(nil, Defaults{})
	require.NoError(t, err)
	require.Equal(t, ledger.ActionApproved, before.Evaluate("acme", read).Gate)

	was := defaultDecisions[contracts.EffectRead]
	defaultDecisions[contracts.EffectRead] = contracts.RuleDecisionRequireApproval
	t.Cleanup(func() { defaultDecisions[contracts.EffectRead] = was })
	after, err := NewPolicy(nil, Defaults{})
	require.NoError(t, err)
	d := after.Evaluate("acme", read)
	require.Equal(t, ledger.ActionAwaitingApproval, d.Gate)
	require.Equal(t, "default: read actions require approval", d.Reason)
	require.NotEqual(t, before.RulesDigest(), after.RulesDigest())
	require.Equal(t, after.RulesDigest(), d.RulesDigest)
}
