// Command openapigen rewrites the components.schemas of the HTTP API's
// OpenAPI document from the server's wire types (package openapigen). It
// is what `go generate ./server` runs, in the server's directory:
//
//	openapigen -root .. -document openapi.json
package main
