package sqlite

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-sqlite3"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/migrate"
)

//go:embed migrations/*.sql
var sqliteMigrations embed.FS

// Config opens a Driver.
type Config struct {
	// Path is the SQLite database file; it is created if missing.
	Path string
	// Now is the clock of migrations' applied_at and of commit durations;
	// nil means time.Now.
	Now func() time.Time
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
	// with the write's number n (1 for the first write this Driver runs,
	// counted in the order the writes run, failed ones included) at each
	// WritePoint of the write, on the goroutine that runs its commit, so it
	// may kill the process there. An error it returns at
	// WriteBeforeCommit fails that write alone, as a full disk would: its
	// statements are rolled back and its caller gets the error as
	// CodeInternal; at WriteAfterCommit the error is ignored. Nil, the
	// default, costs nothing.
	WriteFaultFunc func(n int64, at ledger.WritePoint) error
	// NewID, SigningKey and Observe are the ledger's (ledger.Options), for
	// OpenStore; Open ignores them.
	NewID      ledger.NewIDFunc
	SigningKey ed25519.PrivateKey
	Observe    ledger.ObserveFunc
	// OnCommit, if set, is told of every group commit once it has ended:
	// how many writes it held and how long its transaction took, BEGIN to
	// the end of COMMIT, on the clock Now (metrics). It runs on the
	// committing goroutine after every caller of the batch was answered:
	// keep it quick, and do not call the Driver from it.
	OnCommit func(ledger.CommitStats)
}

// Driver is the ledger's storage on GORM and SQLite. It keeps one writer
// connection (all write transactions begin IMMEDIATE, so a read-then-write
// never fails halfway with SQLITE_BUSY, and writes of other processes on
// the same file wait their turn) and a pool of query-only readers; WAL
// lets them read while the writer commits.
type Driver struct {
	w, r *gorm.DB
	// now is Config.Now in UTC microseconds; clock is Config.Now
	// untruncated, so commit durations keep its monotonic reading;
	// onCommit is Config.OnCommit.
	now      func() time.Time
	clock    func() time.Time
	onCommit func(ledger.CommitStats)
	wr       *writer // group commit (groupcommit.go)
	// writeFaultFunc is Config.WriteFaultFunc; writes counts the writes
	// run so far, under the writer lock (groupcommit.go).
	writeFaultFunc func(n int64, at ledger.WritePoint) error
	writes         int64
	// wc is the writer's one connection, held from Open to Close: every
	// write transaction runs on it (groupcommit.go), and wg is GORM on it.
	// ws are the declared statements, prepared on wc; rs the read
	// statements of the reader pool (stmts.go).
	wc *sql.Conn
	wg *gorm.DB
	ws []*sql.Stmt
	rs *readStmts
}

var _ ledger.Driver = (*Driver)(nil)

// Open opens (creating if needed) the database at cfg.Path and applies
// pending migrations. A database whose schema is newer than this build is
// refused with CodeUnsupportedVersion and left untouched.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Path == "" {
		return nil, ledger.Errorf(ledger.CodeInvalid, "open store: no database path")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	now := func() time.Time { return cfg.Now().UTC().Truncate(time.Microsecond) }
	if cfg.BusyTimeout == 0 {
		cfg.BusyTimeout = 5 * time.Second
	}
	if cfg.Synchronous == "" {
		cfg.Synchronous = "FULL"
	}
	if !slices.Contains([]string{"OFF", "NORMAL", "FULL", "EXTRA"}, strings.ToUpper(cfg.Synchronous)) {
		return nil, ledger.Errorf(ledger.CodeInvalid, "open store: synchronous must be OFF, NORMAL, FULL or EXTRA, not %q", cfg.Synchronous)
	}
	if cfg.ReadConns == 0 {
		cfg.ReadConns = 4
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
		return nil, ledger.Errorf(ledger.CodeInternal, "open store %s: %w", cfg.Path, err)
	}
	s := &Driver{w: w, now: now, clock: cfg.Now, onCommit: cfg.OnCommit, writeFaultFunc: cfg.WriteFaultFunc}
	if err := setPool(w, 1); err != nil {
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		_ = closeDB(w)
		return nil, err
	}
	if err := s.holdWriter(ctx); err != nil {
		_ = closeDB(w)
		return nil, ledger.Errorf(ledger.CodeInternal, "open store %s: %w", cfg.Path, err)
	}
	// Readers open after migration so they find the WAL files in place.
	r, err := gorm.Open(sqlite.New(sqlite.Config{DriverName: driverName, DSN: dsn(cfg, true)}), gcfg())
	if err != nil {
		_ = closeDB(w)
		return nil, ledger.Errorf(ledger.CodeInternal, "open store readers %s: %w", cfg.Path, err)
	}
	if err := setPool(r, cfg.ReadConns); err != nil {
		_ = s.releaseWriter()
		_ = closeDB(w)
		return nil, err
	}
	rdb, err := r.DB()
	if err != nil {
		_ = s.releaseWriter()
		_ = closeDB(w)
		return nil, ledger.Errorf(ledger.CodeInternal, "open store readers %s: %w", cfg.Path, err)
	}
	s.r, s.rs = r, &readStmts{db: rdb}
	s.startWriter()
	return s, nil
}

// OpenStore opens the Driver at cfg.Path and the ledger over it, with
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

// holdWriter takes the writer pool's one connection for good and prepares
// the declared statements on it, once the migrations are done (they run
// on the pool).
func (s *Driver) holdWriter(ctx context.Context) error {
	wdb, err := s.w.DB()
	if err != nil {
		return err
	}
	wc, err := wdb.Conn(ctx)
	if err != nil {
		return err
	}
	ws, err := prepareWrites(ctx, wc)
	if err != nil {
		return errors.Join(err, wc.Close())
	}
	// GORM on the same connection, for the statements that are not
	// declared; it opens no transaction of its own (SkipDefaultTransaction).
	wg := s.w.Session(&gorm.Session{NewDB: true, Context: context.Background()}) // its own Statement, not s.w's
	wg.Statement.ConnPool = wc
	s.wc, s.wg, s.ws = wc, wg, ws
	return nil
}

// releaseWriter closes the writer's statements and gives its connection
// back to the pool.
func (s *Driver) releaseWriter() error {
	if s.wc == nil {
		return nil
	}
	err := errors.Join(closeStmts(s.ws), s.wc.Close())
	s.wc, s.wg, s.ws = nil, nil, nil
	return err
}

func setPool(db *gorm.DB, n int) error {
	sqlDB, err := db.DB()
	if err != nil {
		return ledger.Errorf(ledger.CodeInternal, "open store: %w", err)
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
func (s *Driver) Close() error {
	s.stopWriter()
	var errs []error
	if s.r != nil {
		errs = append(errs, s.rs.close(), closeDB(s.r))
	}
	errs = append(errs, s.releaseWriter(), closeDB(s.w))
	if err := errors.Join(errs...); err != nil {
		return ledger.Errorf(ledger.CodeInternal, "close store: %w", err)
	}
	return nil
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

// foreignKeysOff reports whether m asks to run with foreign keys off.
func foreignKeysOff(m migrate.Migration) bool { return m.FirstLine() == foreignKeysOffDirective }

// migrations are the embedded migrations.
var migrations = migrate.Embedded(sqliteMigrations, "migrations")

// SchemaVersion is the schema version this build writes.
func SchemaVersion() int { return migrations.Latest() }

// migrate applies pending migrations, each in its own transaction together
// with its row in schema_migrations (migrator).
func (s *Driver) migrate(ctx context.Context) error {
	db := s.w.WithContext(ctx)
	if err := db.Exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL)`).Error; err != nil {
		return ledger.Errorf(ledger.CodeInternal, "migrate: %w", err)
	}
	// Migration files hold several statements; prepared statements (which
	// GORM uses) compile only the first, so they run on database/sql.
	sqlDB, err := s.w.DB()
	if err != nil {
		return ledger.Errorf(ledger.CodeInternal, "migrate: %w", err)
	}
	err = migrate.Run(ctx, migrations, migrator{db: db, sqlDB: sqlDB, now: s.now()})
	var e *ledger.Error
	if err != nil && !errors.As(err, &e) {
		return ledger.Errorf(ledger.CodeInternal, "migrate: %w", err)
	}
	return err
}

// migrator is the migrate.Target of the writer's pool, before the Driver
// holds its one connection.
type migrator struct {
	db    *gorm.DB
	sqlDB *sql.DB
	now   time.Time
}

func (m migrator) Version(context.Context) (int, error) {
	var v int
	err := m.db.Raw(migrate.VersionSQL).Scan(&v).Error
	return v, err
}

func (m migrator) Apply(ctx context.Context, mig migrate.Migration) error {
	return applyMigration(ctx, m.sqlDB, mig, m.now)
}

// applyMigration applies m in one transaction together with its row in
// schema_migrations, on one connection of db (the writer's only one), with
// foreign keys off around the transaction if m asks for it; if another
// process applied m meanwhile, it does nothing, so that several processes
// may open (and migrate) one database at once.
func applyMigration(ctx context.Context, db *sql.DB, m migrate.Migration, now time.Time) (err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, conn.Close()) }()
	fkOff := foreignKeysOff(m)
	if fkOff {
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
	// Another process may have applied m since this one read the schema
	// version: the transaction is IMMEDIATE, so what it reads now stays
	// true until it commits.
	var applied int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, m.Version).Scan(&applied); err != nil {
		return err
	}
	if applied > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	if fkOff {
		if err := checkForeignKeys(ctx, tx); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, migrate.RecordSQL, m.Version, m.Name, now.UnixMicro()); err != nil {
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

// SchemaVersion implements ledger.Driver.
func (s *Driver) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.r.WithContext(ctx).Raw(migrate.VersionSQL).Scan(&v).Error; err != nil {
		return 0, ledger.Errorf(ledger.CodeInternal, "read schema version: %w", err)
	}
	return v, nil
}

// LatestSchemaVersion implements ledger.Driver.
func (s *Driver) LatestSchemaVersion() int { return SchemaVersion() }

// Reader implements ledger.Driver: the reader pool, each statement on its
// own.
func (s *Driver) Reader() ledger.Reader {
	return reader{c: conn{
		db: s.r,
		query: func(ctx context.Context, st *stmt, args ...any) (*sql.Rows, error) {
			return s.rs.query(ctx, st.sql, args...)
		},
		snap: func(ctx context.Context, fn func(*gorm.DB) error) error {
			return s.r.WithContext(ctx).Transaction(fn)
		},
	}}
}

// Read implements ledger.Driver: one read transaction of the pool, which
// on WAL sees one snapshot from its first read to its end.
func (s *Driver) Read(ctx context.Context, fn func(ledger.Reader) error) error {
	return translate(s.r.WithContext(ctx).Transaction(func(db *gorm.DB) error {
		return fn(snapshotReader(db))
	}))
}

// snapshotReader reads on db, a read transaction. Its statements run
// without the caller's cancellation, checked before each (see ListEvents):
// database/sql still closes a transaction's rows when the context it began
// with is done.
func snapshotReader(db *gorm.DB) reader {
	return reader{c: conn{
		db: db,
		query: func(ctx context.Context, st *stmt, args ...any) (*sql.Rows, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return db.WithContext(context.WithoutCancel(ctx)).Raw(st.sql, args...).Rows()
		},
		snap: func(ctx context.Context, fn func(*gorm.DB) error) error { return fn(db.WithContext(ctx)) },
	}}
}

// translate makes err an *ledger.Error: the ledger's own pass through;
// GORM's translated errors and SQLite's constraint errors, from whichever
// path raised them, get their code; anything else is CodeInternal.
func translate(err error) error {
	if err == nil {
		return nil // before the targets of errors.As below, which escape: every statement passes here
	}
	var (
		e  *ledger.Error
		se sqlite3.Error
	)
	switch {
	case errors.As(err, &e):
		return err
	case errors.Is(err, gorm.ErrRecordNotFound):
		return &ledger.Error{Code: ledger.CodeNotFound, Message: "not found", Err: err}
	case errors.Is(err, gorm.ErrDuplicatedKey):
		return &ledger.Error{Code: ledger.CodeConflict, Message: "already exists", Err: err}
	case errors.Is(err, gorm.ErrForeignKeyViolated):
		return &ledger.Error{Code: ledger.CodeInvalid, Message: "refers to a missing object", Err: err}
	case errors.As(err, &se) && se.Code == sqlite3.ErrConstraint:
		switch se.ExtendedCode {
		case sqlite3.ErrConstraintUnique, sqlite3.ErrConstraintPrimaryKey:
			return &ledger.Error{Code: ledger.CodeConflict, Message: "already exists: " + err.Error(), Err: err}
		case sqlite3.ErrConstraintForeignKey:
			return &ledger.Error{Code: ledger.CodeInvalid, Message: "refers to a missing object: " + err.Error(), Err: err}
		default:
			return &ledger.Error{Code: ledger.CodeInvalid, Message: "breaks a constraint: " + err.Error(), Err: err}
		}
	default:
		return &ledger.Error{Code: ledger.CodeInternal, Message: err.Error(), Err: err}
	}
}
