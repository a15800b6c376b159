package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/actionledger/ledger/server"
	"github.com/stretchr/testify/require"
)

func TestTokenNew(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		out, errOut, err := runCLI(t, nil, "token", "new", "--principal", "bob", "--tenant", "acme", "--role", "approver", "--role", "auditor")
		require.NoError(t, err)
		require.Empty(t, errOut)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		require.Len(t, lines, 2, "the token, then its entry")
		token := lines[0]
		require.True(t, strings.HasPrefix(token, server.TokenPrefix))
		var entry server.TokenEntry
		require.NoError(t, json.Unmarshal([]byte(lines[1]), &entry))
		require.Equal(t, server.TokenEntry{SHA256: server.HashToken(token), Principal: "bob", Tenant: "acme",
			Roles: []string{"approver", "auditor"}}, entry)
		require.NotContains(t, lines[1], token, "the entry holds only the hash")

		// The entry is what a tokens file accepts.
		_, err = server.ParseTokens([]byte(`{"tokens": [` + lines[1] + `]}`))
		require.NoError(t, err)

		again, _, err := runCLI(t, nil, "token", "new", "--principal", "bob", "--tenant", "acme", "--role", "approver")
		require.NoError(t, err)
		require.NotEqual(t, token, strings.Split(again, "\n")[0], "fresh every time")
	})

	t.Run("JSON", func(t *testing.T) {
		out, _, err := runCLI(t, nil, "token", "new", "--principal", "alice", "--tenant", "acme", "--role", "submitter", "--json")
		require.NoError(t, err)
		var got struct {
			Token string            `json:"token"`
			Entry server.TokenEntry `json:"entry"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &got))
		require.Equal(t, server.HashToken(got.Token), got.Entry.SHA256)
		require.Equal(t, []string{"submitter"}, got.Entry.Roles)
	})

	t.Run("AddTo", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokens.json")
		out1, errOut, err := runCLI(t, nil, "token", "new", "--principal", "alice", "--tenant", "acme", "--role", "submitter", "--add-to", path)
		require.NoError(t, err)
		require.Contains(t, errOut, "restart the server")
		out2, _, err := runCLI(t, nil, "token", "new", "--principal", "bob", "--tenant", "acme", "--role", "approver", "--add-to", path)
		require.NoError(t, err)

		tokens, err := server.LoadTokens(path)
		require.NoError(t, err)
		require.Equal(t, 2, tokens.Len())
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		var file server.TokensFile
		require.NoError(t, json.Unmarshal(data, &file))
		require.Equal(t, server.HashToken(strings.Split(out1, "\n")[0]), file.Tokens[0].SHA256)
		require.Equal(t, server.HashToken(strings.Split(out2, "\n")[0]), file.Tokens[1].SHA256)
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	})

	t.Run("ErrAddToInvalidFile", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokens.json")
		bad := []byte(`{"tokens": [{"sha256": "nope", "principal": "x", "tenant": "y", "roles": ["admin"]}]}`)
		require.NoError(t, os.WriteFile(path, bad, 0o600))
		_, _, err := runCLI(t, nil, "token", "new", "--principal", "alice", "--tenant", "acme", "--role", "submitter", "--add-to", path)
		requireExit(t, err, 2)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, bad, data, "left as it was")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		for name, args := range map[string][]string{
			"invalid role":  {"--principal", "a", "--tenant", "t", "--role", "root"},
			"no role":       {"--principal", "a", "--tenant", "t"},
			"no principal":  {"--tenant", "t", "--role", "admin"},
			"no tenant":     {"--principal", "a", "--role", "admin"},
			"control chars": {"--principal", "a\x01", "--tenant", "t", "--role", "admin"},
			"unknown flag":  {"--principal", "a", "--tenant", "t", "--role", "admin", "--nope"},
		} {
			t.Run(name, func(t *testing.T) {
				out, _, err := runCLI(t, nil, append([]string{"token", "new"}, args...)...)
				requireExit(t, err, 2)
				require.Empty(t, out, "no token printed")
			})
		}
	})
}
