package server_test

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/server/internal/openapigen"
)

// TestOpenAPISchemasAreGenerated holds the committed openapi.json to what
// the wire types generate: its components.schemas come from the Go types
// (package openapigen), never from a hand edit.
func TestOpenAPISchemasAreGenerated(t *testing.T) {
	t.Parallel()
	committed, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	generated, err := openapigen.Generate(committed, "..")
	require.NoError(t, err)
	if !bytes.Equal(committed, generated) {
		c, g := strings.Split(string(committed), "\n"), strings.Split(string(generated), "\n")
		line := 0
		for line < len(c) && line < len(g) && c[line] == g[line] {
			line++
		}
		at := func(ls []string) string {
			if line < len(ls) {
				return ls[line]
			}
			return "(end of file)"
		}
		t.Fatalf("openapi.json is not what the wire types generate: run `go generate ./server`\n"+
			"first difference at line %d:\n  committed: %s\n  generated: %s", line+1, at(c), at(g))
	}
}

// TestOpenAPIBodiesAreComponents: every JSON body of every path and shared
// response is a reference to a component schema, so that no object schema
// escapes generation; other media types are plain strings.
func TestOpenAPIBodiesAreComponents(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	type content map[string]struct {
		Schema map[string]any `json:"schema"`
	}
	type body struct {
		Ref     string  `json:"$ref"`
		Content content `json:"content"`
	}
	var doc struct {
		Paths map[string]map[string]struct {
			RequestBody *body           `json:"requestBody"`
			Responses   map[string]body `json:"responses"`
		} `json:"paths"`
		Components struct {
			Responses map[string]body `json:"responses"`
			Schemas   map[string]any  `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))

	bodies := map[string]body{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if op.RequestBody != nil {
				bodies[method+" "+path+" request"] = *op.RequestBody
			}
			for status, r := range op.Responses {
				bodies[method+" "+path+" "+status] = r
			}
		}
	}
	for name, r := range doc.Components.Responses {
		bodies["components.responses."+name] = r
	}
	require.NotEmpty(t, bodies)
	for where, b := range bodies {
		if b.Ref != "" {
			require.True(t, strings.HasPrefix(b.Ref, "#/components/responses/"), where)
			continue
		}
		for media, c := range b.Content {
			if !strings.Contains(media, "json") {
				require.Equal(t, map[string]any{"type": "string"}, c.Schema, "%s %s", where, media)
				continue
			}
			require.Len(t, c.Schema, 1, "%s %s: a body is a $ref to a component, nothing else", where, media)
			ref, _ := c.Schema["$ref"].(string)
			name, ok := strings.CutPrefix(ref, "#/components/schemas/")
			require.True(t, ok, "%s %s: %v is no component", where, media, c.Schema)
			require.Contains(t, doc.Components.Schemas, name, "%s %s", where, media)
		}
	}
}

// TestOpenAPIHasEveryWireType: every exported struct type of the files of
// wire types is a component of the document, or excluded with a reason.
func TestOpenAPIHasEveryWireType(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	var doc struct {
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	fset := token.NewFileSet()
	var names []string
	for _, file := range []string{"api.go", "catalog.go"} {
		f, err := parser.ParseFile(fset, file, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				if _, isStruct := ts.Type.(*ast.StructType); isStruct && ts.Name.IsExported() {
					names = append(names, ts.Name.Name)
				}
			}
		}
	}
	require.Contains(t, names, "Run")
	for _, name := range names {
		if _, excluded := openapigen.Excluded[name]; excluded {
			require.NotContains(t, doc.Components.Schemas, name)
			continue
		}
		require.Contains(t, doc.Components.Schemas, name, "wire type %s is not generated: add it to openapigen.Roots", name)
	}
}
