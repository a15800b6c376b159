package simulator

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"

	"github.com/mattn/go-sqlite3" // database/sql driver "sqlite3"
)

// Effect is one side effect a write tool applied: a row of the effect store.
// A tool without dedup that runs twice for one dedup key leaves two.
type Effect struct {
	Seq             int64           `json:"seq"`
	DedupKey        string          `json:"dedup_key"`
	Tool            string          `json:"tool"`
	ArgumentsDigest ledger.Digest   `json:"arguments_digest"`
	Output          json.RawMessage `json:"output,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
}

// CallOutcome is what came of one Execute call, as the tool saw it.
type CallOutcome string

// Call outcomes. The same strings appear in the CHECK constraint of the
// calls table.
const (
	// CallStarted: recorded before anything else; a call still started
	// afterwards never finished (the process died, or is still in it).
	CallStarted CallOutcome = "started"
	// CallEffect: a new effect row was written.
	CallEffect CallOutcome = "effect"
	// CallDeduplicated: the dedup key's earlier effect was returned; no row.
	CallDeduplicated CallOutcome = "deduplicated"
	// CallRead: a read tool answered; reads write no effect.
	CallRead CallOutcome = "read"
	// CallCancelled: the dedup key was cancelled before; no effect.
	CallCancelled CallOutcome = "cancelled"
	// CallInvalidArguments: the arguments were not a JSON object; no effect.
	CallInvalidArguments CallOutcome = "invalid_arguments"
	// CallSimulatedError: an error fault refused the call; no effect.
	CallSimulatedError CallOutcome = "simulated_error"
	// CallTimedOut: a timeout fault held the call until its context ended.
	CallTimedOut CallOutcome = "timed_out"
	// CallAborted: the context ended during a slow fault, before any effect.
	CallAborted CallOutcome = "aborted"
	// CallCrashedBeforeEffect: a crash fault fired before any effect.
	CallCrashedBeforeEffect CallOutcome = "crashed_before_effect"
	// CallCrashedAfterEffect: a crash fault fired after the effect (new or
	// deduplicated) was committed.
	CallCrashedAfterEffect CallOutcome = "crashed_after_effect"
	// CallFenced: the call's fencing token was older than one the store had
	// already seen for its run (a later holder's); no effect.
	CallFenced CallOutcome = "fenced"
)

// CallRecord is one Execute call of a tool, recorded before the tool does
// anything, with its outcome filled in afterwards: tool-side evidence of how
// often, and with which attempt numbers, the engine called.
type CallRecord struct {
	Seq      int64  `json:"seq"`
	DedupKey string `json:"dedup_key"`
	Tool     string `json:"tool"`
	Attempt  int64  `json:"attempt"`
	// FencingToken is the token the call carried (engine.Call), 0 if none.
	FencingToken int64       `json:"fencing_token,omitempty"`
	Outcome      CallOutcome `json:"outcome"`
	CreatedAt    time.Time   `json:"created_at"`
}

// QueryOutcome is what one Query call answered.
type QueryOutcome string

// Query outcomes. The same strings appear in the CHECK constraint of the
// queries table.
const (
	QueryHappened    QueryOutcome = "happened"     // a visible effect exists
	QueryNotHappened QueryOutcome = "not_happened" // no effect at all
	// QueryNotVisible: an effect exists but is younger than the tool's query
	// visibility, so the answer was not_happened (eventual consistency).
	QueryNotVisible QueryOutcome = "not_visible"
	QueryError      QueryOutcome = "error" // a query_error fault answered
)

// QueryRecord is one Query call of a tool and its answer.
type QueryRecord struct {
	Seq       int64        `json:"seq"`
	DedupKey  string       `json:"dedup_key"`
	Tool      string       `json:"tool"`
	Outcome   QueryOutcome `json:"outcome"`
	CreatedAt time.Time    `json:"created_at"`
}

// EffectStore is the tools' own record of the world: a SQLite file separate
// from the ledger's, so that counting effects in it is evidence independent
// of the ledger. Times are stored as Unix nanoseconds (UTC) from the store's
// clock, so an injected clock round-trips exactly.
//
// It runs in WAL mode with synchronous=FULL (an effect reported done
// survives a SIGKILL right after), a busy timeout, and one connection: every
// write transaction begins IMMEDIATE, so a read-then-write (the dedup check
// and the insert) never races another writer, in this process or another.
// It is safe for concurrent use.
type EffectStore struct {
	db  *sql.DB
	now func() time.Time
}

// schema is applied on every open; every statement is idempotent.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS effects (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		dedup_key TEXT NOT NULL,
		tool TEXT NOT NULL,
		arguments_digest TEXT NOT NULL,
		output TEXT,
		created_at INTEGER NOT NULL
	)`,
	// Not unique: a tool without dedup that runs twice must leave two rows.
	`CREATE INDEX IF NOT EXISTS effects_dedup_key ON effects (dedup_key, seq)`,
	callsTable,
	`CREATE INDEX IF NOT EXISTS calls_dedup_key ON calls (dedup_key, tool)`,
	`CREATE TABLE IF NOT EXISTS queries (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		dedup_key TEXT NOT NULL,
		tool TEXT NOT NULL,
		outcome TEXT NOT NULL CHECK (outcome IN ('happened', 'not_happened', 'not_visible', 'error')),
		created_at INTEGER NOT NULL
	)`,
	`CREATE INDEX IF NOT EXISTS queries_dedup_key ON queries (dedup_key, tool)`,
	// A cancel refuses the calls of its dedup key that had started when it
	// was made (seq up to up_to_call): it stops what is in flight. A call
	// that starts later, a retry under the same approval, proceeds.
	`CREATE TABLE IF NOT EXISTS cancels (
		dedup_key TEXT PRIMARY KEY,
		created_at INTEGER NOT NULL,
		up_to_call INTEGER NOT NULL DEFAULT 0
	)`,
	// The highest fencing token a call of each run carried: a write whose
	// token is lower comes from a holder that lost the run, and is refused.
	`CREATE TABLE IF NOT EXISTS fences (
		run_id TEXT PRIMARY KEY,
		token INTEGER NOT NULL,
		updated_at INTEGER NOT NULL
	)`,
}

// callsTable is the calls table as this version writes it. A store an
// older version made has a calls table without fencing_token, whose CHECK
// does not know 'fenced': upgradeCalls rebuilds it before the schema runs.
const callsTable = `CREATE TABLE IF NOT EXISTS calls (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		dedup_key TEXT NOT NULL,
		tool TEXT NOT NULL,
		attempt INTEGER NOT NULL,
		fencing_token INTEGER NOT NULL DEFAULT 0,
		outcome TEXT NOT NULL CHECK (outcome IN ('started', 'effect', 'deduplicated', 'read',
			'cancelled', 'invalid_arguments', 'simulated_error', 'timed_out', 'aborted',
			'crashed_before_effect', 'crashed_after_effect', 'fenced')),
		created_at INTEGER NOT NULL
	)`

// OpenEffectStore opens (creating if needed) the effect store at path. A
// nil now means time.Now.
func OpenEffectStore(ctx context.Context, path string, now func() time.Time) (*EffectStore, error) {
	if path == "" {
		return nil, errors.New("open effect store: no path")
	}
	if now == nil {
		now = time.Now
	}
	db, err := sql.Open("sqlite3", effectsDSN(path))
	if err != nil {
		return nil, fmt.Errorf("open effect store %s: %w", path, err)
	}
	// One connection: SQLite has one writer anyway, and reads are few.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	s := &EffectStore{db: db, now: now}
	if err := s.initShared(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("open effect store %s: %w", path, err), db.Close())
	}
	return s, nil
}

// initShared runs init, again while another process opening the same store
// holds it locked (replicas start at once: one of them turns the new file
// to WAL or creates the schema, and SQLite answers SQLITE_BUSY at once,
// without its busy handler, to a reader that meets the file mid-change).
// The bound is the store's busy timeout.
func (s *EffectStore) initShared(ctx context.Context) error {
	deadline := time.Now().Add(5 * time.Second)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		err := s.init(ctx)
		var se sqlite3.Error
		if err == nil || !errors.As(err, &se) || (se.Code != sqlite3.ErrBusy && se.Code != sqlite3.ErrLocked) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// effectsDSN is the mattn/go-sqlite3 DSN for path. The path is escaped as a
// URI path so that '?', '#' and '%' in a file name stay part of it.
func effectsDSN(path string) string {
	q := url.Values{}
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "FULL")
	q.Set("_busy_timeout", "5000")
	q.Set("_txlock", "immediate")
	escaped := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + escaped + "?" + q.Encode()
}

func (s *EffectStore) init(ctx context.Context) error {
	var mode string
	if err := s.db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return fmt.Errorf("journal mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal mode is %q, want wal", mode)
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := upgradeCalls(ctx, tx); err != nil {
			return fmt.Errorf("upgrade the calls table: %w", err)
		}
		for _, stmt := range schema {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("schema: %w", err)
			}
		}
		return nil
	})
}

// upgradeCalls rebuilds the calls table of a store an older version made
// (no fencing_token column) as callsTable, keeping every row and its seq;
// the schema then recreates its index. Several processes opening one store
// at once upgrade it once: init's transaction is IMMEDIATE.
func upgradeCalls(ctx context.Context, tx *sql.Tx) error {
	var n int
	if err := tx.QueryRowContext(ctx,
		`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'calls'`).Scan(&n); err != nil || n == 0 {
		return err
	}
	if err := tx.QueryRowContext(ctx,
		`SELECT count(*) FROM pragma_table_info('calls') WHERE name = 'fencing_token'`).Scan(&n); err != nil || n > 0 {
		return err
	}
	for _, stmt := range []string{
		`ALTER TABLE calls RENAME TO calls_before_fencing`,
		callsTable,
		`INSERT INTO calls (seq, dedup_key, tool, attempt, outcome, created_at)
		 SELECT seq, dedup_key, tool, attempt, outcome, created_at FROM calls_before_fencing`,
		`DROP TABLE calls_before_fencing`,
	} {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the store.
func (s *EffectStore) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close effect store: %w", err)
	}
	return nil
}

// inTx runs fn in one write transaction (BEGIN IMMEDIATE, from the DSN) and
// commits it if fn returns nil.
func (s *EffectStore) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// ignoreDone drops sql.ErrTxDone: database/sql rolls a transaction back by
// itself when its context ends.
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// Quiesce waits until nothing of this process uses the store (its one
// connection is free: no transaction, no query open), then runs fn while
// keeping it so, and returns once fn has. A process that freezes itself in
// fn (the fault plan's stop action) thus never holds the file's write lock
// while frozen, which would block every other process sharing the file.
func (s *EffectStore) Quiesce(ctx context.Context, fn func()) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("quiesce effect store: %w", err)
	}
	defer conn.Close()
	fn()
	return nil
}

// Effects returns every effect, oldest first.
func (s *EffectStore) Effects(ctx context.Context) ([]Effect, error) {
	return queryAll(ctx, s.db, "effects",
		`SELECT seq, dedup_key, tool, arguments_digest, output, created_at FROM effects ORDER BY seq`,
		func(rows *sql.Rows) (Effect, error) {
			var (
				e      Effect
				output sql.NullString
				at     int64
			)
			err := rows.Scan(&e.Seq, &e.DedupKey, &e.Tool, &e.ArgumentsDigest, &output, &at)
			if output.Valid {
				e.Output = json.RawMessage(output.String)
			}
			e.CreatedAt = fromNanos(at)
			return e, err
		})
}

// queryAll runs a query and scans every row with scan.
func queryAll[T any](ctx context.Context, db *sql.DB, what, query string, scan func(*sql.Rows) (T, error)) ([]T, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// CountEffects returns how many effects exist for one dedup key: more than
// one means an action took effect more than once.
func (s *EffectStore) CountEffects(ctx context.Context, dedupKey string) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE dedup_key = ?`, dedupKey).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count effects: %w", err)
	}
	return n, nil
}

// Calls returns every recorded Execute call, oldest first.
func (s *EffectStore) Calls(ctx context.Context) ([]CallRecord, error) {
	return queryAll(ctx, s.db, "calls", `SELECT seq, dedup_key, tool, attempt, fencing_token, outcome, created_at FROM calls ORDER BY seq`,
		func(rows *sql.Rows) (CallRecord, error) {
			var (
				c  CallRecord
				at int64
			)
			err := rows.Scan(&c.Seq, &c.DedupKey, &c.Tool, &c.Attempt, &c.FencingToken, &c.Outcome, &at)
			c.CreatedAt = fromNanos(at)
			return c, err
		})
}

// Queries returns every recorded Query call, oldest first.
func (s *EffectStore) Queries(ctx context.Context) ([]QueryRecord, error) {
	return queryAll(ctx, s.db, "queries", `SELECT seq, dedup_key, tool, outcome, created_at FROM queries ORDER BY seq`,
		func(rows *sql.Rows) (QueryRecord, error) {
			var (
				q  QueryRecord
				at int64
			)
			err := rows.Scan(&q.Seq, &q.DedupKey, &q.Tool, &q.Outcome, &at)
			q.CreatedAt = fromNanos(at)
			return q, err
		})
}
func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// lastEffect is the newest effect recorded under dedupKey no later than
// before (unix nanoseconds): its output and when it was recorded; found is
// false if there is none.
func lastEffect(ctx context.Context, tx *sql.Tx, dedupKey string, before int64) (output json.RawMessage, at time.Time, found bool, err error) {
	var (
		out sql.NullString
		ns  int64
	)
	err = tx.QueryRowContext(ctx,
		`SELECT output, created_at FROM effects WHERE dedup_key = ? AND created_at <= ? ORDER BY seq DESC LIMIT 1`,
		dedupKey, before).Scan(&out, &ns)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, time.Time{}, false, nil
	case err != nil:
		return nil, time.Time{}, false, err
	}
	return json.RawMessage(out.String), fromNanos(ns), true, nil
}

// fence is the fencing of one call: the run it is for and the token it
// carries. A call without either (a zero token: made under no lease) is
// not fenced.
type fence struct {
	Run   string
	Token int64
}

func (f fence) applies() bool { return f.Run != "" && f.Token > 0 }

// recordCall records the start of an Execute call and returns its row and
// its number among the calls of (tool, dedup key), counting this one. The
// count comes from the table, so it survives restarts. It raises the run's
// fence to the call's token if that is higher: from then on a write of an
// older holder of the run is refused (write).
func (s *EffectStore) recordCall(ctx context.Context, tool, dedupKey string, attempt int64, f fence) (seq int64, n int, err error) {
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		now := s.now().UTC().UnixNano()
		res, err := tx.ExecContext(ctx,
			`INSERT INTO calls (dedup_key, tool, attempt, fencing_token, outcome, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			dedupKey, tool, attempt, f.Token, CallStarted, now)
		if err != nil {
			return err
		}
		if seq, err = res.LastInsertId(); err != nil {
			return err
		}
		if f.applies() {
			if _, err := tx.ExecContext(ctx,
				`INSERT INTO fences (run_id, token, updated_at) VALUES (?, ?, ?)
				 ON CONFLICT (run_id) DO UPDATE SET token = excluded.token, updated_at = excluded.updated_at
				 WHERE excluded.token > fences.token`, f.Run, f.Token, now); err != nil {
				return err
			}
		}
		return tx.QueryRowContext(ctx,
			`SELECT count(*) FROM calls WHERE dedup_key = ? AND tool = ?`, dedupKey, tool).Scan(&n)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("record call: %w", err)
	}
	return seq, n, nil
}

// setCallOutcome records how a call ended.
func (s *EffectStore) setCallOutcome(ctx context.Context, seq int64, outcome CallOutcome) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error { return setOutcome(ctx, tx, seq, outcome) })
	if err != nil {
		return fmt.Errorf("record call outcome: %w", err)
	}
	return nil
}

func setOutcome(ctx context.Context, tx *sql.Tx, seq int64, outcome CallOutcome) error {
	_, err := tx.ExecContext(ctx, `UPDATE calls SET outcome = ? WHERE seq = ?`, outcome, seq)
	return err
}

// writeParams is one write call's effect.
type writeParams struct {
	CallSeq         int64
	Tool            string
	DedupKey        string
	Fence           fence
	ArgumentsDigest ledger.Digest
	// Dedup returns the latest effect of the dedup key instead of writing,
	// if it is younger than Retention (0: no limit).
	Dedup     bool
	Retention time.Duration
	// Output builds the new effect's output from its seq.
	Output func(seq int64) (json.RawMessage, error)
	// NewOutcome and DedupOutcome are recorded on the call, in the same
	// transaction, when an effect is written or deduplicated.
	NewOutcome   CallOutcome
	DedupOutcome CallOutcome
}

// writeResult is what a write call did.
type writeResult struct {
	// Fenced: the run's fence is higher than the call's token; nothing
	// happened. SeenToken is the fence.
	Fenced       bool
	SeenToken    int64
	Cancelled    bool            // a tombstone refused the call; nothing else happened
	Expired      bool            // the caller's deadline had passed; nothing happened
	Deduplicated bool            // Output is the earlier effect's
	Output       json.RawMessage // the effect's output
}

// write applies one write call in one IMMEDIATE transaction: a call whose
// fencing token is older than its run's fence is refused (Fenced), a
// caller past its deadline gets nothing done (Expired), a tombstone
// refuses it, a live dedup key returns the
// earlier effect, anything else inserts a new effect row.
func (s *EffectStore) write(ctx context.Context, p writeParams) (writeResult, error) {
	var res writeResult
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if p.Fence.applies() && !broken("no_fencing") {
			// Under the write lock, in the transaction that would write the
			// effect: no newer holder's call can slip in between.
			err := tx.QueryRowContext(ctx, `SELECT token FROM fences WHERE run_id = ?`, p.Fence.Run).Scan(&res.SeenToken)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			if res.SeenToken > p.Fence.Token {
				res.Fenced = true
				return setOutcome(ctx, tx, p.CallSeq, CallFenced)
			}
		}
		if expired(ctx) {
			// Checked once the write lock is held, on the wall clock as
			// well as the context's own state: a process resumed after a
			// pause past the deadline may get here before its timer fires.
			res.Expired = true
			return nil
		}
		now := s.now().UTC()
		var tombstone int
		if err := tx.QueryRowContext(ctx,
			`SELECT count(*) FROM cancels WHERE dedup_key = ? AND up_to_call >= ?`, p.DedupKey, p.CallSeq).Scan(&tombstone); err != nil {
			return err
		}
		if tombstone > 0 {
			res.Cancelled = true
			return setOutcome(ctx, tx, p.CallSeq, CallCancelled)
		}
		if p.Dedup {
			output, at, found, err := lastEffect(ctx, tx, p.DedupKey, math.MaxInt64)
			if err != nil {
				return err
			}
			if found && (p.Retention <= 0 || now.Sub(at) <= p.Retention) {
				res.Deduplicated = true
				res.Output = output
				return setOutcome(ctx, tx, p.CallSeq, p.DedupOutcome)
			}
		}
		ins, err := tx.ExecContext(ctx,
			`INSERT INTO effects (dedup_key, tool, arguments_digest, created_at) VALUES (?, ?, ?, ?)`,
			p.DedupKey, p.Tool, string(p.ArgumentsDigest), now.UnixNano())
		if err != nil {
			return err
		}
		seq, err := ins.LastInsertId()
		if err != nil {
			return err
		}
		if res.Output, err = p.Output(seq); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE effects SET output = ? WHERE seq = ?`, string(res.Output), seq); err != nil {
			return err
		}
		return setOutcome(ctx, tx, p.CallSeq, p.NewOutcome)
	})
	if err != nil {
		return writeResult{}, fmt.Errorf("write effect: %w", err)
	}
	return res, nil
}

// expired reports whether ctx is done or past its deadline by the wall
// clock, whether or not its timer has fired yet.
func expired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// queryParams is one Query call.
type queryParams struct {
	Tool     string
	DedupKey string
	// Visibility is how long after its creation an effect stays invisible.
	Visibility time.Duration
	// Fail reports whether the query with this number (1-based, among the
	// queries of tool and dedup key, counting this one) is to fail.
	Fail func(n int) bool
}

// queryResult is what the store knows of a dedup key's effects.
type queryResult struct {
	Outcome QueryOutcome
	Output  json.RawMessage // the latest visible effect's output
}

// query numbers and records one query and, unless Fail says otherwise,
// looks up the dedup key's latest visible effect, in one transaction.
func (s *EffectStore) query(ctx context.Context, p queryParams) (queryResult, error) {
	var res queryResult
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		now := s.now().UTC()
		var n int
		if err := tx.QueryRowContext(ctx,
			`SELECT count(*) + 1 FROM queries WHERE dedup_key = ? AND tool = ?`, p.DedupKey, p.Tool).Scan(&n); err != nil {
			return err
		}
		res.Outcome = QueryNotHappened
		switch {
		case p.Fail != nil && p.Fail(n):
			res.Outcome = QueryError
		default:
			// With no visibility delay every row is visible, whatever the
			// clock did since it was written.
			visibleBefore := int64(math.MaxInt64)
			if p.Visibility > 0 {
				visibleBefore = now.Add(-p.Visibility).UnixNano()
			}
			_, _, recorded, err := lastEffect(ctx, tx, p.DedupKey, math.MaxInt64)
			if err != nil {
				return err
			}
			if recorded {
				res.Outcome = QueryNotVisible
				output, _, visible, err := lastEffect(ctx, tx, p.DedupKey, visibleBefore)
				if err != nil {
					return err
				}
				if visible {
					res.Outcome, res.Output = QueryHappened, output
				}
			}
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO queries (dedup_key, tool, outcome, created_at) VALUES (?, ?, ?, ?)`,
			p.DedupKey, p.Tool, res.Outcome, now.UnixNano())
		return err
	})
	if err != nil {
		return queryResult{}, fmt.Errorf("query effect: %w", err)
	}
	return res, nil
}

// cancelResult is what a cancel did.
type cancelResult struct {
	Confirmed bool  // a tombstone is in place and no effect exists
	EffectSeq int64 // the existing effect, when not confirmed
}

// cancel refuses future effects of the dedup key, in one transaction with
// the check that none exists yet.
func (s *EffectStore) cancel(ctx context.Context, dedupKey string) (cancelResult, error) {
	var res cancelResult
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx,
			`SELECT seq FROM effects WHERE dedup_key = ? ORDER BY seq LIMIT 1`, dedupKey).Scan(&res.EffectSeq)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		_, err = tx.ExecContext(ctx,
			`INSERT INTO cancels (dedup_key, created_at, up_to_call)
			 VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) FROM calls WHERE dedup_key = ?))
			 ON CONFLICT (dedup_key) DO UPDATE SET up_to_call = excluded.up_to_call`,
			dedupKey, s.now().UTC().UnixNano(), dedupKey)
		res.Confirmed = err == nil
		return err
	})
	if err != nil {
		return cancelResult{}, fmt.Errorf("cancel effect: %w", err)
	}
	return res, nil
}

// countByTitle returns how many effects carry the title in their output.
// An empty title counts every effect.
func (s *EffectStore) countByTitle(ctx context.Context, title string) (int, error) {
	q, args := `SELECT count(*) FROM effects`, []any{}
	if title != "" {
		q, args = q+` WHERE json_extract(output, '$.title') = ?`, []any{title}
	}
	var n int
	if err := s.db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count effects by title: %w", err)
	}
	return n, nil
}
