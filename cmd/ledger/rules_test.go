package main

import (
	"os"
	"path/filepath"
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
