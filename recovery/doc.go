// Package recovery decides what to do with actions whose outcome is
// uncertain — after a crash, a timeout or a cancel — using what each tool
// guarantees (query, dedup, cancel), and records every decision with its
// rationale. Decide is the pure decision table of docs/recovery.md; Scan
// applies it at start-up and on `ledger recover`; Resolve is a person
// settling a review.
//
// It imports ledger and contracts only; what it needs of tools it declares
// as small interfaces.
package recovery
