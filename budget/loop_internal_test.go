package budget

import (
	"encoding/json"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"pgregory.net/rapid"
)

// TestFingerprintIsDigestOfPair holds Fingerprint's directly written pair
// to the general path: the digest of the canonical JSON of the struct
// {"tool", "arguments"}, for any tool name and any arguments, whitespace,
// key order and number spelling included.
func TestFingerprintIsDigestOfPair(t *testing.T) {
	type pair struct {
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}
	leaf := rapid.OneOf(
		rapid.Map(rapid.String(), func(s string) any { return s }),
		rapid.Map(rapid.Float64Range(-1e6, 1e6), func(f float64) any { return f }),
		rapid.Map(rapid.Int64(), func(n int64) any { return n }),
		rapid.Map(rapid.Bool(), func(b bool) any { return b }),
		rapid.Just[any](nil),
	)
	rapid.Check(t, func(t *rapid.T) {
		tool := rapid.OneOf(rapid.String(), rapid.StringMatching(`[a-z]+\.[a-z]+`)).Filter(func(s string) bool { return s != "" }).Draw(t, "tool")
		var args any = rapid.MapOf(rapid.String(), leaf).Draw(t, "args")
		if rapid.Bool().Draw(t, "array") {
			args = rapid.SliceOf(leaf).Draw(t, "items")
		}
		raw, err := json.MarshalIndent(args, "", rapid.SampledFrom([]string{"", " ", "\t"}).Draw(t, "indent"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := Fingerprint(tool, raw)
		if err != nil {
			t.Fatal(err)
		}
		canon, err := ledger.Canonicalize(raw)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ledger.DigestOf(pair{Tool: tool, Arguments: canon})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("Fingerprint(%q, %s) = %s, the general path gives %s", tool, raw, got, want)
		}
	})
}
