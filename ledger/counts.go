package ledger

import (
	"context"
)

// Counts is how many runs, actions, approvals and attempts the ledger
// holds, by state (attempts by status and effect fact), across every
// tenant, and how many runs' heads each signing key signed last. A state
// or key with no rows is absent from its map.
type Counts struct {
	Runs      map[RunState]int64
	Actions   map[ActionState]int64
	Approvals map[ApprovalState]int64
	Attempts  map[AttemptCountKey]int64
	// Signatures counts, by key id (SigningKeyID), the runs whose head's
	// newest signature is that key's: empty for a database no process
	// with a signing key ever wrote.
	Signatures map[string]int64
}

// AttemptCountKey is the pair attempts are counted by.
type AttemptCountKey struct {
	Status AttemptStatus
	Effect EffectFact
}

// CountByState implements Store: five counting queries in one read
// transaction, so the counts come from one snapshot, without loading rows.
func (s *DB) CountByState(ctx context.Context) (*Counts, error) {
	return read(ctx, s, "count_by_state", func(r Reader) (*Counts, error) { return r.CountByState(ctx) })
}
