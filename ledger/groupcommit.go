package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"gorm.io/gorm"
)

// Group commit. Every write of the Store goes through one writer goroutine
// that takes the writes waiting at that moment (up to maxBatch) and runs
// them in ONE SQLite transaction, each inside its own SAVEPOINT: a write
// that fails is rolled back to its savepoint alone, the others commit
// together with one fsync. Alone, a write costs what it did before (no
// savepoint for a batch of one); under concurrency the fsyncs are shared.
// No caller is answered before the COMMIT that holds its write returns, so
// "durable before the next step" holds for each of them.

// maxBatch bounds how many writes share one commit.
const maxBatch = 64

// writeReq is one write waiting for the writer.
type writeReq struct {
	ctx  context.Context
	fn   func(tx *txn) error
	done chan error
}

// writer owns the writer connection's transactions.
type writer struct {
	reqs chan writeReq
	quit chan struct{}
	done chan struct{}
	stop sync.Once
}

func (s *GormStore) startWriter() {
	s.wr = &writer{reqs: make(chan writeReq), quit: make(chan struct{}), done: make(chan struct{})}
	go s.writeLoop()
}

// stopWriter lets the writer finish the batch it runs and return.
func (s *GormStore) stopWriter() {
	if s.wr == nil {
		return
	}
	s.wr.stop.Do(func() { close(s.wr.quit) })
	<-s.wr.done
}

func (s *GormStore) writeLoop() {
	defer close(s.wr.done)
	for {
		var first writeReq
		select {
		case first = <-s.wr.reqs:
		case <-s.wr.quit:
			return
		}
		batch := []writeReq{first}
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-s.wr.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		s.runBatch(batch)
	}
}

// runBatch runs a batch in one transaction and answers every request once
// the outcome of the COMMIT is known.
func (s *GormStore) runBatch(batch []writeReq) {
	errs := make([]error, len(batch))
	// The batch's context is none of its callers': a caller that goes away
	// must not roll back the others' writes. Each write still checks its
	// own context before it starts.
	err := s.w.WithContext(context.Background()).Transaction(func(db *gorm.DB) error {
		if len(batch) == 1 {
			errs[0] = s.runOne(batch[0], db)
			return errs[0]
		}
		for i, r := range batch {
			sp := "w" + strconv.Itoa(i)
			if err := db.SavePoint(sp).Error; err != nil {
				return err
			}
			if errs[i] = s.runOne(r, db); errs[i] != nil {
				if err := db.RollbackTo(sp).Error; err != nil {
					return err
				}
			}
		}
		return nil
	})
	for i, r := range batch {
		switch {
		case errs[i] != nil:
			r.done <- errs[i]
		case err != nil: // the commit (or a savepoint) failed: nothing of the batch is written
			r.done <- err
		default:
			r.done <- nil
		}
	}
}

// runOne runs one write; a panic becomes its error, not the writer's end.
func (s *GormStore) runOne(r writeReq, db *gorm.DB) (err error) {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("write panicked: %v", p)
		}
	}()
	sqlTx, ok := db.Statement.ConnPool.(*sql.Tx)
	if !ok {
		return fmt.Errorf("write: GORM transaction is a %T, not a *sql.Tx", db.Statement.ConnPool)
	}
	tx := &txn{db: db.WithContext(r.ctx), ctx: r.ctx, sql: sqlTx, stmts: s.ws, now: s.now(), newID: s.newID}
	if err := r.fn(tx); err != nil {
		return err
	}
	return tx.flushHeads()
}

// errClosed answers writes to a closed store.
var errClosed = errors.New("store is closed")

// inTx runs fn as one write: in a transaction (BEGIN IMMEDIATE on SQLite),
// possibly shared with other writes through group commit, isolated from
// them by a savepoint. fn's error rolls back fn's changes; errors come out
// as *Error. Once queued, a write is waited for even if ctx ends, because
// it may already be committed.
func (s *GormStore) inTx(ctx context.Context, op string, fn func(tx *txn) error) error {
	req := writeReq{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.wr.reqs <- req:
	case <-s.wr.quit:
		return wrapErr(op, errClosed)
	case <-ctx.Done():
		return wrapErr(op, ctx.Err())
	}
	if err := <-req.done; err != nil {
		return wrapErr(op, err)
	}
	return nil
}
