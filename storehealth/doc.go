// Package storehealth tells whether the ledger's store is failing, from
// the store's own account of its operations: a Tracker is the store's
// observation hook (ledger.Options.Observe), so it sees every operation of
// every caller (the engine's workers, the approval service, the HTTP
// handlers) without wrapping the Store. It counts failures by operation
// (ledger_store_errors_total), knows whether writes fail now (/readyz),
// says when a probe write is due, wakes whoever backs off once writes
// succeed again, and logs both edges once per interval (FailureLog).
package storehealth
