package contracts

// The _meta keys of the MCP gateway's calls to an upstream and of the
// upstream's answers: a wire contract between the gateway (mcpgw) and any
// MCP server that wants to dedup, fence or report its effect
// (docs/mcp.md, "What the upstream receives").
const (
	// MCPMetaDedupKey (string) is the action's dedup key, the same for
	// every attempt of it.
	MCPMetaDedupKey = "io.actionledger/dedup_key"
	// MCPMetaFencingToken (a non-negative integer) is the run lease's
	// fencing token: it only grows from one holder of MCPMetaRun to the
	// next.
	MCPMetaFencingToken = "io.actionledger/fencing_token"
	// MCPMetaRun, MCPMetaAction (strings) and MCPMetaAttempt (a
	// non-negative integer) name the call in the ledger.
	MCPMetaRun     = "io.actionledger/run"
	MCPMetaAction  = "io.actionledger/action"
	MCPMetaAttempt = "io.actionledger/attempt"
	// MCPMetaEffect (string: happened, not_happened or unknown), in an
	// upstream's answer, is what the call did to the world.
	MCPMetaEffect = "io.actionledger/effect"
)
