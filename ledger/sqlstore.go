package ledger

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-sqlite3"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

//go:embed migrations/sqlite/*.sql
var sqliteMigrations embed.FS

// Config opens a Store.
type Config struct {
	// Path is the SQLite database file; it is created if missing.
	Path string
	// Now is the clock; nil means time.Now. Times are kept in UTC with
	// microsecond precision.
	Now func() time.Time
	// NewID makes identifiers; nil means prefixed monotonic ULIDs.
	NewID NewIDFunc
	// BusyTimeout is how long a writer waits for another process's write
	// lock before failing; 0 means 5s.
	BusyTimeout time.Duration
	// Synchronous is SQLite's synchronous pragma; "" means FULL, which the
	// ledger needs so a committed attempt survives power loss. Benchmarks may
	// set it to compare like with like.
	Synchronous string
	// ReadConns is the size of the read pool; 0 means 4.
	ReadConns int
	// WriteFaultFunc is for fault plans only: the crash tests and the fault
	// matrix, through cmd/ledger, which sets it only from an explicit
	// LEDGER_FAULT_PLAN in the environment of a process someone started
	// with one; nothing reachable from the network sets it. It is called
	// with the write's number n (1 for the first write this Store runs,
	// counted in the order the writes run, failed ones included) at each
	// WritePoint of the write, on the goroutine that runs its commit, so it
	// may kill the process there. An error it returns at
	// WriteBeforeCommit fails that write alone, as a full disk would: its
	// statements are rolled back and its caller gets the error as
	// CodeInternal; at WriteAfterCommit the error is ignored. Nil, the
	// default, costs nothing.
	WriteFaultFunc func(n int64, at WritePoint) error
	// OnCommit, if set, is told of every group commit once it has ended:
	// how many writes it held and how long its transaction took, BEGIN to
	// the end of COMMIT, on the clock Now (metrics). It runs on the
	// committing goroutine after every caller of the batch was answered:
	// keep it quick, and do not call the Store from it.
	// SigningKey, if set, signs each run's chain head whenever a write
	// moves it (signing.go). It stays in memory: never stored or logged.
	SigningKey ed25519.PrivateKey
	OnCommit   func(CommitStats)
}

// CommitStats describe one group commit (Config.OnCommit).
type CommitStats struct {
	// Writes is how many Store writes shared the transaction.
	Writes int
	// Duration is BEGIN to the end of COMMIT (or of the rollback).
	Duration time.Duration
	// Err is the transaction's own error (BEGIN, a savepoint or COMMIT
	// failed: none of its writes is durable); nil when it committed, even
	// if some of its writes failed alone and were rolled back to their
	// savepoints.
	Err error
}

// GormStore is the Store on GORM and SQLite. It keeps one writer connection
// (all write transactions begin IMMEDIATE, so a read-then-write never fails
// halfway with SQLITE_BUSY) and a pool of query-only readers; WAL lets them
// read while the writer commits.
type GormStore struct {
	w, r  *gorm.DB
	now   func() time.Time
	newID NewIDFunc
	// clock is Config.Now untruncated, so commit durations keep its
	// monotonic reading; onCommit is Config.OnCommit.
	clock    func() time.Time
	onCommit func(CommitStats)
	wr       *writer // group commit (groupcommit.go)
	// writeFaultFunc is Config.WriteFaultFunc; writes counts the writes
	// run so far, under the writer lock (writefault.go).
	writeFaultFunc func(n int64, at WritePoint) error
	writes         int64
	// ws are the write statements, prepared on the writer's connection;
	// rs the read statements of the reader pool (stmts.go).
	ws []*sql.Stmt
	rs *readStmts
	// signer signs chain heads; nil without a signing key.
	signer *signer
}

var _ Store = (*GormStore)(nil)

// Open opens (creating if needed) the database at cfg.Path and applies
// pending migrations. A database whose schema is newer than this build is
// refused with CodeUnsupportedVersion and left untouched.
func Open(ctx context.Context, cfg Config) (*GormStore, error) {
	if cfg.Path == "" {
		return nil, Errorf(CodeInvalid, "open store: no database path")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	now := func() time.Time { return cfg.Now().UTC().Truncate(time.Microsecond) }
	if cfg.NewID == nil {
		cfg.NewID = NewULIDFunc(now)
	}
	if cfg.BusyTimeout == 0 {
		cfg.BusyTimeout = 5 * time.Second
	}
	if cfg.Synchronous == "" {
		cfg.Synchronous = "FULL"
	}
	if !slices.Contains([]string{"OFF", "NORMAL", "FULL", "EXTRA"}, strings.ToUpper(cfg.Synchronous)) {
		return nil, Errorf(CodeInvalid, "open store: synchronous must be OFF, NORMAL, FULL or EXTRA, not %q", cfg.Synchronous)
	}
	if cfg.ReadConns == 0 {
		cfg.ReadConns = 4
	}
	sign, err := newSigner(cfg.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	gcfg := func() *gorm.Config {
		return &gorm.Config{
			NowFunc:                now,
			Logger:                 logger.Discard,
			SkipDefaultTransaction: true, // we open every write transaction ourselves
			// No PrepareStmt: GORM's statement cache starts a goroutine per
			// Open that never exits, and inside a transaction database/sql
			// re-prepares each cached statement on the transaction's
			// connection anyway, which the profile showed costing more
			// than it saved.
			PrepareStmt:    false,
			TranslateError: true,
		}
	}
	registerDriver()
	w, err := gorm.Open(sqlite.New(sqlite.Config{DriverName: driverName, DSN: dsn(cfg, false)}), gcfg())
	if err != nil {
		return nil, Errorf(CodeInternal, "open store %s: %w", cfg.Path, err)
	}
	s := &GormStore{w: w, now: now, newID: cfg.NewID, clock: cfg.Now, onCommit: cfg.OnCommit,
		writeFaultFunc: cfg.WriteFaultFunc, signer: sign}
	if err := setPool(w, 1); err != nil {
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		_ = closeDB(w)
		return nil, err
	}
	wdb, err := w.DB()
	if err == nil {
		s.ws, err = prepareWrites(ctx, wdb)
	}
	if err != nil {
		_ = closeDB(w)
		return nil, Errorf(CodeInternal, "open store %s: %w", cfg.Path, err)
	}
	// Readers open after migration so they find the WAL files in place.
	r, err := gorm.Open(sqlite.New(sqlite.Config{DriverName: driverName, DSN: dsn(cfg, true)}), gcfg())
	if err != nil {
		_ = closeDB(w)
		return nil, Errorf(CodeInternal, "open store readers %s: %w", cfg.Path, err)
	}
	if err := setPool(r, cfg.ReadConns); err != nil {
		_ = closeStmts(s.ws)
		_ = closeDB(w)
		return nil, err
	}
	rdb, err := r.DB()
	if err != nil {
		_ = closeStmts(s.ws)
		_ = closeDB(w)
		return nil, Errorf(CodeInternal, "open store readers %s: %w", cfg.Path, err)
	}
	s.r, s.rs = r, &readStmts{db: rdb}
	s.startWriter()
	return s, nil
}

// driverName is mattn/go-sqlite3 with the connection settings its DSN has
// no parameter for: temporary storage in memory, where SQLite keeps the
// journal of each write's savepoint under group commit (spilled to a
// temporary file past 64 KiB otherwise; 10% of a recovery scan's time).
const driverName = "sqlite3_ledger"

var registerDriver = sync.OnceFunc(func() {
	sql.Register(driverName, &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
		_, err := c.Exec("PRAGMA temp_store = MEMORY", nil)
		return err
	}})
})

func dsn(cfg Config, readOnly bool) string {
	q := url.Values{}
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", strings.ToUpper(cfg.Synchronous))
	q.Set("_busy_timeout", strconv.FormatInt(cfg.BusyTimeout.Milliseconds(), 10))
	q.Set("_foreign_keys", "on")
	if readOnly {
		q.Set("_query_only", "on")
	} else {
		q.Set("_txlock", "immediate")
	}
	return "file:" + cfg.Path + "?" + q.Encode()
}

func setPool(db *gorm.DB, n int) error {
	sqlDB, err := db.DB()
	if err != nil {
		return Errorf(CodeInternal, "open store: %w", err)
	}
	sqlDB.SetMaxOpenConns(n)
	sqlDB.SetMaxIdleConns(n)
	sqlDB.SetConnMaxLifetime(0)
	return nil
}

func closeDB(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.Close()
}

// Close closes both connection pools.
func (s *GormStore) Close() error {
	s.stopWriter()
	var errs []error
	if s.r != nil {
		errs = append(errs, s.rs.close(), closeDB(s.r))
	}
	errs = append(errs, closeStmts(s.ws), closeDB(s.w))
	if err := errors.Join(errs...); err != nil {
		return Errorf(CodeInternal, "close store: %w", err)
	}
	return nil
}

// migration is one numbered, embedded SQL file.
type migration struct {
	version int
	name    string
	sql     string
	// foreignKeysOff: the file's first line is foreignKeysOffDirective.
	foreignKeysOff bool
}

// foreignKeysOffDirective, as the first line of a migration, runs it with
// foreign keys off: what SQLite's way of changing a table's constraints
// needs (create the new table, copy, drop the old one, rename) when other
// tables refer to it, since dropping it with foreign keys on would delete
// through them or fail. PRAGMA foreign_keys cannot change inside a
// transaction, so the runner turns it off on the writer's connection
// before it begins, checks every reference with PRAGMA foreign_key_check
// before it commits (a dangling one rolls the migration back), and turns it
// on again whatever happened.
const foreignKeysOffDirective = "-- ledger:foreign_keys=off"

// loadMigrations returns the embedded migrations, parsed and checked once
// (readiness probes ask for the schema version on every request).
var loadMigrations = sync.OnceValues(parseMigrations)

func parseMigrations() ([]migration, error) {
	const dir = "migrations/sqlite"
	entries, err := fs.ReadDir(sqliteMigrations, dir)
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: name must start with a positive number and _", e.Name())
		}
		body, err := fs.ReadFile(sqliteMigrations, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		first, _, _ := strings.Cut(string(body), "\n")
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(body),
			foreignKeysOff: strings.TrimSpace(first) == foreignKeysOffDirective})
	}
	slices.SortFunc(ms, func(a, b migration) int { return a.version - b.version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: versions must run 1, 2, 3… without gaps", m.name)
		}
	}
	return ms, nil
}

// SchemaVersion is the schema version this build writes.
func SchemaVersion() int {
	ms, err := loadMigrations()
	if err != nil {
		return 0
	}
	return len(ms)
}

// migrate applies pending migrations, each in its own transaction together
// with its row in schema_migrations.
func (s *GormStore) migrate(ctx context.Context) error {
	ms, err := loadMigrations()
	if err != nil {
		return Errorf(CodeInternal, "load migrations: %w", err)
	}
	db := s.w.WithContext(ctx)
	if err := db.Exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL)`).Error; err != nil {
		return Errorf(CodeInternal, "migrate: %w", err)
	}
	var current int
	if err := db.Raw(`SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current).Error; err != nil {
		return Errorf(CodeInternal, "migrate: read schema version: %w", err)
	}
	if current > len(ms) {
		return Errorf(CodeUnsupportedVersion,
			"database schema version %d is newer than this build of ledger understands (%d): upgrade ledger, or open a copy made by this version",
			current, len(ms))
	}
	// Migration files hold several statements; prepared statements (which
	// GORM uses) compile only the first, so they run on database/sql.
	sqlDB, err := s.w.DB()
	if err != nil {
		return Errorf(CodeInternal, "migrate: %w", err)
	}
	for _, m := range ms[current:] {
		if err := applyMigration(ctx, sqlDB, m, s.now()); err != nil {
			return Errorf(CodeInternal, "migrate: apply %s: %w", m.name, err)
		}
	}
	return nil
}

// applyMigration applies m in one transaction together with its row in
// schema_migrations, on one connection of db (the writer's only one), with
// foreign keys off around the transaction if m asks for it.
func applyMigration(ctx context.Context, db *sql.DB, m migration, now time.Time) (err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, conn.Close()) }()
	if m.foreignKeysOff {
		if _, err := conn.ExecContext(ctx, `PRAGMA foreign_keys = OFF`); err != nil {
			return err
		}
		defer func() {
			// On this connection whatever happened, even on a cancelled
			// ctx: the pool keeps it, and every later write relies on it.
			if _, onErr := conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA foreign_keys = ON`); onErr != nil {
				err = errors.Join(err, fmt.Errorf("turn foreign keys on again: %w", onErr))
			}
		}()
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, m.sql); err != nil {
		return err
	}
	if m.foreignKeysOff {
		if err := checkForeignKeys(ctx, tx); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
		m.version, m.name, now.UnixMicro()); err != nil {
		return err
	}
	return tx.Commit()
}

// checkForeignKeys fails if any row of the database refers to a row that
// does not exist, naming the first.
func checkForeignKeys(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `PRAGMA foreign_key_check`)
	if err != nil {
		return err
	}
	defer func() { _ = rows.Close() }()
	if rows.Next() {
		var (
			table, parent string
			rowid         sql.NullInt64
			fk            int
		)
		if err := rows.Scan(&table, &rowid, &parent, &fk); err != nil {
			return err
		}
		return fmt.Errorf("foreign key check: row %d of %s refers to a missing row of %s", rowid.Int64, table, parent)
	}
	return rows.Err()
}

// CurrentSchemaVersion returns the schema version recorded in the database.
func (s *GormStore) CurrentSchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.r.WithContext(ctx).Raw(`SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v).Error; err != nil {
		return 0, Errorf(CodeInternal, "read schema version: %w", err)
	}
	return v, nil
}

// txn is one write transaction: the GORM handle and the same transaction
// for the prepared hot statements (stmts.go), one "now" for every row and
// event it writes, and the id generator.
type txn struct {
	db    *gorm.DB
	ctx   context.Context
	sql   *sql.Tx
	stmts []*sql.Stmt
	now   time.Time
	newID NewIDFunc
	// heads caches the chain heads this write moved; flushHeads writes
	// them to the runs once the write is done (events.go), signed by
	// signer if there is one.
	heads  map[RunID]*chainHead
	signer *signer
}

// wrapErr gives err the op as context and makes sure it is an *Error; GORM
// errors are translated here and nowhere else.
func wrapErr(op string, err error) error {
	var e *Error
	switch {
	case errors.As(err, &e):
		return &Error{Code: e.Code, Message: op + ": " + err.Error(), Err: err}
	case errors.Is(err, gorm.ErrRecordNotFound):
		return &Error{Code: CodeNotFound, Message: op + ": not found", Err: err}
	case errors.Is(err, gorm.ErrDuplicatedKey):
		return &Error{Code: CodeConflict, Message: op + ": already exists", Err: err}
	case errors.Is(err, gorm.ErrForeignKeyViolated):
		return &Error{Code: CodeInvalid, Message: op + ": refers to a missing object", Err: err}
	default:
		return &Error{Code: CodeInternal, Message: op + ": " + err.Error(), Err: err}
	}
}
