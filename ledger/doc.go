// Package ledger is the root of the action ledger: the domain types (runs,
// actions, attempts, approvals, cancellations, observations, budgets and
// events), their state machines, identities and digests, and the Store that
// keeps them durable.
//
// It imports nothing of the project except contracts. It is the only package
// that imports GORM: row structs, SQL and driver errors stay behind the Store
// interface, and every error leaving the package is a *Error with an
// ErrorCode.
//
// Every event of a run is hash-chained to its predecessor and carries the
// digests of the rows its write changed (content.go), so that a row edited
// behind the Store's back no longer matches the chain; a store given a
// signing key signs each run's chain head (signing.go).
//
// Newcomers start with states.go (the transition tables), store.go (the Store
// interface and what each method guarantees), then sqlstore.go.
package ledger
