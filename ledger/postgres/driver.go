// Package postgres is the ledger's storage driver on PostgreSQL: a
// ledger.Driver over GORM and pgx (gorm.io/driver/postgres).
//
// What PostgreSQL makes it do differently from ledger/sqlite:
//   - Writes run concurrently, each in a READ COMMITTED transaction that
//     locks every run it touches before it reads any row of it (locks.go).
//     The rules read, decide, then write, and a write must commit only if
//     nothing it read changed meanwhile. Every decision the rules make in
//     a write is about one run: its actions, attempts, approvals,
//     cancellation, budget, leases and chain head. So the first time a
//     write touches a run, it locks the run's row (SELECT … FOR NO KEY
//     UPDATE), and only then reads; a row found by its own id (an action,
//     an attempt, an approval) is mapped to its run in the statement that
//     takes the lock. Every write of a run takes that lock, so the writes
//     of one run run one after another, each reading (READ COMMITTED: each
//     statement sees what was committed when it began) what the one before
//     it committed, and what a write read stays true until it commits:
//     serialisable, run by run. Writes of different runs share no lock and
//     commit in parallel. Guarded moves (UPDATE … WHERE state = from) stay
//     as they are, a second guard. SERIALIZABLE, which this driver first
//     used, is correct too, but its predicate locks cover pages of indexes
//     and whole small tables, so writes of unrelated runs failed each
//     other: a write had to be run again, sometimes ten times and more.
//   - What the rules read across runs is read committed, and locked where
//     it must not move: the sweeps (due approvals, unsettled
//     cancellations) lock the runs of the rows they list, in id order, and
//     list again; SubmitRun's pending-approvals cap takes an advisory lock
//     on the tenant before it counts, so submits of one tenant under a cap
//     count one after the other and the cap holds exactly. A new run is
//     guarded by its unique request identity: two submits of one identity
//     both find none, one inserts it, the other is told 23505 and is run
//     again (once, see Write), when it finds the winner's run.
//   - A write that deadlocks (SQLSTATE 40P01: two writes locking two runs
//     in opposite orders) or fails serialisation (40001) is run again from
//     the start, a bounded number of times (Config.WriteAttempts) with a
//     small jittered backoff, and is CodeConflict after the last. There is
//     no group commit: concurrent writes commit in parallel instead.
//   - Run leases (runleases.go) are compared against the database's clock,
//     not the process's, and a claim skips the runs another claim (or a
//     write) holds locked (FOR NO KEY UPDATE SKIP LOCKED).
//   - A failed statement aborts the PostgreSQL transaction it ran in, where
//     SQLite would only undo the statement: after one, every later call of
//     the Tx returns that first error, and Write never commits the
//     transaction, even if fn swallowed the error.
//   - A session the server ended (an administrator's
//     pg_terminate_backend, a restart, a failover) or whose connection
//     broke costs no call that had nothing in flight on it: a read runs
//     again, once, on another session, and so does a write that had not
//     sent its COMMIT (Write). The pool does not see such a session die:
//     it lends it as if alive. So once the driver has met one, the pool
//     pings each connection before it lends it again and drops the dead
//     (shouldPing), and the call run again meets a live session. A write
//     whose COMMIT was sent and whose answer was lost is not run again: it
//     may have committed.
//   - Reads in Read run in one REPEATABLE READ READ ONLY transaction; the
//     Reader outside any snapshot runs each statement on the pool (READ
//     COMMITTED), and a call that needs several statements takes a
//     snapshot of its own.
//   - TEXT cannot hold the NUL character or invalid UTF-8, which SQLite
//     would store: such a value is CodeInvalid (SQLSTATE class 22).
//   - Every TEXT column is COLLATE "C", so ids sort byte by byte whatever
//     the database's collation.
package postgres

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/migrate"
)

// Config opens a Driver.
type Config struct {
	// DSN is the database's URL, postgres://user@host:port/dbname?… (or
	// any connection string pgx accepts).
	DSN string
	// MaxConns is the size of the connection pool; 0 means 16.
	MaxConns int
	// Now is the clock the driver's own rows are stamped with
	// (schema_migrations.applied_at); nil means time.Now.
	Now func() time.Time
	// WriteAttempts is how many times Write runs fn when PostgreSQL keeps
	// failing it for a concurrent write (serialisation failure, deadlock)
	// before it gives up with CodeConflict; 0 means 10.
	WriteAttempts int
	// OnCommit, if set, is told of every transaction of Write once it has
	// ended: Writes is 1 (there is no group commit), Duration is BEGIN to
	// the end of COMMIT or of the rollback, on the clock Now, and Err what
	// ended it without a commit (nil when it committed). A write run again
	// after a serialisation failure is told once per run. It runs on the
	// writing goroutine before Write returns: keep it quick, and do not
	// call the Driver from it.
	OnCommit func(ledger.CommitStats)
	// WriteFaultFunc is for fault plans only, as in ledger/sqlite: it is
	// called with the write's number n (1 for the first Write this Driver
	// was given, in the order they were given, failed ones included) at
	// WriteBeforeCommit, once fn has succeeded and before COMMIT, and at
	// WriteAfterCommit, once COMMIT has returned, on the writing goroutine,
	// so it may kill the process there. An error at WriteBeforeCommit fails
	// that write, rolled back and not run again, as CodeInternal; at
	// WriteAfterCommit it is ignored. Nil, the default, costs nothing.
	WriteFaultFunc func(n int64, at ledger.WritePoint) error
	// NewID, SigningKey and Observe are the ledger's (ledger.Options), for
	// OpenStore; Open ignores them.
	NewID      ledger.NewIDFunc
	SigningKey ed25519.PrivateKey
	Observe    ledger.ObserveFunc
}

// Defaults of Config.
const (
	DefaultMaxConns      = 16
	DefaultWriteAttempts = 10
)

// Driver is the ledger's storage on PostgreSQL.
type Driver struct {
	db       *gorm.DB
	sqlDB    *sql.DB
	now      func() time.Time
	attempts int
	onCommit func(ledger.CommitStats)
	// writeFault is Config.WriteFaultFunc; writes numbers the writes.
	writeFault func(n int64, at ledger.WritePoint) error
	writes     atomic.Int64
	// ended counts the sessions the driver found ended under it
	// (sessionEnded); the pool checks a connection before it lends it
	// again when this moved since its last check (shouldPing).
	ended atomic.Uint64
}

var _ ledger.Driver = (*Driver)(nil)

// IdleInTransactionTimeout is the server's idle_in_transaction_session_timeout
// on the driver's sessions unless the DSN sets its own: a process frozen
// inside a write (SIGSTOP, a stalled VM) holds its run's row lock, and every
// other replica's writes of that run wait on it; after this long the server
// ends the frozen session and its locks go with it. The frozen process's
// write then fails, as a fenced one would.
const IdleInTransactionTimeout = 5 * time.Second

// withSessionDefaults is dsn with the session settings the driver needs
// (IdleInTransactionTimeout) added where dsn does not set them, for a
// postgres:// URL or a keyword=value string alike.
func withSessionDefaults(dsn string) string {
	const key = "idle_in_transaction_session_timeout"
	if strings.Contains(dsn, key) {
		return dsn
	}
	ms := strconv.FormatInt(IdleInTransactionTimeout.Milliseconds(), 10)
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set(key, ms)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + key + "=" + ms
}

// Open connects to cfg.DSN and applies pending migrations. A database whose
// schema is newer than this build is refused with CodeUnsupportedVersion
// and left untouched. Several processes may open the same database at once:
// one migrates, the others wait for it.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	switch {
	case cfg.DSN == "":
		return nil, ledger.Errorf(ledger.CodeInvalid, "open postgres: no DSN")
	case cfg.MaxConns < 0:
		return nil, ledger.Errorf(ledger.CodeInvalid, "open postgres: MaxConns cannot be negative")
	case cfg.WriteAttempts < 0:
		return nil, ledger.Errorf(ledger.CodeInvalid, "open postgres: WriteAttempts cannot be negative")
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.WriteAttempts == 0 {
		cfg.WriteAttempts = DefaultWriteAttempts
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	d := &Driver{now: cfg.Now, attempts: cfg.WriteAttempts, onCommit: cfg.OnCommit, writeFault: cfg.WriteFaultFunc}
	db, err := gorm.Open(postgres.New(postgres.Config{DSN: withSessionDefaults(cfg.DSN),
		OptionOpenDB: []stdlib.OptionOpenDB{stdlib.OptionShouldPing(d.shouldPing)}}), &gorm.Config{
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true, // Write and Read open every transaction themselves
		// pgx caches a prepared statement per connection and statement
		// text on its own; GORM's statement cache would add a goroutine.
		PrepareStmt: false,
	})
	if err != nil {
		return nil, wrapErr("open postgres", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, wrapErr("open postgres", err)
	}
	sqlDB.SetMaxOpenConns(cfg.MaxConns)
	sqlDB.SetMaxIdleConns(cfg.MaxConns)
	d.db, d.sqlDB = db, sqlDB
	if err := sqlDB.PingContext(ctx); err != nil {
		_ = sqlDB.Close()
		return nil, wrapErr("open postgres", err)
	}
	if err := d.migrate(ctx); err != nil {
		_ = sqlDB.Close()
		return nil, err
	}
	return d, nil
}

// OpenStore opens the Driver at cfg.DSN and the ledger over it, with
// cfg's clock, ids and signing key; closing the Store closes the Driver.
func OpenStore(ctx context.Context, cfg Config) (*ledger.DB, error) {
	d, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s, err := ledger.New(d, ledger.Options{Now: cfg.Now, NewID: cfg.NewID, SigningKey: cfg.SigningKey, Observe: cfg.Observe})
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the connection pool.
func (d *Driver) Close() error {
	if err := d.sqlDB.Close(); err != nil {
		return wrapErr("close postgres", err)
	}
	return nil
}

// Reader implements ledger.Driver: the pool, each statement on what was
// committed when it ran.
func (d *Driver) Reader() ledger.Reader { return &reader{db: d.db, pool: d} }

// Read implements ledger.Driver: fn runs in one REPEATABLE READ READ ONLY
// transaction, so every read sees the same snapshot.
func (d *Driver) Read(ctx context.Context, fn func(ledger.Reader) error) error {
	err := d.snapshot(ctx, func(r *reader) error { return fn(r) })
	return passErr("read", err)
}

// snapshot runs fn on a reader in one REPEATABLE READ READ ONLY
// transaction, and again, once, in a new one, when the server ended the
// session under it or the connection broke (sessionEnded): a read
// transaction changes nothing, so it may always run again, and the pool
// lends a checked session for the second run.
func (d *Driver) snapshot(ctx context.Context, fn func(*reader) error) error {
	lost, err := d.snapshotOnce(ctx, fn)
	if lost && ctx.Err() == nil {
		_, err = d.snapshotOnce(ctx, fn)
	}
	return err
}

// snapshotOnce is snapshot, run once; lost says that its session ended
// under it.
func (d *Driver) snapshotOnce(ctx context.Context, fn func(*reader) error) (lost bool, err error) {
	g := d.db.WithContext(ctx).Begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if g.Error != nil {
		return d.sessionEnded(g.Error), wrapErr("begin read", g.Error)
	}
	ended := false
	defer func() {
		if !ended {
			g.Rollback() // also when fn panics
		}
	}()
	r := &reader{db: g, st: &txState{}}
	err = fn(r)
	switch {
	case r.st.failed != nil && err == nil:
		return d.sessionEnded(r.st.failed), wrapErr("read", r.st.failed)
	case err != nil:
		return r.st.failed != nil && d.sessionEnded(r.st.failed), err
	}
	ended = true
	if err := g.Commit().Error; err != nil {
		return d.sessionEnded(err), wrapErr("end read", err)
	}
	return false, nil
}

// Write implements ledger.Driver: fn runs in one READ COMMITTED
// transaction whose Tx locks each run before reading it (see the package
// doc), and again from the start, in a new one, when PostgreSQL fails it
// for a concurrent write (a deadlock, a serialisation failure); after
// Config.WriteAttempts runs it is CodeConflict.
//
// A write whose session ended before its COMMIT was sent (sessionLost:
// the server ended a session frozen mid-write, or every session of the
// pool, say) is run again once, on a new session the pool checked
// (shouldPing): nothing of it was committed. If that session ends too,
// the error is the store's failure, as it is. A session lost during the
// COMMIT is not run again, since the write may have committed, unless the
// server says it ended the session for sitting idle in the transaction
// (SQLSTATE 25P03): then the COMMIT never reached it.
//
// A unique violation is run again too, once: when two writes each check
// that a key is free and then insert it, the second waits on the unique
// index for the first to commit and is told 23505. Run again, it reads the
// winner's row and takes the path the rules have for it; a key that is
// really taken fails the same way again and is CodeConflict.
func (d *Driver) Write(ctx context.Context, fn func(ledger.Tx) error) error {
	var n int64
	if d.writeFault != nil {
		n = d.writes.Add(1)
	}
	uniqueRetried, sessionRetried := false, false
	for attempt := 1; ; attempt++ {
		again, err := d.writeOnce(ctx, n, fn)
		retry := again == afterConflict
		switch {
		case again == afterLostSession && !sessionRetried:
			sessionRetried = true // once: a server that keeps ending sessions is a failing store
			continue
		case retry && attempt >= d.attempts:
			return &ledger.Error{Code: ledger.CodeConflict,
				Message: fmt.Sprintf("write: a concurrent write changed what it read, %d times: %v", attempt, err), Err: err}
		case !retry && !uniqueRetried && attempt < d.attempts && hasSQLState(err, sqlstateUniqueViolation):
			uniqueRetried = true
		case !retry:
			return passErr("write", err)
		}
		if err := backoff(ctx, attempt); err != nil {
			return wrapErr("write", err)
		}
	}
}

// backoff waits before run attempt+1 of a write: a random time up to 1 ms
// doubled for each run so far, at most 64 ms, so that writes that keep
// colliding spread out.
func backoff(ctx context.Context, attempt int) error {
	ceiling := time.Millisecond << min(attempt-1, 6)
	t := time.NewTimer(rand.N(ceiling) + time.Millisecond/4)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// rerun is whether a write that failed may be run again, and why.
type rerun uint8

const (
	// never: the write failed for good, or may have committed.
	never rerun = iota
	// afterConflict: PostgreSQL failed it for a concurrent write
	// (retryable).
	afterConflict
	// afterLostSession: its session ended before the COMMIT reached the
	// server (sessionLost), so nothing of it was committed.
	afterLostSession
)

// failedBefore is how a write that failed with err before its COMMIT was
// sent may be run again.
func (d *Driver) failedBefore(err error) rerun {
	switch {
	case retryable(err):
		return afterConflict
	case d.sessionEnded(err):
		return afterLostSession
	}
	return never
}

// sessionEnded reports whether err says that the server ended the session
// a statement ran on, or that the connection to it broke (sessionLost).
// When it does, the pool checks each connection before it lends it again
// (shouldPing): whatever ended one session (an administrator's
// pg_terminate_backend, a restart, a failover) has usually ended the
// others the pool holds idle, and a call run again must not meet one.
func (d *Driver) sessionEnded(err error) bool {
	if !sessionLost(err) {
		return false
	}
	d.ended.Add(1)
	return true
}

// readAgain runs fn, a read on the pool, and runs it again, once, when
// the server ended the session it ran on or the connection broke
// (sessionEnded): a read changes nothing, and the pool lends a checked
// session for the second run.
func (d *Driver) readAgain(ctx context.Context, fn func() error) error {
	err := fn()
	if err != nil && ctx.Err() == nil && d.sessionEnded(err) {
		err = fn()
	}
	return err
}

// checkedKey is where a connection's CustomData keeps Driver.ended as it
// was when shouldPing last saw the connection.
const checkedKey = "ledger.sessions_ended"

// shouldPing is the pool's rule for lending a connection again (pgx's
// stdlib.OptionShouldPing): ping it first, and drop it for another if the
// ping fails, when it sat idle over a second (pgx's own rule), or when the
// driver found a session ended since the pool last lent it. A killed
// session's connection looks alive until it is used: without the ping,
// every call that took one would fail, one per pooled connection.
func (d *Driver) shouldPing(_ context.Context, p stdlib.ShouldPingParams) bool {
	data := p.Conn.PgConn().CustomData()
	ended := d.ended.Load()
	checked, _ := data[checkedKey].(uint64)
	data[checkedKey] = ended
	return checked != ended || p.IdleDuration > time.Second
}

// writeOnce runs fn (write n, for fault plans) in one READ COMMITTED
// transaction and commits it; again says whether, and why, running fn
// again in a new one may succeed where this failed.
func (d *Driver) writeOnce(ctx context.Context, n int64, fn func(ledger.Tx) error) (again rerun, err error) {
	if err := ctx.Err(); err != nil {
		return never, err
	}
	var began time.Time
	if d.onCommit != nil {
		began = d.now()
		defer func() {
			d.onCommit(ledger.CommitStats{Writes: 1, Duration: d.now().Sub(began), Err: err})
		}()
	}
	g := d.db.WithContext(ctx).Begin(&sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if g.Error != nil {
		return d.failedBefore(g.Error), wrapErr("begin write", g.Error)
	}
	t := &tx{reader{db: g, st: &txState{}}}
	ended := false
	defer func() {
		if !ended {
			g.Rollback() // also when fn panics
		}
	}()
	err = fn(t)
	if err == nil {
		err = t.flushEvents(ctx)
	}
	failed := t.st.failed
	switch {
	case failed != nil && retryable(failed):
		return afterConflict, failed
	case err != nil:
		return d.failedBefore(err), err
	case failed != nil:
		// fn went on after a statement failed: PostgreSQL has aborted the
		// transaction, so nothing of it may be committed.
		return d.failedBefore(failed), wrapErr("write", failed)
	}
	if d.writeFault != nil {
		if err := d.writeFault(n, ledger.WriteBeforeCommit); err != nil {
			return never, ledger.Errorf(ledger.CodeInternal, "write %d: before commit: %w", n, err)
		}
	}
	ended = true
	if err := g.Commit().Error; err != nil {
		// A session lost during the COMMIT is the pool's news as much as
		// any other (sessionEnded), but the write may have committed.
		if d.sessionEnded(err) && hasSQLState(err, sqlstateIdleInTransactionTimeout) {
			// The server ended the session while it sat in the
			// transaction, before the COMMIT reached it (a process frozen
			// mid-write): nothing was committed.
			return afterLostSession, wrapErr("commit", err)
		}
		if retryable(err) {
			return afterConflict, wrapErr("commit", err)
		}
		return never, wrapErr("commit", err)
	}
	if d.writeFault != nil {
		_ = d.writeFault(n, ledger.WriteAfterCommit) // it can only kill here
	}
	return never, nil
}

// passErr returns err as the caller gets it: a *ledger.Error unchanged (the
// rules' own errors keep their words), anything else translated.
func passErr(op string, err error) error {
	var e *ledger.Error
	if err == nil || errors.As(err, &e) {
		return err
	}
	return wrapErr(op, err)
}

// LatestSchemaVersion implements ledger.Driver: the schema version this
// build writes.
func (d *Driver) LatestSchemaVersion() int { return SchemaVersion() }

// SchemaVersion implements ledger.Driver.
func (d *Driver) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := d.readAgain(ctx, func() error { return d.db.WithContext(ctx).Raw(migrate.VersionSQL).Row().Scan(&v) })
	if err != nil {
		return 0, wrapErr("read schema version", err)
	}
	return v, nil
}
