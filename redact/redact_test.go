package redact_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/actionledger/ledger/redact"
	"github.com/stretchr/testify/require"
)

func newRedactor(t *testing.T) *redact.Redactor {
	t.Helper()
	r, err := redact.NewRedactor(testKey)
	require.NoError(t, err)
	return r
}

// testKey is a fixed key so markers are stable across runs.
var testKey = []byte("0123456789abcdef-test-key")

var markerRE = regexp.MustCompile(`\[redacted:[0-9a-f]{8}\]`)

func TestNewRedactor(t *testing.T) {
	t.Run("ShortKey", func(t *testing.T) {
		key := []byte("fifteen-bytes!!")
		r, err := redact.NewRedactor(key)
		require.Nil(t, r)
		require.ErrorIs(t, err, redact.ErrRedaction)
		require.NotContains(t, err.Error(), string(key))
	})
	t.Run("KeyCopied", func(t *testing.T) {
		key := []byte("0123456789abcdef")
		r, err := redact.NewRedactor(key)
		require.NoError(t, err)
		before := r.Marker("secret")
		key[0] = 'X'
		require.Equal(t, before, r.Marker("secret"))
	})
}

func TestRedactStringPatterns(t *testing.T) {
	r := newRedactor(t)
	m := r.Marker
	tests := []struct {
		name, in, want string
	}{
		{"sk- key", "key is sk-abcdefghijklmnopqrstuvwx here", "key is " + m("sk-abcdefghijklmnopqrstuvwx") + " here"},
		{"sk-proj key", "sk-proj-abcdefghij_klmnopqrstuv", m("sk-proj-abcdefghij_klmnopqrstuv")},
		{"short sk- is not a key", "sk-short", "sk-short"},
		{"inside a word is not a key", "task-abcdefghijklmnopqrstuvwxyz", "task-abcdefghijklmnopqrstuvwxyz"},
		{"AWS access key id", "id AKIAIOSFODNN7EXAMPLE.", "id " + m("AKIAIOSFODNN7EXAMPLE") + "."},
		{"GitHub token", "ghp_" + strings.Repeat("a1B2", 9), m("ghp_" + strings.Repeat("a1B2", 9))},
		{"GitHub fine-grained token", "github_pat_11ABCDEFG0123456789_abcdefghijkl", m("github_pat_11ABCDEFG0123456789_abcdefghijkl")},
		{"Slack bot token", "xoxb-1234567890-abcdefghij", m("xoxb-1234567890-abcdefghij")},
		{"Slack user token", "xoxp-1234567890-abcdefghij", m("xoxp-1234567890-abcdefghij")},
		{"Slack app token", "xoxa-1234567890-abcdefghij", m("xoxa-1234567890-abcdefghij")},
		{"Stripe key", "sk_live_abcdefghijklmnop1234", m("sk_live_abcdefghijklmnop1234")},
		{"Google API key", "AIza" + strings.Repeat("x", 35), m("AIza" + strings.Repeat("x", 35))},
		{"JWT", "eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl", m("eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl")},
		{"bearer token, only the token", "Authorization: Bearer abc.DEF-123_~+/=", "Authorization: Bearer " + m("abc.DEF-123_~+/=")},
		{"bearer any case", "bearer tok123", "bearer " + m("tok123")},
		{"basic credentials", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic " + m("dXNlcjpwYXNzd29yZA==")},
		{"password in URL, only the password", "postgres://app:s3cr3t@db.internal:5432/x", "postgres://app:" + m("s3cr3t") + "@db.internal:5432/x"},
		{"URL without password", "https://user@example.test/path", "https://user@example.test/path"},
		{"api_key=", "call with api_key=abc123&x=1", "call with api_key=" + m("abc123&x=1")},
		{"password:", `password: "hunter2"`, `password: "` + m("hunter2") + `"`},
		{"token=", "access_token=t0k", "access_token=" + m("t0k")},
		{"X-Api-Key header", "X-Api-Key: k3y", "X-Api-Key: " + m("k3y")},
		{"client secret", "client_secret=shh", "client_secret=" + m("shh")},
		{"prose about tokens is left alone", "token budget exceeded; 12 tokens used; secret_paths set", "token budget exceeded; 12 tokens used; secret_paths set"},
		{"private key block", "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----", m("-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----")},
		{"two secrets", "Bearer aaa and Bearer bbb", "Bearer " + m("aaa") + " and Bearer " + m("bbb")},
		{"overlapping patterns are one secret", "password=sk-abcdefghijklmnopqrstuvwx", "password=" + m("sk-abcdefghijklmnopqrstuvwx")},
		{"markers are left alone", "token=[redacted:0123abcd]", "token=[redacted:0123abcd]"},
		{"nothing to hide", "cards look right", "cards look right"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := r.RedactString(tt.in)
			require.Equal(t, tt.want, got)
			require.Equal(t, got, r.RedactString(got), "redacting twice changes nothing")
		})
	}
}

func TestRedactJSONSecretPaths(t *testing.T) {
	r := newRedactor(t)
	m := r.Marker
	doc := json.RawMessage(`{"title":"t","auth":{"user":"u","pin":1234,"nested":{"k":"v"}},"cards":[{"front":"f","back":"b0"},{"front":"g","back":"b1"}],"a/b":{"c~d":"x"},"n":null}`)
	tests := []struct {
		name  string
		paths []string
		want  string
	}{
		{"none", nil, `{"a/b":{"c~d":"x"},"auth":{"nested":{"k":"v"},"pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":null,"title":"t"}`},
		{"top-level string", []string{"/title"}, `{"a/b":{"c~d":"x"},"auth":{"nested":{"k":"v"},"pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":null,"title":"` + m("t") + `"}`},
		{"nested number", []string{"/auth/pin"}, `{"a/b":{"c~d":"x"},"auth":{"nested":{"k":"v"},"pin":"` + m("1234") + `","user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":null,"title":"t"}`},
		{"nested object", []string{"/auth/nested"}, `{"a/b":{"c~d":"x"},"auth":{"nested":"` + m(`{"k":"v"}`) + `","pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":null,"title":"t"}`},
		{"array element", []string{"/cards/1/back"}, `{"a/b":{"c~d":"x"},"auth":{"nested":{"k":"v"},"pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"` + m("b1") + `","front":"g"}],"n":null,"title":"t"}`},
		{"escaped tokens", []string{"/a~1b/c~0d"}, `{"a/b":{"c~d":"` + m("x") + `"},"auth":{"nested":{"k":"v"},"pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":null,"title":"t"}`},
		{"null", []string{"/n"}, `{"a/b":{"c~d":"x"},"auth":{"nested":{"k":"v"},"pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":"` + m("null") + `","title":"t"}`},
		{"missing paths change nothing", []string{"/nope", "/auth/nope/deeper", "/cards/7/back", "/cards/-", "/cards/01/back", "/title/x"}, `{"a/b":{"c~d":"x"},"auth":{"nested":{"k":"v"},"pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":null,"title":"t"}`},
		{"whole document", []string{""}, `"` + m(`{"a/b":{"c~d":"x"},"auth":{"nested":{"k":"v"},"pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":null,"title":"t"}`) + `"`},
		{"the same path twice", []string{"/title", "/title"}, `{"a/b":{"c~d":"x"},"auth":{"nested":{"k":"v"},"pin":1234,"user":"u"},"cards":[{"back":"b0","front":"f"},{"back":"b1","front":"g"}],"n":null,"title":"` + m("t") + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.RedactJSON(doc, tt.paths)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

func TestRedactJSONPatternsEverywhere(t *testing.T) {
	r := newRedactor(t)
	m := r.Marker
	doc := json.RawMessage(`{"note":"Bearer tok-1","list":["x","sk-abcdefghijklmnopqrstuvwx"],"password":"p","db_password":12,"apiKey":"k","tokens":5,"max_tokens":7,"headers":{"Authorization":"Basic whatever"},"sk-abcdefghijklmnopqrstuvwx":1,"big":123456789012345678901234567890,"html":"<b>&</b>"}`)
	got, err := r.RedactJSON(doc, nil)
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(got, &v))
	require.Equal(t, "Bearer "+m("tok-1"), v["note"])
	require.Equal(t, []any{"x", m("sk-abcdefghijklmnopqrstuvwx")}, v["list"])
	require.Equal(t, m("p"), v["password"], "a credential key hides any value")
	require.Equal(t, m("12"), v["db_password"])
	require.Equal(t, m("k"), v["apiKey"])
	require.EqualValues(t, 5, v["tokens"])
	require.EqualValues(t, 7, v["max_tokens"])
	require.Equal(t, map[string]any{"Authorization": m("Basic whatever")}, v["headers"])
	require.Contains(t, v, m("sk-abcdefghijklmnopqrstuvwx"), "keys are redacted too")
	require.Contains(t, string(got), `"big":123456789012345678901234567890`, "numbers keep their digits")
	require.Contains(t, string(got), `"html":"<b>&</b>"`, "no HTML escaping: text as recorded")

	t.Run("Empty", func(t *testing.T) {
		got, err := r.RedactJSON(nil, []string{"/a"})
		require.NoError(t, err)
		require.Nil(t, got)
	})
}

// TestRedactJSONRepeatedKeys: a Redactor remembers the object keys it has
// seen; what it remembers never changes what a document becomes, whether a
// key was seen before, was a secret, or came after the memory filled up.
func TestRedactJSONRepeatedKeys(t *testing.T) {
	docs := []string{
		`{"note":"Bearer tok-1","password":"p","tokens":5,"sk-abcdefghijklmnopqrstuvwx":1,"headers":{"Authorization":"Basic whatever"}}`,
		`{"password":{"nested":"kept"},"tokens":"sk-abcdefghijklmnopqrstuvwx","sk-abcdefghijklmnopqrstuvwx":"x"}`,
	}
	var many strings.Builder
	many.WriteString(`{`)
	for i := range 5000 {
		fmt.Fprintf(&many, `"key_%d":%d,`, i, i)
	}
	many.WriteString(`"password":"late","api_key":"k"}`)
	docs = append(docs, many.String(), docs[0], docs[1])

	r := newRedactor(t)
	for round := range 2 {
		for i, doc := range docs {
			got, changed, err := r.RedactJSONChanged(json.RawMessage(doc), nil)
			require.NoError(t, err)
			want, wantChanged, err := newRedactor(t).RedactJSONChanged(json.RawMessage(doc), nil)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got), "round %d, doc %d", round, i)
			require.Equal(t, wantChanged, changed, "round %d, doc %d", round, i)
		}
	}
}

func TestRedactJSONErrors(t *testing.T) {
	r := newRedactor(t)
	const secret = "sk-abcdefghijklmnopqrstuvwx"
	tests := []struct {
		name  string
		doc   string
		paths []string
	}{
		{"malformed JSON", `{"k": "` + secret + `"`, nil},
		{"garbage", `{"k": ` + secret + `}`, nil},
		{"trailing data", `{"k": 1} {"k": "` + secret + `"}`, nil},
		{"pointer without slash", `{"k": "` + secret + `"}`, []string{"k"}},
		{"pointer bad escape", `{"k": "` + secret + `"}`, []string{"/k~2"}},
		{"pointer trailing tilde", `{"k": "` + secret + `"}`, []string{"/k~"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.RedactJSON(json.RawMessage(tt.doc), tt.paths)
			require.ErrorIs(t, err, redact.ErrRedaction)
			require.Nil(t, got, "no partial or unredacted output")
			require.NotContains(t, err.Error(), secret)
			require.NotContains(t, err.Error(), string(testKey))
		})
	}
}

func TestRedactionCorrelation(t *testing.T) {
	r := newRedactor(t)
	a, b := r.Marker("secret-one"), r.Marker("secret-two")
	require.Regexp(t, `^\[redacted:[0-9a-f]{8}\]$`, a)
	require.Equal(t, a, r.Marker("secret-one"), "same secret, same marker")
	require.NotEqual(t, a, b, "different secrets, different markers")

	// The same secret at a secret path and as a bearer token in free text
	// gets the same marker, so a reader can tell they are one secret.
	args, err := r.RedactJSON(json.RawMessage(`{"key":"tok123","header":"Bearer tok123"}`), []string{"/key"})
	require.NoError(t, err)
	require.Equal(t, `{"header":"Bearer `+r.Marker("tok123")+`","key":"`+r.Marker("tok123")+`"}`, string(args))

	// Another key: other markers, and another key id.
	other, err := redact.NewRedactor([]byte("another-key-0123456789"))
	require.NoError(t, err)
	require.NotEqual(t, a, other.Marker("secret-one"))
	require.NotEqual(t, r.KeyID(), other.KeyID())
	require.Regexp(t, `^[0-9a-f]{8}$`, r.KeyID())

	// The key never shows.
	for _, s := range []string{a, b, r.KeyID(), r.RedactString("Bearer " + string(testKey))} {
		require.NotContains(t, s, string(testKey))
	}
	require.Len(t, markerRE.FindAllString(r.RedactString("Bearer "+string(testKey)), -1), 1)
}
