// Package ledger is the root of the action ledger: the domain types (runs,
// actions, attempts, approvals, cancellations, observations, budgets and
// events), their state machines, identities and digests, and the Store that
// keeps them durable: DB, the ledger's rules (gating, budgets, effect facts,
// recovery writes, the event chain) written once over a storage Driver
// (driver.go). Drivers live in ledger/sqlite and ledger/postgres and only
// store and guard; there is no SQL in this package.
//
// It imports nothing of the project except contracts. Every error leaving
// the package is a *Error with an ErrorCode.
//
// Every event of a run is hash-chained to its predecessor and carries the
// digests of the rows its write changed (content.go), so that a row edited
// behind the Store's back no longer matches the chain; a store given a
// signing key signs each run's chain head (signing.go).
//
// Newcomers start with states.go (the transition tables), store.go (the Store
// interface and what each method guarantees), driver.go (the seam), then
// runs.go and actions.go.
package ledger
