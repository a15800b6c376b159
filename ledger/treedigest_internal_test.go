package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// treeDigestGeneral is the general path the tree digest must agree with:
// decode, then digest each node with DigestOf over its children's
// digests.
func treeDigestGeneral(t *rapid.T, v any) Digest {
	var node any
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]string, len(x))
		for k, c := range x {
			m[k] = string(treeDigestGeneral(t, c))
		}
		node = m
	case []any:
		l := make([]string, len(x))
		for i, c := range x {
			l[i] = string(treeDigestGeneral(t, c))
		}
		node = l
	default:
		node = x
	}
	d, err := DigestOf(node)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// jsonValue draws a JSON document of a few levels.
func jsonValue(depth int) *rapid.Generator[any] {
	str := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.RuneFrom([]rune{'"', '\\', '/', '~', 0x01, 'é', '😀', '<'})))
	scalar := rapid.OneOf(
		rapid.Map(str, func(s string) any { return s }),
		rapid.Map(rapid.Int64(), func(n int64) any { return json.Number(fmt.Sprint(n)) }),
		rapid.Map(rapid.Float64Range(-1e6, 1e6), func(f float64) any { return json.Number(fmt.Sprint(f)) }),
		rapid.Just[any](true), rapid.Just[any](nil),
	)
	if depth == 0 {
		return scalar
	}
	return rapid.OneOf(scalar,
		rapid.Map(rapid.MapOfN(str, jsonValue(depth-1), 0, 4), func(m map[string]any) any { return m }),
		rapid.Map(rapid.SliceOfN(jsonValue(depth-1), 0, 4), func(l []any) any { return l }))
}

// pointers lists the RFC 6901 pointers of every node of v.
func pointers(v any, at string, out *[]string) {
	*out = append(*out, at)
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			pointers(x[k], at+"/"+strings.NewReplacer("~", "~0", "/", "~1").Replace(k), out)
		}
	case []any:
		for i, c := range x {
			pointers(c, fmt.Sprintf("%s/%d", at, i), out)
		}
	}
}

// hide replaces the node at pointer p of v with a marker and returns the
// document and the node.
func hide(v any, p string) (any, any) {
	if p == "" {
		return "[redacted:00000000]", v
	}
	tok, rest, more := strings.Cut(p[1:], "/")
	tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
	switch x := v.(type) {
	case map[string]any:
		c := make(map[string]any, len(x))
		for k, e := range x {
			c[k] = e
		}
		var node any
		if !more {
			c[tok], node = "[redacted:00000000]", x[tok]
		} else {
			c[tok], node = hide(x[tok], "/"+rest)
		}
		return c, node
	case []any:
		c := append([]any(nil), x...)
		var i int
		fmt.Sscan(tok, &i)
		var node any
		if !more {
			c[i], node = "[redacted:00000000]", x[i]
		} else {
			c[i], node = hide(x[i], "/"+rest)
		}
		return c, node
	}
	panic("no node at " + p)
}

// TestTreeDigest holds the one-pass tree digest to the general path, for
// documents as the ledger stores them (canonical) and as a report shows
// them (indented), and shows that hiding any node and giving its digest
// instead gives the document's digest, while a wrong one does not.
func TestTreeDigest(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := jsonValue(3).Draw(t, "doc")
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		canon, err := Canonicalize(raw)
		if err != nil {
			t.Skip("not a document the ledger takes:", err)
		}
		if string(canon) == "null" {
			if got := docDigest(canon); got != "" {
				t.Fatalf("docDigest(null) = %s, want none", got)
			}
			return
		}
		var decoded any
		d := json.NewDecoder(bytes.NewReader(canon))
		d.UseNumber()
		if err := d.Decode(&decoded); err != nil {
			t.Fatal(err)
		}
		want := treeDigestGeneral(t, decoded)
		if got := docDigest(canon); got != want {
			t.Fatalf("docDigest(%s) = %s, want %s", canon, got, want)
		}
		var indented bytes.Buffer
		if err := json.Indent(&indented, canon, "", "  "); err != nil {
			t.Fatal(err)
		}
		if got, err := DocDigest(indented.Bytes()); err != nil || got != want {
			t.Fatalf("DocDigest(indented %s) = %s, %v; want %s", canon, got, err, want)
		}

		var all []string
		pointers(decoded, "", &all)
		p := rapid.SampledFrom(all).Draw(t, "hidden")
		shown, node := hide(decoded, p)
		shownRaw, err := json.Marshal(shown)
		if err != nil {
			t.Fatal(err)
		}
		var checked []string
		check := func(ptr string, text []byte) error {
			checked = append(checked, ptr)
			if string(text) != `"[redacted:00000000]"` {
				return fmt.Errorf("hidden node %q shows %s", ptr, text)
			}
			return nil
		}
		got, err := HiddenDocDigest(shownRaw, map[string]Digest{p: treeDigestGeneral(t, node)}, check)
		if err != nil || got != want {
			t.Fatalf("HiddenDocDigest(%s, %q) = %s, %v; want %s", shownRaw, p, got, err, want)
		}
		if len(checked) != 1 || checked[0] != p {
			t.Fatalf("checked %q, want [%q]", checked, p)
		}
		if got, err := HiddenDocDigest(shownRaw, map[string]Digest{p: digestBytes(nil)}, nil); err == nil && got == want {
			t.Fatalf("a wrong digest for %q gave the document's digest", p)
		}
	})
}

func TestHiddenDocDigestErrors(t *testing.T) {
	d := digestBytes(nil)
	for name, tc := range map[string]struct {
		doc    string
		hidden map[string]Digest
		want   string
	}{
		"no such node":     {`{"a":1}`, map[string]Digest{"/b": d}, `no node at "/b"`},
		"bad digest":       {`{"a":1}`, map[string]Digest{"/a": "sha256:00"}, "is not sha256:<64 hex>"},
		"nothing shown":    {`null`, map[string]Digest{"": d}, "nothing is shown"},
		"malformed":        {`{"a":`, nil, "json"},
		"trailing data":    {`{"a":1} 2`, nil, "json"},
		"array index":      {`[1,2]`, map[string]Digest{"/2": d}, `no node at "/2"`},
		"escaped pointers": {`{"a/b":1,"c~d":2}`, map[string]Digest{"/a~1b": d, "/c~0d": d, "/x": d}, `no node at "/x"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := HiddenDocDigest(json.RawMessage(tc.doc), tc.hidden, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
