package contracts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// wholeValidate is validate without splitting: the whole document in one
// call of the library, as Validate did before split.go.
func wholeValidate(cs *compiledSchema, schema Schema, v any) error {
	if err := checkVersion(schema, v); err != nil {
		return err
	}
	if err := cs.schema.Validate(v); err != nil {
		return validationError(schema.String(), cs.doc, v, err, serverOwned[schema])
	}
	if issues := plainIntegers(cs.doc, v, ""); len(issues) > 0 {
		return &ValidationError{Subject: schema.String(), Issues: sortIssues(issues)}
	}
	return nil
}

// TestSplitValidationIsWholeValidation edits the valid report and fault
// matrix report everywhere (each value replaced by values of every JSON
// type, each object given an unknown field, each field removed, each
// array emptied) and requires the same verdict and the same issues from
// split validation as from validating the whole document.
func TestSplitValidationIsWholeValidation(t *testing.T) {
	cases := map[Schema]struct {
		file   string
		arrays []string
	}{
		SchemaReport:            {"report.valid.json", []string{"actions", "observations", "recovery_decisions", "rule_sets", "timeline"}},
		SchemaFaultMatrixReport: {"faultmatrix_report.valid.json", []string{"scenarios"}},
	}
	for schema, tc := range cases {
		t.Run(schema.String(), func(t *testing.T) {
			cs := compiled[schema]
			var names []string
			for _, a := range cs.arrays {
				names = append(names, a.name)
			}
			sort.Strings(names)
			require.Equal(t, tc.arrays, names, "the arrays split")

			raw, err := os.ReadFile(filepath.Join("testdata", tc.file))
			require.NoError(t, err)
			docs := 0
			for _, doc := range edits(t, raw) {
				v, err := decodeJSON(doc)
				require.NoError(t, err)
				want := wholeValidate(cs, schema, v)
				got := cs.validate(schema, v)
				require.Equal(t, want, got, "%s", doc)
				docs++
			}
			require.Greater(t, docs, 50)
		})
	}
	t.Run("not split", func(t *testing.T) {
		for _, schema := range []Schema{SchemaRunSubmission, SchemaToolDescriptor, SchemaRules, SchemaAction} {
			require.Empty(t, compiled[schema].arrays, "%s: no array of references", schema)
		}
	})
}

// edits returns doc (JSON), its arrays cut to their first two items,
// edited in every place but inside first items: each value replaced by one
// of every JSON type, each object given an unknown field and each field
// removed, each array emptied; and the document unedited.
func edits(t *testing.T, doc []byte) [][]byte {
	t.Helper()
	doc = cutArrays(t, doc, 2)
	replacements := []any{nil, json.Number("7"), json.Number("1.5"), "x", []any{}, map[string]any{}}
	var out [][]byte
	add := func(root any) {
		b, err := json.Marshal(root)
		require.NoError(t, err)
		out = append(out, b)
	}
	fresh := func() any {
		v, err := decodeJSON(doc)
		require.NoError(t, err)
		return v
	}
	add(fresh())
	var paths [][]string
	var walk func(v any, path []string)
	walk = func(v any, path []string) {
		paths = append(paths, slices.Clone(path))
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				walk(c, append(path, k))
			}
		case []any:
			for i, c := range x {
				walk(c, append(path, strconv.Itoa(i)))
			}
		}
	}
	walk(fresh(), nil)
	for _, path := range paths {
		if len(path) == 0 || slices.Contains(path[:len(path)-1], "0") {
			continue // inside the first item of an array: the second one stands for it
		}
		for _, r := range replacements {
			root := fresh()
			set(root, path, func(any) (any, bool) { return r, true })
			add(root)
		}
		root := fresh()
		set(root, path, func(any) (any, bool) { return nil, false }) // removed
		add(root)
		root = fresh()
		set(root, path, func(v any) (any, bool) {
			switch x := v.(type) {
			case map[string]any:
				x["unknown_field"] = "u"
			case []any:
				return []any{}, true
			}
			return v, true
		})
		add(root)
	}
	return out
}

// cutArrays returns doc with every array cut to its first n items, and
// every array of one item given a copy of it as a second.
func cutArrays(t *testing.T, doc []byte, n int) []byte {
	t.Helper()
	v, err := decodeJSON(doc)
	require.NoError(t, err)
	var cut func(v any) any
	cut = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				x[k] = cut(c)
			}
		case []any:
			x = x[:min(len(x), n)]
			if len(x) == 1 {
				x = append(x, x[0]) // a second item, for edits to stand in; the JSON text copies it
			}
			for i, c := range x {
				x[i] = cut(c)
			}
			return x
		}
		return v
	}
	out, err := json.Marshal(cut(v))
	require.NoError(t, err)
	return out
}

// set replaces the value at path below root with what f makes of it, or
// removes it from its object when f says so (in an array, it is kept).
func set(root any, path []string, f func(any) (any, bool)) {
	parent := root
	for _, tok := range path[:len(path)-1] {
		switch p := parent.(type) {
		case map[string]any:
			parent = p[tok]
		case []any:
			i, _ := strconv.Atoi(tok)
			parent = p[i]
		}
	}
	last := path[len(path)-1]
	switch p := parent.(type) {
	case map[string]any:
		if v, keep := f(p[last]); keep {
			p[last] = v
		} else {
			delete(p, last)
		}
	case []any:
		i, _ := strconv.Atoi(last)
		if v, keep := f(p[i]); keep {
			p[i] = v
		}
	}
}

// TestSplitArraysRefusesDynamicSchemas: a schema whose root or arrays use
// keywords that could see across the split is validated whole.
func TestSplitArraysRefusesDynamicSchemas(t *testing.T) {
	const id = "https://example.test/s.json"
	base := func(extra string) string {
		return `{"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "` + id + `", "type": "object",
			"properties": {"list": {"type": "array", "items": {"$ref": "#/$defs/item"}}}` + extra + `,
			"$defs": {"item": {"type": "integer"}}}`
	}
	tests := map[string]struct {
		schema string
		split  bool
	}{
		"simple":                     {base(``), true},
		"closed":                     {base(`, "additionalProperties": false, "required": ["list"]`), true},
		"root allOf":                 {base(`, "allOf": [{"properties": {"list": {"maxItems": 1}}}]`), false},
		"root if":                    {base(`, "if": {"required": ["list"]}, "then": {"required": ["x"]}`), false},
		"unevaluated somewhere":      {base(`, "unevaluatedProperties": false`), false},
		"additional properties rule": {base(`, "additionalProperties": {"type": "string"}`), false},
		"dynamic anchor":             {strings.Replace(base(``), `"type": "integer"`, `"$dynamicAnchor": "node", "type": "integer"`, 1), false},
		"array with limits":          {strings.Replace(base(``), `"type": "array",`, `"type": "array", "maxItems": 3,`, 1), false},
		"items not only a ref":       {strings.Replace(base(``), `{"$ref": "#/$defs/item"}`, `{"$ref": "#/$defs/item", "minimum": 1}`, 1), false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			c := newCompiler()
			require.NoError(t, c.AddResource(id, strings.NewReader(tt.schema)))
			_, err := c.Compile(id)
			require.NoError(t, err)
			root, err := decodeJSON([]byte(tt.schema))
			require.NoError(t, err)
			arrays, err := splitArrays(c, id, root.(map[string]any))
			require.NoError(t, err)
			require.Equal(t, tt.split, len(arrays) == 1)
		})
	}
}

// TestParallelItemsAreSequential validates reports whose timeline is long
// enough to be validated on several goroutines, with items broken at
// chunk edges and in between, and requires the issues (or the error) of
// validating the items one after another on the caller's goroutine, and
// of validating the whole document; no goroutine is left behind.
func TestParallelItemsAreSequential(t *testing.T) {
	defer goleak.VerifyNone(t)
	// Several workers even where the machine has one CPU.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0))))
	cs := compiled[SchemaReport]
	raw, err := os.ReadFile(filepath.Join("testdata", "report.valid.json"))
	require.NoError(t, err)
	const n = 4*chunkItems + 37
	require.GreaterOrEqual(t, n, parallelItems)

	// report is the valid report with n timeline events made from its
	// own, each edited by edit when it is one of at.
	report := func(edit func(map[string]any), at ...int) any {
		v, err := decodeJSON(raw)
		require.NoError(t, err)
		m := v.(map[string]any)
		events := m["timeline"].([]any)
		items := make([]any, n)
		for i := range items {
			src, err := json.Marshal(events[i%len(events)])
			require.NoError(t, err)
			ev, err := decodeJSON(src)
			require.NoError(t, err)
			ev.(map[string]any)["seq"] = json.Number(strconv.Itoa(i + 1))
			if slices.Contains(at, i) {
				edit(ev.(map[string]any))
			}
			items[i] = ev
		}
		m["timeline"] = items
		return m
	}
	sequential := func(v any) error {
		rest, parts := cs.split(v)
		var issues []Issue
		if err := cs.schema.Validate(rest); err != nil {
			is, err := issuesOf(SchemaReport.String(), cs.doc, rest, err, serverOwned[SchemaReport])
			require.NoError(t, err)
			issues = is
		}
		for _, p := range parts {
			is, err := p.itemIssues(SchemaReport.String(), 0, len(p.items))
			if err != nil {
				return err
			}
			issues = append(issues, is...)
		}
		if len(issues) > 0 {
			return &ValidationError{Subject: SchemaReport.String(), Issues: sortIssues(issues)}
		}
		return nil
	}
	edges := []int{0, 1, chunkItems - 1, chunkItems, 2*chunkItems + 5, n - 1}
	cases := map[string]any{
		"valid":   report(nil),
		"bad ids": report(func(e map[string]any) { e["id"] = "evt_x" }, edges...),
		"missing and unknown": report(func(e map[string]any) {
			delete(e, "hash")
			e["unknown_field"] = true
		}, edges...),
		"one at the end":   report(func(e map[string]any) { e["seq"] = json.Number("0") }, n-1),
		"one at the start": report(func(e map[string]any) { e["type"] = "" }, 0),
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			want := sequential(v)
			require.Equal(t, want, cs.validate(SchemaReport, v))
			require.Equal(t, wholeValidate(cs, SchemaReport, v), want)
			if name == "valid" {
				require.NoError(t, want)
			} else {
				require.ErrorIs(t, want, ErrInvalid)
			}
		})
	}
	// A value that is not JSON fails an item with an error, not issues:
	// the error is the lowest such item's, as validating in order finds it.
	t.Run("error of the lowest item", func(t *testing.T) {
		type lowest struct{}
		type higher struct{}
		v := report(nil)
		items := v.(map[string]any)["timeline"].([]any)
		items[chunkItems+9].(map[string]any)["actor"] = lowest{}
		for _, i := range []int{3*chunkItems + 2, n - 1} {
			items[i].(map[string]any)["actor"] = higher{}
		}
		items[2].(map[string]any)["id"] = "evt_x" // issues before it do not count
		want := sequential(v)
		require.Error(t, want)
		require.NotErrorIs(t, want, ErrInvalid)
		require.Contains(t, want.Error(), "contracts.lowest")
		require.Equal(t, want, cs.validate(SchemaReport, v))
	})
}
