package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// sha256Field finds the sha256 values a tokens file names, to check that
// no error repeats one.
var sha256Field = regexp.MustCompile(`"sha256"\s*:\s*"([^"\\]{8,})"`)

// FuzzParseTokens: a tokens file is accepted only as JSON the ledger
// accepts, with every entry well formed; an accepted file round-trips
// (parse, write its entries, parse gives the same identities); a refusal
// names what is wrong and never repeats a hash from the file.
func FuzzParseTokens(f *testing.F) {
	hash, other := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	ok := `{"sha256":"` + hash + `","principal":"alice","tenant":"acme","roles":["approver"]}`
	for _, s := range []string{
		`{"tokens":[` + ok + `,{"sha256":"` + other + `","principal":"bob","tenant":"acme","roles":["submitter","auditor","submitter"]}]}`,
		`{"tokens":[]}`, `{}`, `{"tokens":null}`, `{"tokens":[],"extra":1}`, `{"tokens":[],"tokens":[]}`, `{"tokens":[]} {}`,
		`{"tokens":[` + ok + `,` + ok + `]}`,
		`{"tokens":[{"sha256":"` + strings.ToUpper(hash) + `","principal":"a","tenant":"t","roles":["admin"]}]}`,
		`{"tokens":[{"sha256":"` + hash + `","principal":"a\u0007","tenant":"t","roles":["admin"]}]}`,
		`{"tokens":[{"sha256":"` + hash + `","principal":" ","tenant":"t","roles":["admin"]}]}`,
		`{"tokens":[{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["root"]}]}`,
		`{"tokens":[{"sha256":"` + hash + `","principal":"a","tenant":"` + strings.Repeat("t", 129) + `","roles":["admin"]}]}`,
		`{"tokens":[{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":[]}]}`,
		`{"tokens":[{"sha256":"` + hash + `","principal":"a","tenant":"t","roles":["admin"],"token":"x"}]}`,
		`{"tokens":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tokens, err := ParseTokens(data)
		if err != nil {
			require.Nil(t, tokens)
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, "tokens file: ") && len(msg) > len("tokens file: "), "message %q", msg)
			for _, m := range sha256Field.FindAllSubmatch(data, -1) {
				if h := string(m[1]); strings.Count(string(data), h) == 1 {
					require.NotContains(t, msg, h, "the error repeats a hash of the file")
				}
			}
			return
		}
		require.NoError(t, ledger.CheckJSON(data))
		var file TokensFile
		for h, id := range tokens.byHash {
			require.True(t, hashPattern.MatchString(h), "hash %q", h)
			require.NotEmpty(t, strings.TrimSpace(id.Principal))
			require.NotEmpty(t, strings.TrimSpace(id.Tenant))
			require.NotEmpty(t, id.Roles)
			roles := make([]string, len(id.Roles))
			for i, r := range id.Roles {
				require.True(t, r.Valid(), "role %q", r)
				require.Equal(t, i, slices.Index(id.Roles, r), "role %q twice", r)
				roles[i] = string(r)
			}
			file.Tokens = append(file.Tokens, TokenEntry{SHA256: h, Principal: id.Principal, Tenant: id.Tenant, Roles: roles})
		}
		if file.Tokens == nil {
			file.Tokens = []TokenEntry{}
		}
		b, err := json.Marshal(file)
		require.NoError(t, err)
		back, err := ParseTokens(b)
		require.NoError(t, err, "tokens %s written as %s are refused", data, b)
		require.Equal(t, tokens.byHash, back.byHash)
	})
}

// token68Ref is the reference for a bearer token: RFC 7235's token68,
// letters, digits and -._~+/ then any number of '='.
func token68Ref(tok string) bool {
	i := 0
	for i < len(tok) && (tok[i] >= 'a' && tok[i] <= 'z' || tok[i] >= 'A' && tok[i] <= 'Z' || tok[i] >= '0' && tok[i] <= '9' ||
		strings.IndexByte("-._~+/", tok[i]) >= 0) {
		i++
	}
	if i == 0 {
		return false
	}
	for i < len(tok) && tok[i] == '=' {
		i++
	}
	return i == len(tok)
}

// FuzzBearer: the Authorization header parser takes exactly one header
// "Bearer <token68>" (scheme in any case, token of at most 512
// characters) and gives back the token; a refusal is a 401 that never
// repeats the token.
func FuzzBearer(f *testing.F) {
	for _, v := range []string{"Bearer lgr_abc-DEF_012", "bearer x", "BEARER a.b~c+d/e==", "Bearer ", "Bearer", "Basic dXNlcjpwYXNz",
		"Bearer a b", "Bearer =", "Bearer a=b", "Bearer " + strings.Repeat("t", 512), "Bearer " + strings.Repeat("t", 513),
		"Bearer  lgr_two_spaces", "Bearer lgr_é", "Bearer lgr\x00"} {
		f.Add(v, "", false)
	}
	f.Add("Bearer lgr_one", "Bearer lgr_two", true)
	f.Fuzz(func(t *testing.T, first, second string, two bool) {
		r := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
		r.Header["Authorization"] = []string{first}
		if two {
			r.Header["Authorization"] = append(r.Header["Authorization"], second)
		}
		tok, err := bearer(r)
		scheme, rest, cut := strings.Cut(first, " ")
		want := !two && cut && strings.EqualFold(scheme, "Bearer") && len(rest) <= maxTokenLength && token68Ref(rest)
		if !want {
			require.Error(t, err, "accepted %q", r.Header["Authorization"])
			p := requireClientError(t, fuzzServer(), &apiError{code: CodeUnauthorized, detail: err.Error()})
			require.Equal(t, http.StatusUnauthorized, p.Status)
			if cut && len(rest) >= 8 {
				require.NotContains(t, err.Error(), rest, "the error repeats the token")
			}
			return
		}
		require.NoError(t, err)
		require.Equal(t, rest, tok)
		again := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
		again.Header.Set("Authorization", "Bearer "+tok)
		back, err := bearer(again)
		require.NoError(t, err)
		require.Equal(t, tok, back)
	})
}
