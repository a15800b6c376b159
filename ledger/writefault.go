package ledger

// WritePoint is a moment of a store write where a fault plan may strike
// (Config.WriteFaultFunc).
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

// numberWrites numbers the writes of a batch about to run (called by the
// leader, which holds the writer lock) and returns the number of its first.
func (s *GormStore) numberWrites(n int) int64 {
	first := s.writes + 1
	s.writes += int64(n)
	return first
}

// writeFault calls the fault plan's hook, if there is one, for write n at
// p, and returns the failure it asks for as the write's error.
func (s *GormStore) writeFault(n int64, p WritePoint) error {
	if s.writeFaultFunc == nil {
		return nil
	}
	if err := s.writeFaultFunc(n, p); err != nil {
		return Errorf(CodeInternal, "write %d: %w", n, err)
	}
	return nil
}
