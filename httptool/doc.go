// Package httptool is the executor of http tools: tools the ledger calls
// itself over HTTP (executor http in the config file), for agents that have
// no process of their own to run them (driver llm) or that the engine
// drives in this process.
//
// New builds an engine.Tool from a tool descriptor and its endpoints
// (contracts.HTTPEndpoints). Each call of Execute POSTs the call's
// canonical arguments, dedup key, fencing token and attempt to the tool's
// url, and reads the tool's answer: {"status", "effect", "output",
// "error"}. Query and Cancel, which recovery calls with a dedup key, POST to
// query_url and cancel_url. docs/http-tools.md is the wire contract for
// tool authors.
//
// The mapping is conservative: only an answer body the tool wrote says a
// call did not take effect. A transport error, a timeout, a 5xx, a
// redirect, an answer over max_response_bytes or one that is not a valid
// answer leaves the effect unknown, and recovery then asks query_url (or
// cancels, or hands the action to a person) as the tool's guarantees
// allow. A read tool's calls never take effect, whatever happened to them.
//
// The bearer token (the value of the variable bearer_token_env names) is
// read once, by New; it is sent in the Authorization header only, and
// removed from any text of the tool's answer (an error message, the
// output) before the engine sees it. Nothing here logs.
//
// It imports engine, ledger and contracts of this project, and the standard
// library's net/http.
package httptool
