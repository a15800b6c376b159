package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
)

// Hot statements. Every tool call runs the same few statements (record the
// action, start and finish its attempt, append their events) and every
// engine step the same few reads. Through GORM each one is built by
// reflection and prepared anew by the driver: 40–80 µs of CPU apiece, which
// on a disk with fast fsyncs costs more than the commit itself. These are
// plain SQL, prepared once per connection with database/sql and scanned by
// hand; everything else stays on GORM.
//
// Writes: the writer has one connection, which the Driver holds from Open
// to Close and runs every transaction on (BEGIN IMMEDIATE … COMMIT are
// statements of it too, groupcommit.go), so write statements are declared
// up front (declare) and prepared on that connection when the Store opens.
// Reads: the pool has several connections; a read statement is prepared on
// first use and database/sql prepares it again on each connection that
// runs it.

// stmt is one write statement, prepared when the Store opens.
type stmt struct {
	sql   string
	index int
}

// declared lists every write statement in declaration order.
var declared []*stmt

// declare declared a statement the writer prepares at Open. Call it only
// from package-level variable declarations.
func declare(sql string) *stmt {
	s := &stmt{sql: sql, index: len(declared)}
	declared = append(declared, s)
	return s
}

// prepareWrites prepares every declared write statement on the writer's
// connection.
func prepareWrites(ctx context.Context, db *sql.Conn) ([]*sql.Stmt, error) {
	out := make([]*sql.Stmt, len(declared))
	for i, s := range declared {
		p, err := db.PrepareContext(ctx, s.sql)
		if err != nil {
			_ = closeStmts(out)
			return nil, fmt.Errorf("prepare %q: %w", s.sql, err)
		}
		out[i] = p
	}
	return out, nil
}

func closeStmts(stmts []*sql.Stmt) error {
	var errs []error
	for _, s := range stmts {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

// readStmts prepares read statements lazily, once per statement text.
type readStmts struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func (r *readStmts) get(ctx context.Context, query string) (*sql.Stmt, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.m[query]; ok {
		return s, nil
	}
	s, err := r.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if r.m == nil {
		r.m = map[string]*sql.Stmt{}
	}
	r.m[query] = s
	return s, nil
}

// query runs a read statement on the reader pool. The statements read a
// few indexed rows, so ctx is checked before and not during: mattn/go-sqlite3
// would run each step of a cancellable context on a goroutine of its own.
func (r *readStmts) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	s, err := r.get(ctx, query)
	if err != nil {
		return nil, err
	}
	return s.QueryContext(ctx, args...)
}

func (r *readStmts) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, s := range r.m {
		errs = append(errs, s.Close())
	}
	r.m = nil
	return errors.Join(errs...)
}
