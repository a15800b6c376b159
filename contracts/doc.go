// Package contracts holds the versioned JSON Schemas (draft 2020-12) of
// everything the ledger accepts from or shows to the outside: run
// submissions, tool descriptors, approval rules, actions and the operator's
// config file. The schemas are embedded, compiled once at start-up and
// exposed raw (SchemaJSON) for the OpenAPI document. Validate checks a document against one of them; the
// Parse functions validate and then decode into the Go types of this
// package.
//
// Versions: every document carries schema_version "MAJOR.MINOR". This build
// reads major version SupportedMajor; any minor version of it is accepted,
// because minor versions only add what older readers may ignore. A document
// of another major version fails with ErrUnsupportedVersion before anything
// else is checked.
//
// Errors: a document that breaks its schema fails with a *ValidationError
// (errors.Is(err, ErrInvalid)) listing every offending location as a JSON
// Pointer, ready to be shown to the client.
//
// Duplicate keys and nesting depth are checked by the canonical JSON of
// package ledger before documents reach this package; the config file is
// the exception: ParseConfig and ParseConfigYAML list its duplicate keys
// with its other problems, each at its location.
//
// It imports nothing of the project, and it is the only package that imports
// the JSON Schema library and the YAML libraries.
package contracts
