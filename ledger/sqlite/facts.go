package sqlite

import (
	"context"
	"database/sql"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// noLimit is SQLite's LIMIT for none.
const noLimit = -1

// snapshotQuery runs the shared reads (sqlrows) on db, one snapshot.
func snapshotQuery(db *gorm.DB) sqlrows.Query {
	return func(_ context.Context, query string, args ...any) (*sql.Rows, error) {
		return db.Raw(query, args...).Rows()
	}
}

// ListRecoveryFacts reads the facts and the unknown query and cancel
// observations about their attempts from one snapshot.
func (r reader) ListRecoveryFacts(ctx context.Context, f ledger.RecoveryFilter) ([]*ledger.RecoveryFacts, []*ledger.Observation, error) {
	var (
		facts []*ledger.RecoveryFacts
		obs   []*ledger.Observation
	)
	err := r.snapshot(ctx, func(db *gorm.DB) (err error) {
		facts, obs, err = sqlrows.ListRecoveryFacts(ctx, snapshotQuery(db), f, noLimit)
		return err
	})
	return facts, obs, translate(err)
}

// CountByState counts from one snapshot.
func (r reader) CountByState(ctx context.Context) (*ledger.Counts, error) {
	var out *ledger.Counts
	err := r.snapshot(ctx, func(db *gorm.DB) (err error) {
		out, err = sqlrows.CountByState(ctx, snapshotQuery(db))
		return err
	})
	if err != nil {
		return nil, translate(err)
	}
	return out, nil
}
