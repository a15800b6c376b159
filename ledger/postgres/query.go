package postgres

import (
	"context"
	"database/sql"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// txState is what a transaction remembers across its statements: the first
// statement that failed, after which PostgreSQL refuses every other
// statement of the transaction ("current transaction is aborted").
type txState struct {
	failed error
	// locked are the runs a write transaction holds the lock of, with
	// each one's chain head as the write has it, and runOf
	// the run of each row found by its own id there (locks.go); nil
	// outside a write.
	locked map[ledger.RunID]*chainHead
	runOf  map[entityKey]ledger.RunID
	// events are the write's events not inserted yet: InsertEvent keeps
	// them, and flushEvents inserts them in one statement before the
	// commit, or before the write reads events (tx.go).
	events []ledger.Event
}

// reader runs the driver's statements on the pool or in one transaction.
// The SQL is written with ? placeholders, which GORM turns into $1, $2, …;
// pgx prepares each statement text once per connection and reuses it.
type reader struct {
	db *gorm.DB
	// st is the transaction's state; nil on the pool.
	st *txState
	// pool is the driver, on the pool's reader only: a call that needs
	// several statements takes a snapshot of its own there.
	pool *Driver
}

// broken is the transaction's first failure, once there was one.
func (r *reader) broken() error {
	if r.st == nil || r.st.failed == nil {
		return nil
	}
	return wrapErr("an earlier statement of this transaction failed, which aborted it", r.st.failed)
}

// fail records err as the transaction's failure if it is the first, and
// returns it.
func (r *reader) fail(err error) error {
	if err != nil && r.st != nil && r.st.failed == nil {
		r.st.failed = err
	}
	return err
}

// query runs a statement that returns rows.
func (r *reader) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if err := r.broken(); err != nil {
		return nil, err
	}
	rows, err := r.db.WithContext(ctx).Raw(q, args...).Rows()
	if err != nil {
		return nil, r.fail(err)
	}
	return rows, nil
}

// exec runs a statement and returns how many rows it changed.
func (r *reader) exec(ctx context.Context, q string, args ...any) (int64, error) {
	if err := r.broken(); err != nil {
		return 0, err
	}
	res := r.db.WithContext(ctx).Exec(q, args...)
	if res.Error != nil {
		return 0, r.fail(res.Error)
	}
	return res.RowsAffected, nil
}

// read runs fn, one statement and the scan of its answer: on the pool,
// again once if its session ended (Driver.readAgain); in a transaction,
// once, since the transaction is what runs again (Driver.Write,
// Driver.snapshot).
func (r *reader) read(ctx context.Context, fn func() error) error {
	if r.pool == nil {
		return fn()
	}
	return r.pool.readAgain(ctx, fn)
}

// one scans the first row of q's answer into targets and reports whether
// there was one.
func (r *reader) one(ctx context.Context, q string, args []any, targets ...any) (found bool, err error) {
	err = r.read(ctx, func() (err error) {
		found, err = r.oneOnce(ctx, q, args, targets...)
		return err
	})
	return found, err
}

// oneOnce is one, run once.
func (r *reader) oneOnce(ctx context.Context, q string, args []any, targets ...any) (bool, error) {
	rows, err := r.query(ctx, q, args...)
	if err != nil {
		return false, err
	}
	defer func() { _ = rows.Close() }()
	if !rows.Next() {
		return false, r.fail(rows.Err())
	}
	if err := rows.Scan(targets...); err != nil {
		return false, err
	}
	return true, r.fail(rows.Close())
}

// get is one for a Get: no row is CodeNotFound, naming what.
func (r *reader) get(ctx context.Context, what, q string, args []any, targets ...any) error {
	found, err := r.one(ctx, q, args, targets...)
	if err == nil && !found {
		return notFound("%s not found", what)
	}
	return err
}

// all scans every row of q's answer with scan; no row is an empty slice.
// A failure of the rows themselves (not of scan) is the transaction's.
func all[T any](ctx context.Context, r *reader, q string, args []any, scan func(*sql.Rows) (T, error)) (out []T, err error) {
	err = r.read(ctx, func() (err error) {
		out, err = allOnce(ctx, r, q, args, scan)
		return err
	})
	return out, err
}

// allOnce is all, run once.
func allOnce[T any](ctx context.Context, r *reader, q string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	rows, err := r.query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	scanFailed := false
	out, err := sqlrows.ScanAll(rows, func(rows *sql.Rows) (T, error) {
		v, err := scan(rows)
		scanFailed = err != nil
		return v, err
	})
	if err != nil && !scanFailed {
		return nil, r.fail(err)
	}
	return out, err
}

// consistent runs fn, whose statements must read one snapshot, on r: in
// r's transaction, or on the pool in a read transaction of its own.
func (r *reader) consistent(ctx context.Context, fn func(*reader) error) error {
	if r.pool == nil {
		return fn(r)
	}
	return r.pool.snapshot(ctx, fn)
}
