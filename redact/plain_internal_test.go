package redact

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// requireSame requires RedactJSONChanged (which tries plain first) and the
// full path to agree on doc: the same output, change flag and failure.
func requireSame(t require.TestingT, r *Redactor, doc []byte) {
	if len(doc) == 0 {
		return // empty stays empty before either path
	}
	got, gotChanged, gotErr := r.RedactJSONChanged(doc, nil)
	w := walker{r: r}
	want, wantChanged, wantErr := w.redact(doc, nil)
	require.Equal(t, wantErr == nil, gotErr == nil, "%q: error %v, plain path error %v", doc, wantErr, gotErr)
	require.Equal(t, string(want), string(got), "%q", doc)
	require.Equal(t, wantChanged, gotChanged, "%q", doc)
}

// TestPlainIsRedactJSON: documents plain vouches for redact to themselves,
// and every document gets from RedactJSONChanged what the full path gives.
func TestPlainIsRedactJSON(t *testing.T) {
	r, err := NewRedactor([]byte("0123456789abcdef-test-key"))
	require.NoError(t, err)

	plainDocs := []string{
		`{"execution_us":800000,"steps":1,"tokens":1200,"tokens_unavailable":false}`,
		`{"a":[1,-0,0.5,-1.5e-3,2E+10,true,false,null,"x",{},[]],"b":{"c":"é 😀 <&>"}}`,
		`"just text"`, `42`, `null`, `[]`, `{}`, `"[redacted:0123abcd]"`,
	}
	for _, doc := range plainDocs {
		w := walker{r: r}
		require.True(t, w.plain([]byte(doc)), "%s", doc)
		requireSame(t, r, []byte(doc))
	}

	notPlain := []string{
		// Something to hide.
		`{"password":"hunter2"}`, `{"api_key":1}`, `{"note":"Bearer tok-1"}`, `["sk-abcdefghijklmnopqrstuvwx"]`,
		`{"sk-abcdefghijklmnopqrstuvwx":1}`, `{"password":{"inner":"kept"}}`, `"AKIAIOSFODNN7EXAMPLE"`,
		// Not in the form RedactJSON writes.
		`{"b":1,"a":2}`, `{"a":1,"a":2}`, `{"a": 1}`, ` {"a":1}`, `{"a":1} `, "{\"a\":1}\n", `{"a":"x\"y"}`,
		`{"a":"\u0041"}`, `{"a":"x\\y"}`, `"line\u2028sep"`, "\"raw\u2028sep\"", "\"bad \xff byte\"", "\"tab\there\"",
		// Not JSON at all.
		`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`, `{"a":+1}`, `{"a":tru}`, `{"a":nulll}`, `{"a":1,}`,
		`[1,]`, `{"a"}`, `{"a":1`, `[1`, `"open`, `{"a":1}{}`, `{a:1}`, `NaN`, `'x'`,
		strings.Repeat("[", maxPlainDepth+2) + strings.Repeat("]", maxPlainDepth+2),
	}
	for _, doc := range notPlain {
		w := walker{r: r}
		require.False(t, w.plain([]byte(doc)), "%s", doc)
		requireSame(t, r, []byte(doc))
	}

	t.Run("any document", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) {
			v := docGen(3).Draw(rt, "doc")
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(rapid.Bool().Draw(rt, "escape HTML"))
			if err := enc.Encode(v); err != nil {
				rt.Fatal(err)
			}
			doc := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
			switch rapid.IntRange(0, 3).Draw(rt, "damage") {
			case 1: // a byte changed
				if len(doc) > 0 {
					i := rapid.IntRange(0, len(doc)-1).Draw(rt, "at")
					doc[i] = rapid.SampledFrom([]byte(`{}[]",: \\01-.eE+tfnx`+"\xff\u2028")).Draw(rt, "byte")
				}
			case 2: // cut short
				doc = doc[:rapid.IntRange(0, len(doc)).Draw(rt, "length")]
			case 3: // indented
				var ind bytes.Buffer
				if err := json.Indent(&ind, doc, "", " "); err == nil {
					doc = ind.Bytes()
				}
			}
			requireSame(rt, r, doc)
		})
	})
}

// docGen generates JSON values whose keys and strings are often secrets,
// credential names or text needing escapes.
func docGen(depth int) *rapid.Generator[any] {
	text := rapid.OneOf(
		rapid.SampledFrom([]string{"", "a", "b", "steps", "tokens", "max_tokens", "password", "api_key", "X-Api-Key",
			"note", "Bearer tok-1", "sk-abcdefghijklmnopqrstuvwx", "[redacted:0123abcd]", "https://u:pw@host/x",
			"<b>&</b>", "quote\"d", "back\\slash", "new\nline", "\u2028", "é", "😀", "\x01", "\xff"}),
		rapid.String(),
	)
	scalar := rapid.OneOf(
		rapid.Just[any](nil),
		rapid.Map(rapid.Bool(), func(b bool) any { return b }),
		rapid.Map(rapid.SampledFrom([]string{"0", "-0", "1", "-12", "0.5", "1e3", "-1.5E-7", "123456789012345678901234567890"}),
			func(n string) any { return json.Number(n) }),
		rapid.Map(text, func(s string) any { return s }),
	)
	if depth == 0 {
		return scalar
	}
	inner := docGen(depth - 1)
	return rapid.OneOf(
		scalar,
		rapid.Map(rapid.SliceOfN(inner, 0, 3), func(xs []any) any { return xs }),
		rapid.Map(rapid.MapOfN(text, inner, 0, 4), func(m map[string]any) any { return m }),
	)
}
