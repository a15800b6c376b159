// Package perf holds the workloads of `ledger bench` and of the Go
// benchmarks: the raw commit floor, durable actions, the approval round
// trip, recovery of interrupted runs, evidence export, and the MCP
// gateway's read calls (an MCP upstream in the process, a proxy without
// ledger, the calls taking turns; the gateway itself is wired by the
// caller, as perf does not import mcpgw). Nothing in the product imports
// it but the CLI and benchmarks.
//
// Each workload is written once here and returns its errors; the callers
// decide what to do with them (a benchmark fails, the CLI reports). Where a
// workload runs long, it reports how far it got through a Progress.
package perf

// Progress receives a line of progress, printf style; nil means silence.
type Progress func(format string, args ...any)

func (p Progress) printf(format string, args ...any) {
	if p != nil {
		p(format, args...)
	}
}
