// Package mcpgw is the MCP gateway: one MCP server (ledger mcp over stdio,
// /mcp on ledger serve over streamable HTTP) in front of the MCP servers
// the config's mcp section lists (its upstreams), each client's tool call
// an action of the ledger, gated, recorded before the upstream is called
// and recoverable after a crash.
//
// Its rooms: lock.go (the confirmed tool definitions: a tool whose
// upstream definition is not the one confirmed is hidden), upstream.go
// (the connections to the upstreams, restarted with backoff), tool.go (an
// upstream tool as the engine's Tool, Querier and Canceller, by its
// profile), gateway.go (the front end: each tools/call translated onto the
// engine's one propose path, the wait for a person, the call, the answer)
// and state.go (the HMAC-protected request state a client hands back to
// join the action it waited for).
//
// It imports engine, ledger and contracts; cmd/ledger wires it, and
// server mounts its HTTP handler. Nothing here decides what an outcome
// means or whether a call needs a person: the engine and the ledger do.
package mcpgw
