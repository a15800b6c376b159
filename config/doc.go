// Package config loads the operator's config file (ledger serve --config,
// docs/operations.md "The config file"): the tools agents may call, the
// agents runs may name, and optionally the approval rules, in YAML or JSON.
//
// Load reads a file and returns a typed Config whose names agree with each
// other and with the build (Builtins): a file that does not is refused with
// an *Error that lists every problem, each at its JSON Pointer. Defaults are
// applied here (a client tool's lease), so what Load returns is what the
// server runs with.
//
// The package imports only contracts and budget of the project: it knows
// the file, not the engine. The binary (cmd/ledger) turns a Config into the
// engine's agents and tools.
package config
