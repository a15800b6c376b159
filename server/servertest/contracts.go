package servertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/actionledger/ledger/contracts"
)

// ContractComponents maps the component schemas of the document that a
// published contract also describes to that contract: every value an
// answer holds where the document refers to such a component is checked
// against the contract as well, so the contract cannot drift from the wire.
// (RunSubmission and EvidenceReport need no entry: the served document
// takes them from their contracts.)
var ContractComponents = map[string]contracts.Schema{
	"Action": contracts.SchemaAction,
}

const componentPrefix = "#/components/schemas/"

// checkContracts checks the JSON body against the contracts of the
// components its schema refers to (ContractComponents). A body that is not
// JSON is left to openapi3filter, which reports it.
func (v *Validator) checkContracts(schema *openapi3.SchemaRef, body []byte) error {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var value any
	if err := d.Decode(&value); err != nil {
		return nil
	}
	return v.walkContracts(schema, value, "")
}

// walkContracts follows value down its schema: properties, additional
// properties, items and allOf, and the oneOf and anyOf branches value
// matches. At a reference to a component in ContractComponents it checks
// value against the contract; loc is value's JSON Pointer in the body.
func (v *Validator) walkContracts(ref *openapi3.SchemaRef, value any, loc string) error {
	if ref == nil {
		return nil
	}
	if name, ok := strings.CutPrefix(ref.Ref, componentPrefix); ok {
		if contract, ok := ContractComponents[name]; ok {
			if err := contracts.ValidateValue(contract, value); err != nil {
				return fmt.Errorf("the value at %q (components.schemas.%s) breaks the %s contract: %w", loc, name, contract, err)
			}
		}
	}
	s := ref.Value
	if s == nil {
		return nil
	}
	for _, sub := range s.AllOf {
		if err := v.walkContracts(sub, value, loc); err != nil {
			return err
		}
	}
	for _, sub := range append(append(openapi3.SchemaRefs(nil), s.OneOf...), s.AnyOf...) {
		if sub.Value != nil && sub.Value.VisitJSON(floatNumbers(value), v.visitOptions()...) == nil {
			if err := v.walkContracts(sub, value, loc); err != nil {
				return err
			}
		}
	}
	switch x := value.(type) {
	case map[string]any:
		for name, field := range x {
			sub, ok := s.Properties[name]
			if !ok {
				sub = s.AdditionalProperties.Schema
			}
			if err := v.walkContracts(sub, field, loc+"/"+escapeToken(name)); err != nil {
				return err
			}
		}
	case []any:
		for i, item := range x {
			if err := v.walkContracts(s.Items, item, loc+"/"+strconv.Itoa(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// floatNumbers returns value with its json.Numbers as float64, the form
// kin-openapi validates.
func floatNumbers(value any) any {
	switch x := value.(type) {
	case json.Number:
		f, _ := x.Float64()
		return f
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = floatNumbers(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = floatNumbers(e)
		}
		return out
	}
	return value
}

// escapeToken escapes a JSON Pointer reference token (RFC 6901).
func escapeToken(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}
