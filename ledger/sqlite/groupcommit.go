package sqlite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// Group commit. Every write of the Store joins one queue. A write that
// finds nobody leading leads: it runs the writes queued at that moment (up
// to maxBatch), its own first, in ONE SQLite transaction, each inside its
// own SAVEPOINT: a write that fails is rolled back to its savepoint alone,
// the others commit together with one fsync. A write that finds a leader
// waits for its answer; when the leader's batch is committed and answered,
// the leader hands the lead to the first write still queued (queued while
// the batch ran), which runs the next batch with itself first, and
// returns. So a write alone costs what it did before — no savepoint, no
// hand-off to another goroutine — under concurrency the writes queued
// behind a commit share the next one, every leader runs one batch, the one
// that holds its own write, and a write answered by a batch returns at
// once, not after the next one. No caller is answered before the COMMIT
// that holds its write returns, so "durable before the next step" holds
// for each of them.

// maxBatch bounds how many writes share one commit.
const maxBatch = 64

// writeReq is one write waiting in the queue.
type writeReq struct {
	ctx  context.Context
	fn   func(ledger.Tx) error
	done chan error    // buffered: the leader never waits for the caller
	turn chan struct{} // buffered: the leader hands the lead on through it
}

// writer is the queue of writes and the lock of the writer connection.
type writer struct {
	running sync.Mutex // held while a batch runs (stopWriter waits for it)

	mu      sync.Mutex // guards queue, leading and closed
	queue   []*writeReq
	leading bool // a write is leading: it, or the one it hands on to, runs the queue
	closed  bool
}

func (s *Driver) startWriter() { s.wr = &writer{} }

// stopWriter refuses new writes and waits for the batch being run.
func (s *Driver) stopWriter() {
	if s.wr == nil {
		return
	}
	s.wr.mu.Lock()
	s.wr.closed = true
	pending := s.wr.queue
	s.wr.queue = nil
	s.wr.mu.Unlock()
	for _, r := range pending { // queued, never run
		r.done <- errClosed
	}
	s.wr.running.Lock() // the batch being run, if any, ends first
	defer s.wr.running.Unlock()
}

// write queues r and returns once a commit (its own batch or another
// leader's) has answered it.
func (s *Driver) write(r *writeReq) error {
	w := s.wr
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return errClosed
	}
	w.queue = append(w.queue, r)
	lead := !w.leading
	w.leading = true
	w.mu.Unlock()
	if !lead {
		select {
		case err := <-r.done: // in a batch another write led
			return err
		case <-r.turn: // handed the lead: r is first in the queue
		}
	}
	s.lead()
	return <-r.done
}

// lead runs the writes queued now (up to maxBatch), then hands the lead to
// the first write queued after them, or, if there is none, stops leading.
func (s *Driver) lead() {
	w := s.wr
	w.mu.Lock()
	n := min(len(w.queue), maxBatch)
	batch := w.queue[:n:n]
	w.queue = w.queue[n:]
	w.mu.Unlock()
	if n > 0 {
		w.running.Lock()
		s.runBatch(batch)
		w.running.Unlock()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) == 0 {
		w.leading = false
		return
	}
	w.queue[0].turn <- struct{}{}
}

// runBatch runs a batch in one transaction and answers every request once
// the outcome of the COMMIT is known.
func (s *Driver) runBatch(batch []*writeReq) {
	errs := make([]error, len(batch))
	first := s.numberWrites(len(batch)) // for fault plans (writefault.go)
	var began time.Time
	if s.onCommit != nil {
		began = s.clock()
	}
	err := s.transaction(func() error {
		if len(batch) == 1 {
			errs[0] = s.runOne(batch[0])
			if ferr := s.writeFault(first, ledger.WriteBeforeCommit); errs[0] == nil {
				errs[0] = ferr
			}
			return errs[0]
		}
		// One savepoint open at a time, released when its write is done,
		// rather than a stack of up to 64 open until the commit; the
		// journal SQLite keeps to roll back to it is in memory (temp_store,
		// sqlstore.go).
		for i, r := range batch {
			if err := s.execWriter(savepointSQL); err != nil {
				return err
			}
			errs[i] = s.runOne(r)
			if ferr := s.writeFault(first+int64(i), ledger.WriteBeforeCommit); errs[i] == nil {
				errs[i] = ferr
			}
			if errs[i] != nil {
				if err := s.execWriter(rollbackToSavepointSQL); err != nil {
					return err
				}
			}
			if err := s.execWriter(releaseSavepointSQL); err != nil {
				return err
			}
		}
		return nil
	})
	for i, r := range batch {
		_ = s.writeFault(first+int64(i), ledger.WriteAfterCommit) // it can only kill here
		switch {
		case errs[i] != nil:
			r.done <- errs[i]
		case err != nil: // the commit (or a savepoint) failed: nothing of the batch is written
			r.done <- err
		default:
			r.done <- nil
		}
	}
	if s.onCommit != nil {
		s.onCommit(ledger.CommitStats{Writes: len(batch), Duration: s.clock().Sub(began), Err: err})
	}
}

var (
	beginSQL               = declare(`BEGIN IMMEDIATE`)
	commitSQL              = declare(`COMMIT`)
	rollbackSQL            = declare(`ROLLBACK`)
	savepointSQL           = declare(`SAVEPOINT write`)
	rollbackToSavepointSQL = declare(`ROLLBACK TO write`)
	releaseSavepointSQL    = declare(`RELEASE write`)
)

// transaction runs fn in one transaction of the writer's connection:
// BEGIN IMMEDIATE, then COMMIT if fn returns nil, ROLLBACK otherwise or if
// the COMMIT fails (a COMMIT that failed busy leaves the transaction open;
// one that failed otherwise has rolled it back, and the ROLLBACK finds
// none). The statements are the connection's own, prepared at Open, run
// without a database/sql transaction: its Tx would cost a goroutine per
// transaction and per query, to watch a context the batch does not have
// (a caller that goes away must not roll back the others' writes; each
// write checks its own context before it starts).
func (s *Driver) transaction(fn func() error) error {
	if err := s.execWriter(beginSQL); err != nil {
		return err
	}
	if err := fn(); err != nil {
		_ = s.execWriter(rollbackSQL)
		return err
	}
	if err := s.execWriter(commitSQL); err != nil {
		_ = s.execWriter(rollbackSQL)
		return err
	}
	return nil
}

// execWriter runs a statement of the writer's connection that takes no
// arguments (the transaction's and the savepoints').
func (s *Driver) execWriter(st *stmt) error {
	_, err := s.ws[st.index].ExecContext(context.Background())
	return err
}

// runOne runs one write; a panic becomes its error, since the leader runs
// other callers' writes too.
func (s *Driver) runOne(r *writeReq) (err error) {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("write panicked: %v", p)
		}
	}()
	// The write's statements run without the caller's cancellation (checked
	// above, before the write starts): mattn/go-sqlite3 runs every
	// statement of a cancellable context on a goroutine of its own, to be
	// able to interrupt it, and that hand-off cost more than the statement.
	ctx := context.WithoutCancel(r.ctx)
	return r.fn(newTx(ctx, s.wg, s.wc, s.ws))
}

// errClosed answers writes to a closed store.
var errClosed = errors.New("store is closed")

// Write implements ledger.Driver: fn runs as one write, in a transaction
// (BEGIN IMMEDIATE), possibly shared with other writes through group
// commit, isolated from them by a savepoint. fn's error rolls back fn's
// changes; errors come out as *ledger.Error. Once queued, a write is
// waited for even if ctx ends, because it may already be committed; a
// write whose ctx ended before its batch began is not run.
func (s *Driver) Write(ctx context.Context, fn func(ledger.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return translate(err)
	}
	return translate(s.write(&writeReq{ctx: ctx, fn: fn, done: make(chan error, 1), turn: make(chan struct{}, 1)}))
}

// numberWrites reserves the numbers of the next n writes (fault plans).
func (s *Driver) numberWrites(n int) int64 {
	first := s.writes + 1
	s.writes += int64(n)
	return first
}

// writeFault calls the fault plan's hook for write n at p, if there is one.
func (s *Driver) writeFault(n int64, p ledger.WritePoint) error {
	if s.writeFaultFunc == nil {
		return nil
	}
	if err := s.writeFaultFunc(n, p); err != nil {
		return ledger.Errorf(ledger.CodeInternal, "write %d: %w", n, err)
	}
	return nil
}
