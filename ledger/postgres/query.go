package postgres

import (
	"context"
	"database/sql"
	"strings"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
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

// one scans the first row of q's answer into targets and reports whether
// there was one.
func (r *reader) one(ctx context.Context, q string, args []any, targets ...any) (bool, error) {
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
func all[T any](ctx context.Context, r *reader, q string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	rows, err := r.query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, r.fail(err)
	}
	return out, nil
}

// consistent runs fn, whose statements must read one snapshot, on r: in
// r's transaction, or on the pool in a read transaction of its own.
func (r *reader) consistent(ctx context.Context, fn func(*reader) error) error {
	if r.pool == nil {
		return fn(r)
	}
	return r.pool.snapshot(ctx, fn)
}

// where is the WHERE clause of a list query with optional filters.
type where struct {
	conds []string
	args  []any
}

// add adds the condition cond with its arguments.
func (w *where) add(cond string, args ...any) {
	w.conds = append(w.conds, cond)
	w.args = append(w.args, args...)
}

// query returns base with the WHERE clause, ORDER BY order and, if limit is
// positive, a LIMIT (as an argument, so it does not change the text).
func (w *where) query(base, order string, limit int) string {
	var b strings.Builder
	b.WriteString(base)
	for i, c := range w.conds {
		if i == 0 {
			b.WriteString(" WHERE ")
		} else {
			b.WriteString(" AND ")
		}
		b.WriteString(c)
	}
	b.WriteString(" ORDER BY ")
	b.WriteString(order)
	if limit > 0 {
		b.WriteString(" LIMIT ?")
		w.args = append(w.args, limit)
	}
	return b.String()
}
