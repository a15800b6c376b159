package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

func TestAuthentication(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	unauthorized := func(t *testing.T, header map[string][]string) {
		t.Helper()
		res := e.send(t, request{method: http.MethodGet, path: "/v1/runs", header: header})
		requireProblem(t, res, http.StatusUnauthorized, server.CodeUnauthorized)
		require.True(t, strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer"))
	}
	t.Run("Missing", func(t *testing.T) { unauthorized(t, nil) })
	t.Run("NotBearer", func(t *testing.T) {
		unauthorized(t, map[string][]string{"Authorization": {"Basic YWxpY2U6c2VjcmV0"}})
	})
	t.Run("EmptyBearer", func(t *testing.T) { unauthorized(t, map[string][]string{"Authorization": {"Bearer "}}) })
	t.Run("Malformed", func(t *testing.T) {
		unauthorized(t, map[string][]string{"Authorization": {"Bearer two words"}})
	})
	t.Run("TooLong", func(t *testing.T) {
		unauthorized(t, map[string][]string{"Authorization": {"Bearer " + strings.Repeat("a", 513)}})
	})
	t.Run("Unknown", func(t *testing.T) {
		tok, _, err := server.NewTokenLine("mallory", "acme", []string{"admin"})
		require.NoError(t, err)
		unauthorized(t, map[string][]string{"Authorization": {"Bearer " + tok}})
	})
	t.Run("Repeated", func(t *testing.T) {
		unauthorized(t, map[string][]string{"Authorization": {"Bearer " + e.tokens["alice"], "Bearer " + e.tokens["alice"]}})
	})
	t.Run("HashInsteadOfToken", func(t *testing.T) {
		unauthorized(t, map[string][]string{"Authorization": {"Bearer " + server.HashToken(e.tokens["alice"])}})
	})
	t.Run("OK", func(t *testing.T) {
		res := e.send(t, request{method: http.MethodGet, path: "/v1/runs",
			header: map[string][]string{"Authorization": {"bearer " + e.tokens["alice"]}}})
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	})
	t.Run("EveryV1RouteNeedsAToken", func(t *testing.T) {
		for _, r := range e.srv.RouteTable() {
			if !strings.HasPrefix(r[1], "/v1/") || r[1] == "/v1/openapi.json" {
				continue
			}
			path := strings.NewReplacer("{run_id}", "run_x", "{action_id}", "act_x", "{attempt_id}", "att_x").Replace(r[1])
			res := e.send(t, request{method: r[0], path: path, body: "{}"})
			if r[0] == http.MethodHead {
				require.Equal(t, http.StatusUnauthorized, res.Status, path)
				require.Equal(t, "application/problem+json", res.Header.Get("Content-Type"))
				require.NotEmpty(t, res.Header.Get("WWW-Authenticate"))
				require.Empty(t, res.Body)
				continue
			}
			requireProblem(t, res, http.StatusUnauthorized, server.CodeUnauthorized)
		}
	})
	t.Run("OpenNoToken", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz", "/metrics", "/v1/openapi.json"} {
			require.Equal(t, http.StatusOK, e.get(t, "", p).Status, p)
		}
	})
}

func TestDevMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{dev: true})
	t.Run("LoopbackNeedsNoToken", func(t *testing.T) {
		res := e.send(t, request{method: http.MethodPost, path: "/v1/runs", body: submitBody(t),
			header: map[string][]string{"Idempotency-Key": {"dev-1"}}})
		require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
		var sr server.SubmitResponse
		decode(t, res, &sr)
		require.Equal(t, "default", sr.Tenant)
		require.Equal(t, "dev", e.run(t, sr.ID).SubmittedBy)
	})
	t.Run("OnePrincipalTriesTheWholeFlow", func(t *testing.T) {
		id := e.submitDev(t, "dev-2")
		e.advance(t, id)
		a := e.pendingAction(t, id)
		res := e.send(t, request{method: http.MethodPost, path: "/v1/actions/" + string(a.ID) + "/approve",
			body: digestBody(a.ActionDigest)})
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		require.Equal(t, "completed", string(e.advance(t, id).State))
		require.Equal(t, 1, e.effectCount(t))
	})
	t.Run("ErrForbiddenNotLoopback", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
		req.RemoteAddr = "192.0.2.7:40000"
		requireProblem(t, e.direct(t, req), http.StatusForbidden, "forbidden")
	})
	t.Run("LoopbackIPv6", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
		req.RemoteAddr = "[::1]:40000"
		res := e.direct(t, req)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	})
}

func (e *env) submitDev(t *testing.T, key string) ledger.RunID {
	t.Helper()
	res := e.send(t, request{method: http.MethodPost, path: "/v1/runs", body: submitBody(t),
		header: map[string][]string{"Idempotency-Key": {key}}})
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var sr server.SubmitResponse
	decode(t, res, &sr)
	return sr.ID
}

func TestLoadTokens(t *testing.T) {
	t.Parallel()
	hash := strings.Repeat("ab", 32)
	other := strings.Repeat("cd", 32)
	entry := func(fields string) string { return `{"tokens":[` + fields + `]}` }
	ok := `{"sha256":"` + hash + `","principal":"alice","tenant":"acme","roles":["approver"]}`
	write := func(t *testing.T, content string) string {
		path := filepath.Join(t.TempDir(), "tokens.json")
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	t.Run("OK", func(t *testing.T) {
		tokens, err := server.LoadTokens(write(t, entry(ok+`,{"sha256":"`+other+`","principal":"bob","tenant":"acme","roles":["submitter","auditor"]}`)))
		require.NoError(t, err)
		require.Equal(t, 2, tokens.Len())
	})
	t.Run("Agent", func(t *testing.T) {
		tokens, err := server.LoadTokens(write(t, entry(`{"sha256":"`+hash+`","principal":"bot","tenant":"acme","roles":["agent"],"agents":["my-agent","my.other_agent"]}`)))
		require.NoError(t, err)
		require.Equal(t, 1, tokens.Len())
	})
	t.Run("ReadableByOthers", func(t *testing.T) {
		path := write(t, entry(ok))
		require.NoError(t, os.Chmod(path, 0o644))
		tokens, err := server.LoadTokens(path)
		require.NoError(t, err, "it holds only hashes")
		require.Equal(t, 1, tokens.Len())
	})
	t.Run("ErrEmpty", func(t *testing.T) {
		// ParseTokens takes it (revoking the last token leaves it); a
		// server would let nobody in with it.
		_, err := server.ParseTokens([]byte(`{"tokens":[]}`))
		require.NoError(t, err)
		path := write(t, `{"tokens":[]}`)
		_, err = server.LoadTokens(path)
		require.ErrorIs(t, err, server.ErrNoTokens)
		require.Equal(t, "load tokens "+path+": the file lists no tokens, so nobody could get in", err.Error())
	})
	for _, mode := range []os.FileMode{0o620, 0o602, 0o666} {
		t.Run(fmt.Sprintf("ErrWritable/%04o", mode), func(t *testing.T) {
			path := write(t, entry(ok))
			require.NoError(t, os.Chmod(path, mode))
			_, err := server.LoadTokens(path)
			require.ErrorIs(t, err, server.ErrTokensFileWritable)
			require.Equal(t, fmt.Sprintf("load tokens %[1]s: group or others may write it (mode %04[2]o), "+
				"and whoever writes it decides who may act: chmod 600 %[1]s", path, mode), err.Error())
		})
	}
	bad := map[string]struct{ content, msg string }{
		"not json":             {`{"tokens":`, "json"},
		"no tokens key":        {`{}`, `"tokens" is required`},
		"unknown field":        {`{"tokens":[],"extra":1}`, "unknown field"},
		"unknown entry field":  {entry(`{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["admin"],"token":"x"}`), "unknown field"},
		"duplicate key":        {`{"tokens":[],"tokens":[]}`, "duplicate key"},
		"trailing data":        {`{"tokens":[]} {}`, "after the top-level value"},
		"short hash":           {entry(`{"sha256":"abcd","principal":"a","tenant":"t","roles":["admin"]}`), "64 lowercase hex"},
		"upper hash":           {entry(`{"sha256":"` + strings.ToUpper(hash) + `","principal":"a","tenant":"t","roles":["admin"]}`), "64 lowercase hex"},
		"not hex":              {entry(`{"sha256":"` + strings.Repeat("zz", 32) + `","principal":"a","tenant":"t","roles":["admin"]}`), "64 lowercase hex"},
		"no principal":         {entry(`{"sha256":"` + hash + `","principal":"","tenant":"t","roles":["admin"]}`), "principal is required"},
		"no tenant":            {entry(`{"sha256":"` + hash + `","principal":"a","roles":["admin"]}`), "tenant is required"},
		"control char":         {entry(`{"sha256":"` + hash + `","principal":"a\u0007","tenant":"t","roles":["admin"]}`), "control characters"},
		"no roles":             {entry(`{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":[]}`), "at least one role"},
		"unknown role":         {entry(`{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["root"]}`), `unknown role "root"`},
		"duplicate hash":       {entry(ok + "," + ok), "appears twice"},
		"agent without agents": {entry(`{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["agent"]}`), `the role agent needs "agents"`},
		"agent empty agents":   {entry(`{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["agent"],"agents":[]}`), `the role agent needs "agents"`},
		"agents without agent": {entry(`{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["submitter"],"agents":["x"]}`), `"agents" go with the role agent only`},
		"agents of an admin":   {entry(`{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["admin"],"agents":["x"]}`), "an admin drives every agent"},
		"bad agent name":       {entry(`{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["agent"],"agents":["My Agent"]}`), `agent "My Agent"`},
	}
	for name, tc := range bad {
		t.Run("Err/"+name, func(t *testing.T) {
			_, err := server.LoadTokens(write(t, tc.content))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.msg)
			require.NotContains(t, err.Error(), hash, "errors never echo hashes")
		})
	}
	t.Run("Err/missing file", func(t *testing.T) {
		_, err := server.LoadTokens(filepath.Join(t.TempDir(), "nope.json"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})
}

func TestNewTokenLine(t *testing.T) {
	t.Parallel()
	tok, line, err := server.NewTokenLine("alice", "acme", []string{"submitter", "approver"})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(tok, server.TokenPrefix))
	require.Len(t, tok, len(server.TokenPrefix)+43, "32 bytes, base64url without padding")
	require.Equal(t, server.HashToken(tok), line.SHA256)
	require.NotContains(t, line.SHA256, tok)
	require.Equal(t, server.TokenEntry{SHA256: line.SHA256, Principal: "alice", Tenant: "acme",
		Roles: []string{"submitter", "approver"}}, line)

	_, bot, err := server.NewTokenLine("bot", "acme", []string{"agent"}, "payer", "biller")
	require.NoError(t, err)
	require.Equal(t, []string{"payer", "biller"}, bot.Agents)
	_, line2, err := server.NewTokenLine("alice", "acme", []string{"submitter"})
	require.NoError(t, err)
	require.Nil(t, line2.Agents)

	again, _, err := server.NewTokenLine("alice", "acme", []string{"submitter"})
	require.NoError(t, err)
	require.NotEqual(t, tok, again)

	// The line is what a tokens file holds.
	data, err := json.Marshal(server.TokensFile{Tokens: []server.TokenEntry{line}})
	require.NoError(t, err)
	tokens, err := server.ParseTokens(data)
	require.NoError(t, err)
	require.Equal(t, 1, tokens.Len())

	for name, tc := range map[string]struct {
		principal, tenant string
		roles             []string
		agents            []string
	}{
		"no principal":         {"", "acme", []string{"admin"}, nil},
		"no tenant":            {"alice", "", []string{"admin"}, nil},
		"no roles":             {"alice", "acme", nil, nil},
		"unknown role":         {"alice", "acme", []string{"owner"}, nil},
		"agent without agents": {"bot", "acme", []string{"agent"}, nil},
		"agents without agent": {"bot", "acme", []string{"submitter"}, []string{"payer"}},
	} {
		t.Run("Err/"+name, func(t *testing.T) {
			_, _, err := server.NewTokenLine(tc.principal, tc.tenant, tc.roles, tc.agents...)
			require.Error(t, err)
		})
	}
}

func TestSetTokens(t *testing.T) {
	t.Parallel()
	// tokensFor makes a set with one fresh token for principal in acme.
	tokensFor := func(t *testing.T, principal string, roles ...string) (string, *server.Tokens) {
		t.Helper()
		tok, line, err := server.NewTokenLine(principal, "acme", roles)
		require.NoError(t, err)
		data, err := json.Marshal(server.TokensFile{Tokens: []server.TokenEntry{line}})
		require.NoError(t, err)
		tokens, err := server.ParseTokens(data)
		require.NoError(t, err)
		return tok, tokens
	}
	status := func(t *testing.T, e *env, token string) int {
		t.Helper()
		return e.send(t, request{method: http.MethodGet, path: "/v1/runs",
			header: map[string][]string{"Authorization": {"Bearer " + token}}}).Status
	}
	t.Run("OK", func(t *testing.T) {
		e := newEnv(t, options{})
		require.Equal(t, http.StatusOK, status(t, e, e.tokens["alice"]))
		zed, tokens := tokensFor(t, "zed", "auditor")
		require.Equal(t, http.StatusUnauthorized, status(t, e, zed))

		require.NoError(t, e.srv.SetTokens(tokens))
		require.Equal(t, http.StatusUnauthorized, status(t, e, e.tokens["alice"]), "a token the new set lacks is revoked")
		require.Equal(t, http.StatusOK, status(t, e, zed), "a token the new set has is accepted")
	})
	t.Run("ErrNil", func(t *testing.T) {
		e := newEnv(t, options{})
		require.Error(t, e.srv.SetTokens(nil))
		require.Equal(t, http.StatusOK, status(t, e, e.tokens["alice"]), "the old set stays")
	})
	t.Run("ErrDevMode", func(t *testing.T) {
		e := newEnv(t, options{dev: true})
		_, tokens := tokensFor(t, "zed", "auditor")
		require.ErrorIs(t, e.srv.SetTokens(tokens), server.ErrDevMode)
		res := e.send(t, request{method: http.MethodGet, path: "/v1/runs"})
		require.Equal(t, http.StatusOK, res.Status, "still dev mode: no token needed")
	})
	// Requests authenticate while sets are swapped: each sees one whole
	// set (run with -race).
	t.Run("ConcurrentSwaps", func(t *testing.T) {
		e := newEnv(t, options{})
		zed, withZed := tokensFor(t, "zed", "auditor")
		_, withoutZed := tokensFor(t, "yan", "auditor")
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range 200 {
				set := withZed
				if i%2 == 1 {
					set = withoutZed
				}
				if err := e.srv.SetTokens(set); err != nil {
					panic(err)
				}
			}
		}()
		for range 50 {
			got := status(t, e, zed)
			require.Contains(t, []int{http.StatusOK, http.StatusUnauthorized}, got)
		}
		<-done
		require.NoError(t, e.srv.SetTokens(withZed))
		require.Equal(t, http.StatusOK, status(t, e, zed))
	})
}
