// Package engine drives runs: model step → action recorded → rules → wait for
// approval → attempt recorded durably → tool called with the dedup key →
// outcome and effect recorded → next model step → final answer.
//
// It defines the interfaces real providers and tools implement (Model, Tool,
// and the optional Querier and Canceller) and a worker pool that claims the
// leases of runnable runs from the Store, so an approval given later, or by
// another process, resumes a run without any goroutine waiting for it, and
// several processes on one database never advance the same run at once
// (runleases.go).
//
// Its rooms: engine.go (Config, New), registry.go (agents and tools),
// propose.go (the one way a proposed tool call becomes an action, for every
// front end), builtin.go (the built-in agents' front end: the stepper),
// protocol_calls.go, protocol_recovery.go and protocol_sweep.go (the agent
// protocol's front end), call.go (an attempt of a tool the engine runs),
// cancel.go, recoverscan.go, pool.go and runleases.go (the workers),
// faults.go. A new front end translates its wire format into a proposal
// (propose.go) and, where the ledger runs the tools, uses call.go.
//
// It imports ledger, contracts, approval, budget and recovery; never server.
package engine
