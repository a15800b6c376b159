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
// It imports ledger, contracts, approval, budget and recovery; never server.
package engine
