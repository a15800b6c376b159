package contracts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
		SchemaReport:            {"report.valid.json", []string{"actions", "observations", "recovery_decisions", "timeline"}},
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
