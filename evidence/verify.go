package evidence

import (
	"context"
	"fmt"

	"github.com/actionledger/ledger/ledger"
)

// Verify recomputes the hash chain of run's events from the store and
// reports the first broken link: an event edited, removed or reordered, or
// a chain that stops short of the run's recorded head. A broken chain is
// not an error: the report says where it broke. Errors are the store's
// (ledger.ErrNotFound for an unknown run).
func Verify(ctx context.Context, store ledger.Store, run ledger.RunID) (ledger.ChainReport, error) {
	rep, err := store.VerifyChain(ctx, run)
	if err != nil {
		return ledger.ChainReport{}, fmt.Errorf("evidence: verify run %s: %w", run, err)
	}
	return rep, nil
}
