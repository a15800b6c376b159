// Package openapigen generates the component schemas of the HTTP API's
// OpenAPI document (server/openapi.json) from the server's wire types, so
// that the Go types the server encodes and the CLI decodes are the one
// source of both. The paths stay hand-written and refer to components
// only.
//
// Generate reflects every wire type with github.com/invopop/jsonschema
// (JSON Schema 2020-12, OpenAPI 3.1's dialect): a type's and a field's
// doc comment is its description, a field without omitempty is required,
// the jsonschema struct tags are constraints (an enum tag on a field of an
// enumerated type narrows its list), time.Time is a date-time,
// json.RawMessage any JSON, ledger.Digest a sha256 digest, and the
// ledger's enumerated types list their values from the ledger's own
// lists. A component used as a request body, and every component it
// refers to, is closed (additionalProperties false): the server refuses
// unknown fields. Components marked x-hand-written are kept as they are.
//
// `go generate ./server` runs cmd/openapigen; a test of the server runs
// Generate in memory and fails when the committed document differs.
package openapigen
