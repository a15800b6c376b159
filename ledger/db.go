package ledger

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"
)

// Options are the ledger's own settings, whatever the driver.
type Options struct {
	// Now is the clock; nil means time.Now. Times are kept in UTC with
	// microsecond precision.
	Now func() time.Time
	// NewID makes identifiers; nil means prefixed monotonic ULIDs.
	NewID NewIDFunc
	// SigningKey, if set, signs each run's chain head whenever a write
	// moves it (signing.go). It stays in memory: never stored or logged.
	SigningKey ed25519.PrivateKey
	// Observe, if set, is told of every operation of the Store once it has
	// ended (Op): its name, write or read, its error and whether a write
	// changed anything. The store's own runners call it, once per call
	// that reaches the driver (DB.inTx and DB.planned for writes, read and
	// readSnapshot for reads), so every method is observed, whatever
	// wraps the Store. It runs on the caller's goroutine: keep it quick,
	// and do not call the Store from it. Store health (storehealth) is fed
	// by it.
	Observe ObserveFunc
}

// DB is the Store: the ledger's rules over a Driver. Every write is one
// Driver.Write; every read of several rows that must agree is one
// Driver.Read.
type DB struct {
	d      Driver
	now    func() time.Time
	newID  NewIDFunc
	signer *signer
	// observer is Options.Observe.
	observer ObserveFunc
}

var _ Store = (*DB)(nil)

// New returns the Store over d, which it closes on Close.
func New(d Driver, o Options) (*DB, error) {
	if d == nil {
		return nil, Errorf(CodeInvalid, "open store: no driver")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	clock := o.Now
	now := func() time.Time { return clock().UTC().Truncate(time.Microsecond) }
	if o.NewID == nil {
		o.NewID = NewULIDFunc(now)
	}
	sign, err := newSigner(o.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return &DB{d: d, now: now, newID: o.NewID, signer: sign, observer: o.Observe}, nil
}

// Driver is the driver the Store writes through.
func (s *DB) Driver() Driver { return s.d }

// Close closes the driver.
func (s *DB) Close() error { return s.d.Close() }

// CurrentSchemaVersion returns the schema version recorded in the database.
func (s *DB) CurrentSchemaVersion(ctx context.Context) (int, error) { return s.d.SchemaVersion(ctx) }

// LatestSchemaVersion is the schema version the driver of this build writes.
func (s *DB) LatestSchemaVersion() int { return s.d.LatestSchemaVersion() }

// txn is one write: the driver's transaction, one "now" for every row and
// event it writes, and the id generator.
//
// A write comes in one of two modes, and every rule path must know which
// it runs in:
//
//   - Immediate (DB.inTx): fn runs inside the driver's transaction, on
//     the writer. It may read (tx.d's Get, List and Count operations) and
//     decide on what it read; its statements run as it makes them. Every
//     rule that reads the database before it writes runs this way: submit,
//     gating, approvals, attempts, observations, cancellations, budgets,
//     leases.
//   - Planned (DB.planned): fn runs before the transaction, on the
//     caller's goroutine, with tx.d nil. It must not read: tx.write keeps
//     each statement, and the driver runs them in order as one write.
//     Only a write whose every decision was made on rows read earlier,
//     and whose every statement is guarded on the version it read (a lost
//     guard is CodeConflict and nothing of the write lands), may be
//     planned. Today that is RecordRecovery with complete facts
//     (RecordRecoveryParams.plannable).
//
// Code shared by both modes writes through tx.write and takes the rows it
// needs from what the write holds (tx.known, tx.heads) first; it falls
// back to reading tx.d only in an immediate write.
type txn struct {
	ctx   context.Context
	d     Tx
	now   time.Time
	newID NewIDFunc
	// heads caches the chain heads this write moved; flushHeads writes
	// them to the runs once the write is done (events.go), signed by
	// signer if there is one.
	heads  map[RunID]*chainHead
	signer *signer
	// known, if set, are rows the write changes in memory and writes once
	// at its end (knownrows.go); only RecordRecovery sets it.
	known *knownRows
	// ops, if set, is where the write's statements go instead of to d,
	// which is nil then: a write planned before it reaches the driver
	// (planned).
	ops *[]func(Tx) error
	// fence is the run lease the write's context carries (WithRunLease):
	// the move of that run's head is guarded on its token.
	fence *RunLease
	// wrote is set once the write changes the database: an event appended
	// (appendEvent) or a row outside the chains written (whoever writes
	// one sets it). It is what Op.Wrote reports.
	wrote bool
}

// write runs op on the driver's transaction now or, in a planned write,
// keeps it for when the plan runs.
func (tx *txn) write(op func(Tx) error) error {
	if tx.ops != nil {
		*tx.ops = append(*tx.ops, op)
		return nil
	}
	return op(tx.d)
}

// inTx runs fn as one write of the driver, then moves the chain heads its
// events moved, the head of the run whose lease ctx carries guarded on the
// lease's token (runleases.go). It is one operation of the Store, op (the
// method's name in snake case, Op.Name), told to the observer; errors come
// out as *Error with op as context.
func (s *DB) inTx(ctx context.Context, op string, fn func(tx *txn) error) error {
	return s.inTxIf(ctx, op, nil, fn)
}

// inTxIf is inTx for a write that is often not needed: needed, if set,
// first asks the driver's reader, without taking the writer, and the
// operation ends there, having written nothing, unless it says true.
func (s *DB) inTxIf(ctx context.Context, op string, needed func(Reader) (bool, error), fn func(tx *txn) error) error {
	if needed != nil {
		if ok, err := needed(s.d.Reader()); err != nil || !ok {
			return s.observe(ctx, op, true, err, false)
		}
	}
	wrote := false
	err := s.d.Write(ctx, func(d Tx) error {
		wrote = false // a driver may run fn again
		tx := &txn{ctx: ctx, d: d, now: s.now(), newID: s.newID, signer: s.signer}
		if l, ok := RunLeaseFrom(ctx); ok {
			tx.fence = &l
		}
		if err := fn(tx); err != nil {
			return err
		}
		if err := tx.flushHeads(); err != nil {
			return err
		}
		wrote = tx.wrote
		return nil
	})
	return s.observe(ctx, op, true, err, wrote)
}

// planned is inTx for a write that reads nothing from the database: fn
// runs on the caller's goroutine, its statements kept in order (txn.write)
// rather than run, and then the driver runs them as one write. Canonical
// JSON, digests, hashes and ids are then made before the write reaches the
// writer, which under group commit is shared by every write, and the
// writer's time goes to the statements alone. Every guarded statement
// still decides in the write (a lost guard is CodeConflict and nothing of
// it is written). fn must not touch tx.d, which is nil.
func (s *DB) planned(ctx context.Context, op string, fn func(tx *txn) error) error {
	var ops []func(Tx) error
	tx := &txn{ctx: ctx, now: s.now(), newID: s.newID, signer: s.signer, ops: &ops}
	if l, ok := RunLeaseFrom(ctx); ok {
		tx.fence = &l // its head's move is guarded on the token when the plan runs
	}
	err := fn(tx)
	if err == nil {
		err = tx.flushHeads()
	}
	if err == nil {
		err = s.d.Write(ctx, func(d Tx) error {
			for _, o := range ops {
				if err := o(d); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return s.observe(ctx, op, true, err, tx.wrote)
}

// ProbeWrite implements Store: one write of the driver's Probe, outside
// any run's lease.
func (s *DB) ProbeWrite(ctx context.Context) error {
	return s.inTx(WithoutRunLease(ctx), "probe_write", func(tx *txn) error {
		tx.wrote = true
		return tx.d.Probe(tx.ctx)
	})
}

// wrapErr gives err the op as context and makes sure it is an *Error.
func wrapErr(op string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return &Error{Code: e.Code, Message: op + ": " + err.Error(), Err: err}
	}
	return &Error{Code: CodeInternal, Message: op + ": " + err.Error(), Err: err}
}
