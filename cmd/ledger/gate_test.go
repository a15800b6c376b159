package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

func TestGateText(t *testing.T) {
	t.Parallel()
	rule := 2
	digest := ledger.Digest("sha256:" + strings.Repeat("ab", 32))
	for _, tc := range []struct {
		name string
		gate *server.ActionGate
		want string
	}{
		{"rule", &server.ActionGate{Decision: ledger.ActionApproved, Rule: &rule, Reason: "rule 2: cards.write is auto-approved", RulesDigest: digest},
			"rule 2 — approved: cards.write is auto-approved"},
		{"default", &server.ActionGate{Decision: ledger.ActionAwaitingApproval, Reason: "default: write actions require approval", RulesDigest: digest},
			"default — awaiting_approval: write actions require approval"},
		{"reason in other words", &server.ActionGate{Decision: ledger.ActionDenied, Rule: &rule, Reason: "denied\u202e by rule", RulesDigest: digest},
			`rule 2 — denied: denied\u202e by rule`},
		{"not recorded", nil, "not recorded (the action predates the gate's audit)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, gateText(tc.gate))
		})
	}
}

// TestServeLogsRulesDigest: serve logs, once at start-up, the digest of the
// rules in force that every action it gates records.
func TestServeLogsRulesDigest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	doc := []byte(`{"schema_version":"1.0","rules":[{"tool":"cards.write","decision":"auto_approve"}]}`)
	path := filepath.Join(dir, "rules.json")
	require.NoError(t, os.WriteFile(path, doc, 0o600))
	rules, err := contracts.ParseRules(doc)
	require.NoError(t, err)
	policy, err := approval.NewPolicy(rules, approval.Defaults{})
	require.NoError(t, err)

	_, logs, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0", "--rules", path)
	require.NoError(t, stop())
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "approval rules in force" {
			lines = append(lines, line)
		}
	}
	require.Len(t, lines, 1, logs.String())
	require.Equal(t, string(policy.RulesDigest()), lines[0]["rules_digest"])
	require.Equal(t, path, lines[0]["rules_file"])
	require.Equal(t, float64(1), lines[0]["rules"])
}
