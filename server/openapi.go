package server

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/contracts"
)

// openAPISource is the OpenAPI 3.1 document of DESIGN.md section 6's
// table. A test holds its paths and the served routes equal.
//
//go:embed openapi.json
var openAPISource []byte

// openAPIDocument returns the document to serve: the embedded one with
// components.schemas.RunSubmission replaced by the contracts
// run_submission schema, so the two cannot drift.
func openAPIDocument() ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(openAPISource, &doc); err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	var sub map[string]any
	if err := json.Unmarshal(contracts.SchemaJSON(contracts.SchemaRunSubmission), &sub); err != nil {
		return nil, fmt.Errorf("openapi.json: run_submission schema: %w", err)
	}
	// The dialect is OpenAPI 3.1's default (2020-12) already, and an $id
	// would move the base URI of references inside the document.
	delete(sub, "$schema")
	delete(sub, "$id")
	comps, _ := doc["components"].(map[string]any)
	schemas, _ := comps["schemas"].(map[string]any)
	if schemas == nil {
		return nil, fmt.Errorf("openapi.json: no components.schemas")
	}
	schemas["RunSubmission"] = sub
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	return append(out, '\n'), nil
}

// openAPI is GET /v1/openapi.json; it needs no token.
func (s *Server) openAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, s.openapi)
}
