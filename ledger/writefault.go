package ledger

import "time"

// WritePoint is a moment of a store write where a fault plan may strike
// (a driver's WriteFaultFunc).
type WritePoint string

// Write points, in the order a write reaches them.
const (
	// WriteBeforeCommit: the write's statements ran in their transaction,
	// which is not committed yet; a crash here loses the write and every
	// other write of its commit.
	WriteBeforeCommit WritePoint = "before_commit"
	// WriteAfterCommit: the commit that holds the write returned, and its
	// caller has not been answered; a crash here keeps the write though no
	// caller ever heard of it.
	WriteAfterCommit WritePoint = "after_commit"
)

// WritePoints lists the write points in order.
func WritePoints() []WritePoint { return []WritePoint{WriteBeforeCommit, WriteAfterCommit} }

// CommitStats describe one commit of a driver (its OnCommit hook).
type CommitStats struct {
	// Writes is how many Store writes shared the transaction.
	Writes int
	// Duration is BEGIN to the end of COMMIT (or of the rollback).
	Duration time.Duration
	// Err is the transaction's own error (BEGIN, a savepoint or COMMIT
	// failed: none of its writes is durable); nil when it committed, even
	// if some of its writes failed alone and were rolled back to their
	// savepoints.
	Err error
}
