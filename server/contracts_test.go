package server_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/server/servertest"
)

// contractOnly are the properties a contract may have that the API's
// component lacks, by JSON Pointer in the contract: schema_version, which a
// document at rest carries and an answer of the API does not.
var contractOnly = map[string]bool{"/properties/schema_version": true}

// TestComponentsAgreeWithContracts holds each component the API shares with
// a published contract (servertest.ContractComponents: the Action of
// contracts action.v1) to the same shape as the contract, at every level:
// the same properties, the same required ones, the same types and enums.
// The component is generated from the Go wire type and the contract is
// written by hand, so a field added to one alone fails here; servertest
// also checks every action an HTTP test receives against the contract.
func TestComponentsAgreeWithContracts(t *testing.T) {
	raw, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	var doc struct {
		Components struct {
			Schemas map[string]any `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.NotEmpty(t, servertest.ContractComponents)
	for name, contract := range servertest.ContractComponents {
		t.Run(name, func(t *testing.T) {
			var c map[string]any
			require.NoError(t, json.Unmarshal(contracts.SchemaJSON(contract), &c))
			component := doc.Components.Schemas[name]
			require.NotNil(t, component, "no components.schemas.%s", name)
			var problems []string
			agree(doc.Components.Schemas, component, c, "", &problems)
			require.Empty(t, problems, "components.schemas.%s and contracts %s differ", name, contract)
		})
	}
}

// agree compares the component schema a (its references resolved against
// schemas) with the contract schema b at the contract location at,
// collecting the differences.
func agree(schemas map[string]any, a, b any, at string, problems *[]string) {
	am, bm := resolve(schemas, a), b.(map[string]any)
	fail := func(format string, args ...any) {
		where := at
		if where == "" {
			where = "(root)"
		}
		*problems = append(*problems, where+": "+fmt.Sprintf(format, args...))
	}
	if ta, tb := typeOf(am), typeOf(bm); ta != "" && tb != "" && ta != tb {
		fail("type %s in the component, %s in the contract", ta, tb)
	}
	if ea, eb := strs(am["enum"]), strs(bm["enum"]); ea != nil && eb != nil && !slices.Equal(ea, eb) {
		fail("enum %v in the component, %v in the contract", ea, eb)
	}
	if ra, rb := strs(am["required"]), strs(bm["required"]); !slices.Equal(ra, rb) {
		fail("required %v in the component, %v in the contract", ra, rb)
	}
	pa, _ := am["properties"].(map[string]any)
	pb, _ := bm["properties"].(map[string]any)
	for _, p := range slices.Sorted(maps.Keys(pa)) {
		if pb[p] == nil {
			fail("property %s is in the component only", p)
			continue
		}
		agree(schemas, pa[p], pb[p], at+"/properties/"+p, problems)
	}
	for _, p := range slices.Sorted(maps.Keys(pb)) {
		if pa[p] == nil && !contractOnly[at+"/properties/"+p] {
			fail("property %s is in the contract only", p)
		}
	}
	if ia, ib := am["items"], bm["items"]; ia != nil || ib != nil {
		if ia == nil || ib == nil {
			fail("items in one of them only")
		} else {
			agree(schemas, ia, ib, at+"/items", problems)
		}
	}
}

// resolve follows a reference to a component schema.
func resolve(schemas map[string]any, s any) map[string]any {
	m, _ := s.(map[string]any)
	if ref, ok := m["$ref"].(string); ok {
		return resolve(schemas, schemas[strings.TrimPrefix(ref, "#/components/schemas/")])
	}
	return m
}

// typeOf is a schema's type, or "string" for an enum of strings alone.
func typeOf(m map[string]any) string {
	if t, ok := m["type"].(string); ok {
		return t
	}
	if e, ok := m["enum"].([]any); ok && len(e) > 0 {
		for _, v := range e {
			if _, ok := v.(string); !ok {
				return ""
			}
		}
		return "string"
	}
	return ""
}

// strs is a JSON array of strings, sorted; nil if v is none.
func strs(v any) []string {
	a, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(a))
	for _, x := range a {
		out = append(out, fmt.Sprint(x))
	}
	slices.Sort(out)
	return out
}
