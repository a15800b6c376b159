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
	t.Parallel()
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

	t.Run("Agent", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokens.json")
		out, _, err := runCLI(t, nil, "token", "new", "--principal", "bot", "--tenant", "acme", "--role", "agent",
			"--agent", "payer", "--agent", "biller", "--add-to", path)
		require.NoError(t, err)
		var entry server.TokenEntry
		require.NoError(t, json.Unmarshal([]byte(strings.Split(out, "\n")[1]), &entry))
		require.Equal(t, []string{"payer", "biller"}, entry.Agents)
		tokens, err := server.LoadTokens(path)
		require.NoError(t, err)
		require.Equal(t, 1, tokens.Len())

		out, _, err = runCLI(t, nil, "token", "list", "--file", path)
		require.NoError(t, err)
		require.Regexp(t, `\nbot\s+acme\s+agent\s+payer,biller\s+[0-9a-f]{8}\n`, out)
	})

	t.Run("AddTo", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokens.json")
		out1, errOut, err := runCLI(t, nil, "token", "new", "--principal", "alice", "--tenant", "acme", "--role", "submitter", "--add-to", path)
		require.NoError(t, err)
		require.Contains(t, errOut, "send the server SIGHUP")
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
			"invalid role":          {"--principal", "a", "--tenant", "t", "--role", "root"},
			"no role":               {"--principal", "a", "--tenant", "t"},
			"no principal":          {"--tenant", "t", "--role", "admin"},
			"no tenant":             {"--principal", "a", "--role", "admin"},
			"control chars":         {"--principal", "a\x01", "--tenant", "t", "--role", "admin"},
			"unknown flag":          {"--principal", "a", "--tenant", "t", "--role", "admin", "--nope"},
			"agent without --agent": {"--principal", "a", "--tenant", "t", "--role", "agent"},
			"--agent without agent": {"--principal", "a", "--tenant", "t", "--role", "submitter", "--agent", "payer"},
		} {
			t.Run(name, func(t *testing.T) {
				out, _, err := runCLI(t, nil, append([]string{"token", "new"}, args...)...)
				requireExit(t, err, 2)
				require.Empty(t, out, "no token printed")
			})
		}
	})
}

// tokensFile writes a tokens file of entries and returns its path and content.
func tokensFile(t *testing.T, entries ...server.TokenEntry) (string, []byte) {
	t.Helper()
	data, err := json.Marshal(server.TokensFile{Tokens: append([]server.TokenEntry{}, entries...)})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path, data
}

// entryWithHash is an entry with a chosen hash (no token has it).
func entryWithHash(principal, tenant, hash string, roles ...string) server.TokenEntry {
	return server.TokenEntry{SHA256: hash, Principal: principal, Tenant: tenant, Roles: roles}
}

// newEntry is a fresh token and its entry.
func newEntry(t *testing.T, principal, tenant string, roles ...string) (string, server.TokenEntry) {
	t.Helper()
	tok, e, err := server.NewTokenLine(principal, tenant, roles)
	require.NoError(t, err)
	return tok, e
}

func TestTokenList(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		aliceTok, alice := newEntry(t, "alice", "acme", "submitter")
		bobTok, bob := newEntry(t, "bob", "acme", "approver", "auditor")
		path, _ := tokensFile(t, alice, bob)
		out, _, err := runCLI(t, nil, "token", "list", "--file", path)
		require.NoError(t, err)
		require.Regexp(t, `^PRINCIPAL\s+TENANT\s+ROLES\s+AGENTS\s+SHA256\n`, out)
		require.Regexp(t, `\nalice\s+acme\s+submitter\s+-\s+`+alice.SHA256[:8]+`\n`, out)
		require.Regexp(t, `\nbob\s+acme\s+approver,auditor\s+-\s+`+bob.SHA256[:8]+`\n`, out)
		for _, secret := range []string{aliceTok, bobTok, alice.SHA256[:9], bob.SHA256[:9]} {
			require.NotContains(t, out, secret, "never a token, never more of a hash than needed")
		}

		out, _, err = runCLI(t, nil, "token", "list", "--file", path, "--json")
		require.NoError(t, err)
		var got struct {
			Tokens []tokenRow `json:"tokens"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &got))
		require.Equal(t, []tokenRow{
			{Principal: "alice", Tenant: "acme", Roles: []string{"submitter"}, SHA256Prefix: alice.SHA256[:8]},
			{Principal: "bob", Tenant: "acme", Roles: []string{"approver", "auditor"}, SHA256Prefix: bob.SHA256[:8]},
		}, got.Tokens)
	})

	t.Run("PrefixLongEnoughToTellApart", func(t *testing.T) {
		shared := "0123456789ab"
		a := entryWithHash("a", "acme", shared+strings.Repeat("1", 52), "admin")
		b := entryWithHash("b", "acme", shared+strings.Repeat("2", 52), "admin")
		c := entryWithHash("c", "acme", strings.Repeat("f", 64), "admin")
		path, _ := tokensFile(t, a, b, c)
		out, _, err := runCLI(t, nil, "token", "list", "--file", path, "--json")
		require.NoError(t, err)
		var got struct {
			Tokens []tokenRow `json:"tokens"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &got))
		require.Equal(t, shared+"1", got.Tokens[0].SHA256Prefix, "13 digits: the first that differ")
		require.Equal(t, shared+"2", got.Tokens[1].SHA256Prefix)
		require.Equal(t, strings.Repeat("f", 13), got.Tokens[2].SHA256Prefix, "one length for all")
	})

	t.Run("Empty", func(t *testing.T) {
		path, _ := tokensFile(t)
		out, _, err := runCLI(t, nil, "token", "list", "--file", path)
		require.NoError(t, err)
		require.Equal(t, "no tokens: a server refuses this file (it would let nobody in)\n", out)
	})

	t.Run("Environment", func(t *testing.T) {
		_, alice := newEntry(t, "alice", "acme", "submitter")
		path, _ := tokensFile(t, alice)
		t.Setenv(envTokensFile, path)
		out, _, err := runCLI(t, nil, "token", "list")
		require.NoError(t, err)
		require.Contains(t, out, "alice")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		t.Setenv(envTokensFile, "")
		bad := filepath.Join(t.TempDir(), "bad.json")
		require.NoError(t, os.WriteFile(bad, []byte(`{"tokens": [{"sha256": "nope"}]}`), 0o600))
		for name, args := range map[string][]string{
			"no file":      {},
			"missing file": {"--file", filepath.Join(t.TempDir(), "nope.json")},
			"invalid file": {"--file", bad},
			"extra arg":    {"--file", bad, "x"},
		} {
			t.Run(name, func(t *testing.T) {
				out, _, err := runCLI(t, nil, append([]string{"token", "list"}, args...)...)
				requireExit(t, err, exitUsage)
				require.Empty(t, out)
			})
		}
	})
}

func TestTokenRevoke(t *testing.T) {
	// setup is a tokens file of alice in acme and globex, and bob in acme.
	type fixture struct {
		path                          string
		content                       []byte
		aliceAcme, aliceGlobex, bobAc server.TokenEntry
	}
	setup := func(t *testing.T) fixture {
		t.Helper()
		var f fixture
		_, f.aliceAcme = newEntry(t, "alice", "acme", "submitter")
		_, f.aliceGlobex = newEntry(t, "alice", "globex", "approver")
		_, f.bobAc = newEntry(t, "bob", "acme", "approver")
		f.path, f.content = tokensFile(t, f.aliceAcme, f.aliceGlobex, f.bobAc)
		return f
	}
	// left reads the file back as the server would, and returns its entries.
	left := func(t *testing.T, path string) []server.TokenEntry {
		t.Helper()
		_, err := server.LoadTokens(path)
		require.NoError(t, err, "the server accepts the rewritten file")
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		var doc server.TokensFile
		require.NoError(t, json.Unmarshal(data, &doc))
		return doc.Tokens
	}
	unchanged := func(t *testing.T, f fixture) {
		t.Helper()
		data, err := os.ReadFile(f.path)
		require.NoError(t, err)
		require.Equal(t, f.content, data, "the file is left as it was")
	}

	t.Run("PrincipalInTenant", func(t *testing.T) {
		f := setup(t)
		out, errOut, err := runCLI(t, nil, "token", "revoke", "--file", f.path, "--principal", "alice", "--tenant", "acme")
		require.NoError(t, err)
		require.Equal(t, "revoked alice (tenant acme, roles submitter) sha256 "+f.aliceAcme.SHA256[:8]+"\n", out)
		require.Contains(t, errOut, "2 tokens left")
		require.Contains(t, errOut, "SIGHUP")
		require.Equal(t, []server.TokenEntry{f.aliceGlobex, f.bobAc}, left(t, f.path))
	})

	t.Run("PrincipalInEveryTenant", func(t *testing.T) {
		f := setup(t)
		out, _, err := runCLI(t, nil, "token", "revoke", "--file", f.path, "--principal", "alice")
		require.NoError(t, err)
		require.Contains(t, out, "revoked alice (tenant acme")
		require.Contains(t, out, "revoked alice (tenant globex")
		require.Equal(t, []server.TokenEntry{f.bobAc}, left(t, f.path))
	})

	t.Run("SHA256Prefix", func(t *testing.T) {
		f := setup(t)
		out, _, err := runCLI(t, nil, "token", "revoke", "--file", f.path, "--sha256", strings.ToUpper(f.bobAc.SHA256[:8]))
		require.NoError(t, err)
		require.Contains(t, out, "revoked bob (tenant acme")
		require.Equal(t, []server.TokenEntry{f.aliceAcme, f.aliceGlobex}, left(t, f.path))
	})

	t.Run("LastToken", func(t *testing.T) {
		_, alice := newEntry(t, "alice", "acme", "submitter")
		path, _ := tokensFile(t, alice)
		_, errOut, err := runCLI(t, nil, "token", "revoke", "--file", path, "--principal", "alice")
		require.NoError(t, err)
		require.Equal(t, "wrote "+path+" (no tokens left). A server refuses a file without tokens: it does not start with it, "+
			"and on SIGHUP it keeps the tokens in force, the revoked ones included. Stop the server to shut everyone out, "+
			"or add a token (ledger token new --add-to "+path+") and send SIGHUP\n", errOut)
		_, err = server.LoadTokens(path)
		require.ErrorIs(t, err, server.ErrNoTokens)
		out, _, err := runCLI(t, nil, "token", "list", "--file", path)
		require.NoError(t, err, "the token commands still read it")
		require.Equal(t, "no tokens: a server refuses this file (it would let nobody in)\n", out)
	})

	t.Run("ErrAmbiguousPrefix", func(t *testing.T) {
		shared := "0123456789ab"
		a := entryWithHash("a", "acme", shared+strings.Repeat("1", 52), "admin")
		b := entryWithHash("b", "acme", shared+strings.Repeat("2", 52), "admin")
		path, content := tokensFile(t, a, b)
		f := fixture{path: path, content: content}
		out, _, err := runCLI(t, nil, "token", "revoke", "--file", path, "--sha256", shared[:8])
		requireExit(t, err, exitUsage)
		require.Contains(t, err.Error(), "matches 2 entries")
		require.Empty(t, out)
		unchanged(t, f)

		_, _, err = runCLI(t, nil, "token", "revoke", "--file", path, "--sha256", shared+"2")
		require.NoError(t, err, "a longer prefix tells them apart")
		require.Equal(t, []server.TokenEntry{a}, left(t, path))
	})

	t.Run("ErrNoMatch", func(t *testing.T) {
		f := setup(t)
		for name, args := range map[string][]string{
			"principal":        {"--principal", "carol"},
			"other tenant":     {"--principal", "bob", "--tenant", "globex"},
			"prefix":           {"--sha256", "ffffffffff"},
			"principal's case": {"--principal", "Alice"},
		} {
			t.Run(name, func(t *testing.T) {
				_, _, err := runCLI(t, nil, append([]string{"token", "revoke", "--file", f.path}, args...)...)
				requireExit(t, err, exitNotFound)
				unchanged(t, f)
			})
		}
	})

	t.Run("ErrUsage", func(t *testing.T) {
		f := setup(t)
		t.Setenv(envTokensFile, "")
		for name, args := range map[string][]string{
			"nothing to revoke":     {"--file", f.path},
			"both":                  {"--file", f.path, "--principal", "alice", "--sha256", f.bobAc.SHA256[:8]},
			"tenant alone":          {"--file", f.path, "--tenant", "acme"},
			"short prefix":          {"--file", f.path, "--sha256", f.bobAc.SHA256[:7]},
			"not hex":               {"--file", f.path, "--sha256", "zzzzzzzz"},
			"longer than a hash":    {"--file", f.path, "--sha256", f.bobAc.SHA256 + "0"},
			"no file":               {"--principal", "alice"},
			"missing file":          {"--file", filepath.Join(t.TempDir(), "nope.json"), "--principal", "alice"},
			"extra arg":             {"--file", f.path, "--principal", "alice", "x"},
			"the token, not a hash": {"--file", f.path, "--sha256", "lgr_abcdefgh"},
		} {
			t.Run(name, func(t *testing.T) {
				_, _, err := runCLI(t, nil, append([]string{"token", "revoke"}, args...)...)
				requireExit(t, err, exitUsage)
				unchanged(t, f)
			})
		}
	})

	t.Run("ErrInvalidFile", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokens.json")
		bad := []byte(`{"tokens": [{"sha256": "nope", "principal": "alice", "tenant": "acme", "roles": ["admin"]}]}`)
		require.NoError(t, os.WriteFile(path, bad, 0o600))
		_, _, err := runCLI(t, nil, "token", "revoke", "--file", path, "--principal", "alice")
		requireExit(t, err, exitUsage)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, bad, data)
	})
}
