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
// Newcomers start with states.go (the transition tables), store.go (the Store
// interface and what each method guarantees), then sqlstore.go.
package ledger
