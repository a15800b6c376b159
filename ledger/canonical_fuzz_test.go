package ledger_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// jsonSeeds are the documents every JSON fuzz target starts from: the
// contracts' example documents and the edge cases of the unit tests.
func jsonSeeds(f *testing.F) [][]byte {
	f.Helper()
	seeds := [][]byte{
		[]byte(`{ "b": 2, "a": [1, 2, {"d": true, "c": null}] }`),
		[]byte(`[1e21, 1E+30, 0.000001, 1E-7, -0, 333333333.33333329, 4.50, 1.0]`),
		[]byte(`{"😀":1,"€":2,"a":3}`),
		[]byte(`["\u0041\n\u001f\"\\/"]`),
		[]byte(`{"a":1,"b":2,"a":1}`),
		[]byte(`{"a":1,"\u0061":2}`),
		[]byte("{\"\xff\":1,\"\xfe\":2}"),
		[]byte(`[{"a":1},{"a":2}]`),
		[]byte(`{"a":`),
		[]byte(`{"a":1}x`),
		[]byte(`1 2`),
		[]byte(``),
		[]byte(`{a:1}`),
		[]byte(`1e400`),
		[]byte(`"\ud800"`),
		deepJSON(ledger.MaxJSONDepth),
		deepJSON(ledger.MaxJSONDepth + 1),
		[]byte(strings.Repeat("[", ledger.MaxJSONDepth) + strings.Repeat("]", ledger.MaxJSONDepth)),
		[]byte(strings.Repeat("[", ledger.MaxJSONDepth+1) + strings.Repeat("]", ledger.MaxJSONDepth+1)),
	}
	files, err := filepath.Glob(filepath.Join("..", "contracts", "testdata", "*.json"))
	require.NoError(f, err)
	require.NotEmpty(f, files, "the contracts' example documents are seeds")
	for _, name := range files {
		b, err := os.ReadFile(name)
		require.NoError(f, err)
		seeds = append(seeds, b)
	}
	return seeds
}

// refCheck is what CheckJSON must decide, worked out with encoding/json
// alone: valid JSON (json.Valid), then a walk of the decoder's tokens for
// nesting deeper than ledger.MaxJSONDepth and for a key that appears twice
// in one object once decoded (escapes resolved, invalid UTF-8 as U+FFFD).
// It returns why the document is refused, or "".
func refCheck(data []byte) string {
	if !json.Valid(data) {
		return "invalid"
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type level struct {
		object bool
		keys   map[string]bool
		key    bool // in an object, the next token is a key
	}
	var stack []*level
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return ""
		}
		if err != nil {
			return "invalid"
		}
		var top *level
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if k, ok := tok.(string); ok && top != nil && top.object && top.key {
			if top.keys[k] {
				return "duplicate key"
			}
			top.keys[k] = true
			top.key = false
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(stack) == ledger.MaxJSONDepth {
				return "too deep"
			}
			stack = append(stack, &level{object: tok == json.Delim('{'), keys: map[string]bool{}, key: true})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].key = true // a value ended: a key (or the end) comes next
		}
	}
}

// FuzzCheckJSON holds CheckJSON to the reference built on encoding/json:
// the same verdict on every input, and a refusal is always an invalid
// *ledger.Error that says what is wrong.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range jsonSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := ledger.CheckJSON(data)
		want := refCheck(data)
		if (err == nil) != (want == "") {
			t.Fatalf("CheckJSON(%q) = %v; encoding/json says %q", data, err, want)
		}
		if err == nil {
			return
		}
		var le *ledger.Error
		require.ErrorAs(t, err, &le)
		require.Equal(t, ledger.CodeInvalid, le.Code)
		require.True(t, strings.HasPrefix(err.Error(), "json: ") && len(err.Error()) > len("json: "), "message %q", err)
		switch want {
		case "duplicate key":
			require.Contains(t, err.Error(), "duplicate key")
		case "too deep":
			require.Contains(t, err.Error(), "nesting deeper than 32")
		}
	})
}

// FuzzCanonicalize holds Canonicalize to RFC 8785 as gowebpki/jcs does it
// and to what canonical form promises: it accepts exactly what CheckJSON
// accepts (and jcs can represent), its output is jcs's, is canonical
// again (a fixed point), means the same document as its input, and sorts
// every object's keys by UTF-16 code units.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range jsonSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := ledger.Canonicalize(data)
		if cerr := ledger.CheckJSON(data); cerr != nil {
			require.Error(t, err, "Canonicalize accepted what CheckJSON refuses: %v", cerr)
			require.ErrorIs(t, err, ledger.ErrInvalid)
			return
		}
		want, jerr := jcs.Transform(data)
		if jerr != nil {
			require.ErrorIs(t, err, ledger.ErrInvalid, "jcs refused %q (%v)", data, jerr)
			require.NotEmpty(t, err.Error())
			return
		}
		require.NoError(t, err)
		require.Equal(t, string(want), string(out), "the output is jcs's")
		again, err := ledger.Canonicalize(out)
		require.NoError(t, err, "canonical output %q is refused", out)
		require.Equal(t, string(out), string(again), "canonical form is a fixed point")

		var in, back any
		require.NoError(t, json.Unmarshal(data, &in))
		require.NoError(t, json.Unmarshal(out, &back))
		require.True(t, reflect.DeepEqual(in, back), "canonical form changed the document:\n in  %s\n out %s", data, out)
		requireSortedKeys(t, out)
	})
}

// requireSortedKeys checks that every object of doc lists its keys in
// increasing UTF-16 code unit order (RFC 8785 section 3.2.3).
func requireSortedKeys(t *testing.T, doc []byte) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	type level struct {
		object bool
		prev   []uint16
		first  bool
		key    bool
	}
	var stack []*level
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err)
		if s, ok := tok.(string); ok && len(stack) > 0 && stack[len(stack)-1].object && stack[len(stack)-1].key {
			l := stack[len(stack)-1]
			k := utf16.Encode([]rune(s))
			if !l.first {
				require.Negative(t, compareUTF16(l.prev, k), "keys out of order in %s", doc)
			}
			l.prev, l.first, l.key = k, false, false
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, &level{object: tok == json.Delim('{'), first: true, key: true})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].key = true
		}
	}
}

func compareUTF16(a, b []uint16) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return len(a) - len(b)
}

// FuzzActionDigest holds ActionDigest, which writes the canonical document
// around the arguments by hand, to the general path: encoding/json, then
// RFC 8785 (DigestOf). The one difference allowed is the depth limit:
// ActionDigest counts it in the arguments, DigestOf in the whole document.
func FuzzActionDigest(f *testing.F) {
	for _, s := range jsonSeeds(f) {
		f.Add("cards.write", "1", "write", s)
	}
	f.Add("é\x00\u2028<", "\xff", "read", []byte(`{"cards":[{"front":"q","back":"a"}]}`))
	f.Fuzz(func(t *testing.T, tool, version, effect string, args []byte) {
		in := ledger.ActionDigestInput{Tool: tool, ToolVersion: version, Effect: ledger.Effect(effect), Arguments: args}
		got, err := ledger.ActionDigest(in)
		want, werr := ledger.DigestOf(in)
		if err != nil {
			require.ErrorIs(t, err, ledger.ErrInvalid)
			if len(args) > 0 && ledger.CheckJSON(args) == nil {
				_, jerr := jcs.Transform(args)
				require.Error(t, jerr, "ActionDigest refused arguments that are valid and canonicalizable: %v", err)
			}
			return
		}
		require.True(t, got.Valid(), "digest %q", got)
		if werr != nil {
			require.Equal(t, ledger.MaxJSONDepth, depthOf(args), "only arguments exactly at the depth limit may differ: %v", werr)
			return
		}
		require.Equal(t, want, got)
	})
}

// depthOf is the deepest nesting of objects and arrays in valid JSON.
func depthOf(doc []byte) int {
	dec := json.NewDecoder(bytes.NewReader(doc))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			deepest = max(deepest, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}
