package evidence

import (
	"bytes"
	"encoding/json"
	"testing"

	"pgregory.net/rapid"
)

// TestFlatValueIsDecoded holds flatValue to encoding/json with UseNumber:
// on flat objects of every kind of member, on ones with escapes, other
// bytes, white space, nesting and malformed numbers or literals, and on
// each of those cut short or with a byte changed, whatever flatValue
// decodes must decode the same with nothing after it, and what it refuses
// rawValue leaves to the decoder.
func TestFlatValueIsDecoded(t *testing.T) {
	fixed := []string{
		`{}`, `{"a":1}`, `{"a":"x","b":-0.5e+7,"c":true,"d":false,"e":null,"a":2}`, `{"":""}`,
		`{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":1e}`, `{"a":.5}`, `{"a":+1}`, `{"a":tru}`, `{"a":nul}`,
		`{"a":1,}`, `{,}`, `{"a"}`, `{"a":}`, `{"a":1}x`, `{"a":1} `, ` {"a":1}`, `{"a": 1}`, `{"a":[1]}`,
		`{"a":{}}`, `{"a":"\u0041"}`, `{"a":"é"}`, "{\"a\":\"\xff\"}", `{"a":1}{"b":2}`, `[]`, `"x"`, `1`,
		`{"a":1E400}`, `{"a":-0}`, `{"a":truex}`, `{"a":"x"`, `{"a"`, `{`,
	}
	check := func(t interface{ Fatalf(string, ...any) }, doc []byte) {
		got, ok := flatValue(doc)
		if !ok {
			return
		}
		d := json.NewDecoder(bytes.NewReader(doc))
		d.UseNumber()
		var want any
		if err := d.Decode(&want); err != nil || d.More() {
			t.Fatalf("flatValue decoded %q, which the decoder refuses (%v)", doc, err)
		}
		gotText, _ := json.Marshal(got)
		wantText, _ := json.Marshal(want)
		if !bytes.Equal(gotText, wantText) {
			t.Fatalf("flatValue(%q) = %s, decoder %s", doc, gotText, wantText)
		}
		if m, ok := want.(map[string]any); !ok || len(m) != len(got) {
			t.Fatalf("flatValue(%q): not the decoder's object", doc)
		}
		for k, v := range want.(map[string]any) {
			if g, ok := got[k]; !ok || g != v {
				t.Fatalf("flatValue(%q)[%q] = %#v, decoder %#v", doc, k, g, v)
			}
		}
	}
	for _, doc := range fixed {
		check(t, []byte(doc))
	}
	for _, doc := range []string{`{}`, `{"a":1}`, `{"a":"x","b":-0.5e+7,"c":true,"d":false,"e":null,"a":2}`} {
		if _, ok := flatValue([]byte(doc)); !ok {
			t.Fatalf("flatValue refuses %s", doc)
		}
	}
	key := rapid.StringOf(rapid.RuneFrom([]rune("abz_0 \"\\é\x01")))
	member := rapid.OneOf(
		rapid.Map(key, func(s string) any { return s }),
		rapid.Map(rapid.Int64(), func(n int64) any { return n }),
		rapid.Map(rapid.Float64(), func(f float64) any { return f }),
		rapid.Just[any](true), rapid.Just[any](false), rapid.Just[any](nil),
		rapid.Just[any](map[string]any{"n": 1}), rapid.Just[any]([]any{}),
	)
	rapid.Check(t, func(rt *rapid.T) {
		doc, err := json.Marshal(rapid.MapOfN(key, member, 0, 6).Draw(rt, "object"))
		if err != nil {
			rt.Fatalf("%v", err)
		}
		switch rapid.IntRange(0, 3).Draw(rt, "damage") {
		case 1:
			doc = doc[:rapid.IntRange(0, len(doc)).Draw(rt, "cut")]
		case 2:
			i := rapid.IntRange(0, len(doc)-1).Draw(rt, "at")
			doc[i] = rapid.SampledFrom([]byte("{}[]\",: -+.0123456789eEtrufalsn\\\xff")).Draw(rt, "byte")
		case 3:
			i := rapid.IntRange(0, len(doc)).Draw(rt, "at")
			doc = append(doc[:i:i], append([]byte(rapid.SampledFrom([]string{" ", "1", "-", ".", "e", ",", `"`, "}", "{"}).Draw(rt, "insert")), doc[i:]...)...)
		}
		check(rt, doc)
	})
}
