package ledger

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"unicode"
)

// Op is one operation of the Store as Options.Observe is told of it: one
// call of a Store method that reached the driver. A call refused before
// it did (invalid arguments) is not observed.
type Op struct {
	// Name is the Store method's name in snake case ("submit_run",
	// "find_run_by_id"): one of StoreOps.
	Name string
	// Write is set for a write (one Driver.Write, run by DB.inTx or
	// DB.planned) and clear for a read.
	Write bool
	// Err is the operation's error, nil if it succeeded.
	Err error
	// Wrote is set when a write succeeded and changed the database: it
	// appended an event to a run's chain or wrote a row outside the chains
	// (a lease, an agent decision, the probe). A write that succeeds
	// without changing anything (a replayed submit, a duplicate action, an
	// expiry pass with nothing due, a recovery with nothing to record) has
	// it clear.
	Wrote bool
}

// ObserveFunc is told of every operation of the Store once it has ended,
// on the caller's goroutine (Options.Observe).
type ObserveFunc func(ctx context.Context, op Op)

// StoreOps names every operation of the Store as Op.Name names it, one per
// method of Store but Close, in the order of the Store's method set. It is
// read from the Store interface itself: a method the Store gains is an
// operation at once, with no list to keep.
func StoreOps() []string {
	storeOpsOnce.Do(func() {
		t := reflect.TypeFor[Store]()
		for i := range t.NumMethod() {
			if m := t.Method(i).Name; m != "Close" {
				storeOps = append(storeOps, opName(m))
			}
		}
	})
	return append([]string(nil), storeOps...)
}

var (
	storeOpsOnce sync.Once
	storeOps     []string
)

// opName is a method's name in snake case, a run of capitals one word:
// FindRunByID is find_run_by_id.
func opName(method string) string {
	r := []rune(method)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 {
			prevLower := unicode.IsLower(r[i-1])
			nextLower := i+1 < len(r) && unicode.IsLower(r[i+1])
			if prevLower || (unicode.IsUpper(r[i-1]) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

// observe ends an operation of the Store: err gets the operation as its
// context (wrapErr), and the observer is told. wrote counts only for a
// write that succeeded.
func (s *DB) observe(ctx context.Context, op string, write bool, err error, wrote bool) error {
	if err != nil {
		err = wrapErr(strings.ReplaceAll(op, "_", " "), err)
	}
	if s.observer != nil {
		s.observer(ctx, Op{Name: op, Write: write, Err: err, Wrote: write && err == nil && wrote})
	}
	return err
}

// read runs one read operation of the Store, fn on the driver's reader
// outside any snapshot, and tells the observer.
func read[T any](ctx context.Context, s *DB, op string, fn func(Reader) (T, error)) (T, error) {
	out, err := fn(s.d.Reader())
	if err = s.observe(ctx, op, false, err, false); err != nil {
		var zero T
		return zero, err
	}
	return out, nil
}

// readSnapshot runs one read operation of the Store, fn on one consistent
// snapshot (Driver.Read), and tells the observer.
func (s *DB) readSnapshot(ctx context.Context, op string, fn func(Reader) error) error {
	return s.observe(ctx, op, false, s.d.Read(ctx, fn), false)
}
