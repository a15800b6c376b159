// Package mcpupstream serves the simulator's tools over the Model Context
// Protocol: an MCP server to put behind the ledger's MCP gateway in tests
// and demos, whose write tool keeps its effects in the simulator's own
// EffectStore, so that counting them there proves, independently of the
// ledger, whether anything happened twice. It is a test and demo upstream,
// not a product tool.
//
// New builds the server (the official Go SDK,
// github.com/modelcontextprotocol/go-sdk) with these tools:
//
//   - cards_write: simulator.Tool over simulator.CardsWriteDescriptor, its
//     Execute. The call's dedup key, fencing token, run, action and attempt
//     come from the request's _meta (MetaDedupKey and the other Meta*
//     keys); a call without a dedup key gets a fresh random one, so its
//     effect can never be queried or cancelled.
//   - cards_count: simulator.Tool over simulator.CardsCountDescriptor (a
//     read), its Execute.
//   - cards_status: cards_write's Query, {"dedup_key": …} →
//     {"effect": "happened"|"not_happened"|"unknown", "output": …}.
//   - cards_cancel: cards_write's Cancel, {"dedup_key": …} →
//     {"confirmed": bool, "detail": …}.
//
// With Options.Misbehaving it adds tools for the gateway's bad-input tests:
// huge_read, hang, exit_now and malformed.
//
// Every result, success or tool error, carries MetaEffect in its _meta:
// what the call did to the world as the simulator reports it (happened,
// not_happened or unknown). A tool error is a result with isError, a text
// content "CODE: message" and structuredContent {"code", "message"}; the
// server answers a JSON-RPC error only for what never reached a tool (an
// unknown tool name, a malformed request).
//
// The simulator's Config applies as it does to the practice-cards agent,
// under the simulator's tool names: the fault plan and overrides of
// "cards.write" configure cards_write (and what cards_status and
// cards_cancel reach), those of "cards.count" configure cards_count. The
// effects are recorded under those names too, so one effect store and one
// config serve the agent and this server alike.
//
// It imports simulator, engine and ledger of this project, and the MCP SDK.
package mcpupstream
