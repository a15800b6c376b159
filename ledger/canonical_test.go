package ledger_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

func TestCanonicalize(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"keys sorted, whitespace dropped", `{ "b": 2, "a": [1, 2, {"d": true, "c": null}] }`, `{"a":[1,2,{"c":null,"d":true}],"b":2}`},
		// RFC 8785 section 3.2.2.3: numbers in ECMAScript form.
		{"large exponent", `[1e21, 1E+30]`, `[1e+21,1e+30]`},
		{"small fraction", `[0.000001, 1E-7]`, `[0.000001,1e-7]`},
		{"negative zero", `[-0]`, `[0]`},
		{"shortest round trip", `[333333333.33333329, 4.50]`, `[333333333.3333333,4.5]`},
		{"integral float", `[1.0, 100]`, `[1,100]`},
		// Keys sort by UTF-16 code units: U+20AC (0x20AC) before U+1F600
		// (surrogates 0xD83D…), though the latter's code point is larger.
		{"utf-16 key order", `{"😀":1,"€":2,"a":3}`, `{"a":3,"€":2,"😀":1}`},
		{"escapes", `["\u0041\n\u001f\"\\/"]`, `["A\n\u001f\"\\/"]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ledger.Canonicalize([]byte(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
		})
	}
}

func TestCheckJSON(t *testing.T) {
	deep := func(n int) []byte { return deepJSON(n) }
	deepArr := func(n int) []byte {
		s := ""
		for range n {
			s += "["
		}
		for range n {
			s += "]"
		}
		return []byte(s)
	}
	ok := map[string][]byte{
		"scalar":                      []byte(`"x"`),
		"depth 32":                    deep(32),
		"arrays 32":                   deepArr(32),
		"same key in sibling objects": []byte(`[{"a":1},{"a":2}]`),
	}
	for name, in := range ok {
		t.Run("OK "+name, func(t *testing.T) { require.NoError(t, ledger.CheckJSON(in)) })
	}
	bad := map[string][]byte{
		"duplicate key":        []byte(`{"a":1,"b":2,"a":1}`),
		"nested duplicate key": []byte(`{"x":{"a":1,"a":1}}`),
		"depth 33":             deep(33),
		"arrays 33":            deepArr(33),
		"truncated":            []byte(`{"a":`),
		"trailing data":        []byte(`{"a":1}x`),
		"two values":           []byte(`1 2`),
		"empty":                []byte(``),
		"not json":             []byte(`{a:1}`),
	}
	for name, in := range bad {
		t.Run("ErrInvalid "+name, func(t *testing.T) {
			err := ledger.CheckJSON(in)
			require.ErrorIs(t, err, ledger.ErrInvalid)
			_, err = ledger.DigestJSON(in)
			require.ErrorIs(t, err, ledger.ErrInvalid, "no digest of refused JSON")
		})
	}
}

func TestDigests(t *testing.T) {
	d, err := ledger.DigestJSON([]byte(`{"b":2, "a":1}`))
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(`{"a":1,"b":2}`))
	require.Equal(t, ledger.Digest("sha256:"+hex.EncodeToString(sum[:])), d)
	require.True(t, d.Valid())
	require.False(t, ledger.Digest("sha256:ABC").Valid())

	base := ledger.ActionDigestInput{Tool: "cards.write", ToolVersion: "1", Effect: ledger.EffectWrite,
		Arguments: json.RawMessage(`{"cards":[{"front":"q","back":"a"}]}`)}
	d1, err := ledger.ActionDigest(base)
	require.NoError(t, err)
	reordered := base
	reordered.Arguments = json.RawMessage(`{ "cards": [ {"back":"a", "front":"q"} ] }`)
	d2, err := ledger.ActionDigest(reordered)
	require.NoError(t, err)
	require.Equal(t, d1, d2, "formatting does not change the digest")
	// Changing any covered field changes the digest.
	for name, mut := range map[string]func(in *ledger.ActionDigestInput){
		"tool":      func(in *ledger.ActionDigestInput) { in.Tool = "cards.delete" },
		"version":   func(in *ledger.ActionDigestInput) { in.ToolVersion = "2" },
		"effect":    func(in *ledger.ActionDigestInput) { in.Effect = ledger.EffectRead },
		"arguments": func(in *ledger.ActionDigestInput) { in.Arguments = json.RawMessage(`{"cards":[]}`) },
	} {
		in := base
		mut(&in)
		d3, err := ledger.ActionDigest(in)
		require.NoError(t, err)
		require.NotEqual(t, d1, d3, name)
	}
}

func TestIDs(t *testing.T) {
	gen := ledger.NewULIDFunc(fixedNow)
	prev := ""
	for range 1000 {
		id := gen(ledger.PrefixAction)
		require.True(t, ledger.ValidID(ledger.PrefixAction, id), id)
		require.Greater(t, id, prev, "monotonic within a process, even in one millisecond")
		prev = id
	}
	require.False(t, ledger.ValidID(ledger.PrefixRun, prev), "prefix is checked")
	require.False(t, ledger.ValidID(ledger.PrefixRun, "run_nope"))
}

func fixedNow() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
