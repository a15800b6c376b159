package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeRulesNumbers: a rules file with a number the schema library
// cannot check is a usage error naming the field, not a panic at start-up.
func TestServeRulesNumbers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.json")
	require.NoError(t, os.WriteFile(rules, []byte(`{"schema_version":"1.0","rules":[{"tool":"*","decision":"require_approval","approval_ttl_ms":1e1000001}]}`), 0o600))
	_, _, err := runCLI(t, nil, "serve", "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0", "--rules", rules)
	requireExit(t, err, 2)
	require.Contains(t, err.Error(), "/rules/0/approval_ttl_ms")
	require.Contains(t, err.Error(), "exponent")
}

// TestRulesShow: the rule set a service starts with is stored under its
// digest, and `ledger rules show` prints it by digest, as the latest, or as
// a rules file configures it; an unknown digest is not found (exit 5), a
// malformed one a usage error (exit 2).
func TestRulesShow(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	rulesFile := filepath.Join(dir, "rules.json")
	require.NoError(t, os.WriteFile(rulesFile, []byte(`{"schema_version":"1.0","rules":[
		{"tool":"cards.write","tenant":"acme","decision":"require_approval","approval_ttl_ms":3600000,"allow_self_approval":true},
		{"tool":"*","effect":"read","decision":"deny"}]}`), 0o600))
	rules, err := configuredRules(rulesFile, "", nil)
	require.NoError(t, err)
	svc, err := openService(t.Context(), serviceConfig{DBPath: db, Rules: rules, Logger: discardLogger()})
	require.NoError(t, err)
	digest := string(svc.approvals.RulesDigest())
	require.NoError(t, svc.Close())

	want := "rule set " + digest + " (stored "
	lines := []string{
		"rule 0: tool cards.write, tenant acme: require_approval, approvals open 1h0m0s, the submitter may approve",
		"rule 1: tool *, effect read: deny",
		"default: read auto_approve, write require_approval, other effects require_approval; approvals open 24h0m0s",
	}
	for _, args := range [][]string{{"rules", "show", "--db", db}, {"rules", "show", digest, "--db", db}} {
		out, _, err := runCLI(t, nil, args...)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(out, want), out)
		for _, l := range lines {
			require.Contains(t, out, l+"\n")
		}
	}

	out, _, err := runCLI(t, nil, "rules", "show", "--rules", rulesFile)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "rule set "+digest+" (configured"), "the file's rule set is the one stored: %s", out)

	out, _, err = runCLI(t, nil, "rules", "show", digest, "--db", db, "--json")
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Len(t, doc["rules"], 2)

	unknown := "sha256:" + strings.Repeat("0", 64)
	_, _, err = runCLI(t, nil, "rules", "show", unknown, "--db", db)
	requireExit(t, err, 5)
	require.ErrorContains(t, err, "rule set "+unknown+" is not stored")
	_, _, err = runCLI(t, nil, "rules", "show", "cards", "--db", db)
	requireExit(t, err, 2)
	_, _, err = runCLI(t, nil, "rules", "show", digest, "--rules", rulesFile)
	requireExit(t, err, 2)

	empty := filepath.Join(dir, "empty.db")
	_, _, err = runCLI(t, nil, "migrate", "--db", empty)
	require.NoError(t, err)
	_, _, err = runCLI(t, nil, "rules", "show", "--db", empty)
	requireExit(t, err, 5)
	require.ErrorContains(t, err, "no rule set is stored")
}
