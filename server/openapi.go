package server

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/contracts"
)

// openAPISource is the OpenAPI 3.1 document of the HTTP API. A test holds
// its operations and the served routes equal, and every answer of the HTTP
// tests is checked against the document served (package servertest).
//
//go:embed openapi.json
var openAPISource []byte

// openAPIDocument returns the document to serve: the embedded one with
// what has one source elsewhere filled in, so the two cannot drift:
//
//   - components.schemas.RunSubmission is the contracts run_submission
//     schema;
//   - components.schemas.EvidenceReport is the contracts report schema,
//     its $defs hoisted to components.schemas["EvidenceReport.<name>"]
//     (a reference inside a component resolves against the document);
//   - every GET operation but /mcp's gets its HEAD twin: the same
//     parameters, statuses and headers, no content;
//   - every operation takes the optional X-Request-ID header and every
//     answer carries it (components.parameters and components.headers
//     RequestID).
func openAPIDocument() ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(openAPISource, &doc); err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	comps, _ := doc["components"].(map[string]any)
	schemas, _ := comps["schemas"].(map[string]any)
	responses, _ := comps["responses"].(map[string]any)
	paths, _ := doc["paths"].(map[string]any)
	if schemas == nil || responses == nil || paths == nil {
		return nil, fmt.Errorf("openapi.json: no paths, components.schemas or components.responses")
	}
	sub, err := contractSchema(contracts.SchemaRunSubmission)
	if err != nil {
		return nil, err
	}
	schemas["RunSubmission"] = sub
	report, err := contractSchema(contracts.SchemaReport)
	if err != nil {
		return nil, err
	}
	if err := hoistDefs(schemas, "EvidenceReport", report); err != nil {
		return nil, err
	}
	if err := addHeadOperations(paths, responses); err != nil {
		return nil, err
	}
	addRequestID(paths, responses)
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	return append(out, '\n'), nil
}

// contractSchema returns a contracts schema as a component: without
// $schema (OpenAPI 3.1's dialect is 2020-12 already) and $id (which would
// move the base URI of references inside the document).
func contractSchema(s contracts.Schema) (map[string]any, error) {
	var m map[string]any
	if err := json.Unmarshal(contracts.SchemaJSON(s), &m); err != nil {
		return nil, fmt.Errorf("openapi.json: schema %s: %w", s, err)
	}
	delete(m, "$schema")
	delete(m, "$id")
	return m, nil
}

// hoistDefs makes schema the component name and its $defs the components
// name.<def>, rewriting "#/$defs/<def>" references to point at them.
func hoistDefs(schemas map[string]any, name string, schema map[string]any) error {
	defs, _ := schema["$defs"].(map[string]any)
	delete(schema, "$defs")
	var rewrite func(v any) error
	rewrite = func(v any) error {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				def, ok := strings.CutPrefix(ref, "#/$defs/")
				if !ok {
					return fmt.Errorf("openapi.json: %s: reference %q outside its $defs", name, ref)
				}
				x["$ref"] = "#/components/schemas/" + name + "." + def
			}
			for _, c := range x {
				if err := rewrite(c); err != nil {
					return err
				}
			}
		case []any:
			for _, c := range x {
				if err := rewrite(c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := rewrite(schema); err != nil {
		return err
	}
	schemas[name] = schema
	for def, s := range defs {
		if err := rewrite(s); err != nil {
			return err
		}
		schemas[name+"."+def] = s
	}
	return nil
}

// addHeadOperations gives every GET operation a HEAD twin (the router
// serves HEAD on every GET route): operationId <get's>Head, the same
// parameters, tags and security, and each response with its status,
// description and headers but no content. /mcp, the MCP gateway's
// endpoint, has none: its GET opens a stream of MCP messages.
func addHeadOperations(paths, components map[string]any) error {
	for path, item := range paths {
		ops, _ := item.(map[string]any)
		get, ok := ops["get"].(map[string]any)
		if !ok || path == mcpPath {
			continue
		}
		head := maps.Clone(get)
		head["operationId"] = fmt.Sprint(get["operationId"]) + "Head"
		head["summary"] = fmt.Sprint(get["summary"]) + " (headers only)"
		head["description"] = "GET " + path + "'s status and headers, without its body."
		getResponses, _ := get["responses"].(map[string]any)
		headResponses := map[string]any{}
		for status, r := range getResponses {
			resp, _ := r.(map[string]any)
			if ref, ok := resp["$ref"].(string); ok {
				name, _ := strings.CutPrefix(ref, "#/components/responses/")
				if resp, ok = components[name].(map[string]any); !ok {
					return fmt.Errorf("openapi.json: GET %s: response %s: no %s", path, status, ref)
				}
			}
			hr := map[string]any{"description": resp["description"]}
			if h, ok := resp["headers"].(map[string]any); ok {
				hr["headers"] = maps.Clone(h)
			}
			headResponses[status] = hr
		}
		head["responses"] = headResponses
		ops["head"] = head
	}
	return nil
}

// addRequestID documents X-Request-ID on every operation and answer.
func addRequestID(paths, components map[string]any) {
	param := map[string]any{"$ref": "#/components/parameters/RequestID"}
	header := map[string]any{"$ref": "#/components/headers/RequestID"}
	withHeader := func(resp map[string]any) {
		if _, isRef := resp["$ref"]; isRef {
			return // the component gets it
		}
		h, _ := resp["headers"].(map[string]any)
		if h == nil {
			h = map[string]any{}
			resp["headers"] = h
		}
		h[HeaderRequestID] = header
	}
	for _, item := range paths {
		ops, _ := item.(map[string]any)
		for _, method := range slices.Sorted(maps.Keys(ops)) {
			op, ok := ops[method].(map[string]any)
			if !ok || method == "parameters" {
				continue
			}
			params, _ := op["parameters"].([]any)
			op["parameters"] = append(slices.Clone(params), param)
			rs, _ := op["responses"].(map[string]any)
			for _, r := range rs {
				if resp, ok := r.(map[string]any); ok {
					withHeader(resp)
				}
			}
		}
	}
	for _, r := range components {
		if resp, ok := r.(map[string]any); ok {
			withHeader(resp)
		}
	}
}

// openAPI is GET /v1/openapi.json; it needs no token.
func (s *Server) openAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, s.openapi)
}
