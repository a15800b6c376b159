// Package httpupstream serves the simulator's tools over HTTP as http tools
// (executor http, docs/http-tools.md): a tool server to put behind the
// ledger's http tool executor in tests, demos and crash cells, whose write
// tool keeps its effects in the simulator's own EffectStore, so that
// counting them there proves, independently of the ledger, whether
// anything happened twice. It is a test and demo server, not a product
// tool.
//
// New builds the handler, with these routes (each POST, JSON in and out):
//
//   - /cards.write: simulator.Tool over simulator.CardsWriteDescriptor, its
//     Execute with the call's dedup key, fencing token, run, action and
//     attempt. It dedups by dedup key, and refuses a write whose fencing
//     token is lower than the highest its run's calls carried (409, effect
//     not_happened, code fenced).
//   - /cards.write/query: its Query, {"dedup_key"} → {"effect", "output"}.
//   - /cards.write/cancel: its Cancel, {"dedup_key"} → {"confirmed",
//     "detail"}.
//   - /cards.count: simulator.Tool over simulator.CardsCountDescriptor (a
//     read), its Execute.
//
// A tool's own failure is answered with a 4xx and a body that says its
// effect (the executor reads no body of a 5xx); a failure of the server
// (its effect store) is a 500, whose effect the executor takes as unknown.
// With Options.Token set, a request without that bearer token is refused
// (401) before any tool sees it.
//
// The simulator's Config applies as it does to the practice-cards agent,
// under the simulator's tool names: guarantees, fault plans and crash
// faults of "cards.write" configure /cards.write and what its query and
// cancel reach; the effects are recorded under those names too. Crash
// faults call the Config's CrashFunc, by default killing the process; a
// test gives one that panics with http.ErrAbortHandler to drop the
// connection instead (the effect kept, its answer lost).
//
// Its wire types are its own, not package httptool's: the tests of one
// against the other then check the contract, not a shared struct.
//
// It imports simulator, engine and ledger of this project.
package httpupstream
