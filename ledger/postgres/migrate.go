package postgres

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one numbered, embedded SQL file.
type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations returns the embedded migrations, parsed and checked once.
var loadMigrations = sync.OnceValues(parseMigrations)

func parseMigrations() ([]migration, error) {
	const dir = "migrations"
	entries, err := fs.ReadDir(migrationFiles, dir)
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
		body, err := fs.ReadFile(migrationFiles, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(body)})
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

// migrationLock is the key of the advisory lock the migration transaction
// holds (advisory locks are per database): "ledger" in ASCII.
const migrationLock int64 = 0x6c6564676572

// migrate applies the pending migrations in one transaction that first
// takes the migration lock, so processes opening the same database at once
// migrate it one after another: the first applies the files, the others
// find them applied. Each file is applied together with its row in
// schema_migrations; PostgreSQL's DDL is transactional, so a failure leaves
// the database as it was. A database newer than this build is refused
// before anything is written, and the transaction (with the
// schema_migrations it may have created) is rolled back.
func (d *Driver) migrate(ctx context.Context) error {
	ms, err := loadMigrations()
	if err != nil {
		return ledger.Errorf(ledger.CodeInternal, "load migrations: %w", err)
	}
	err = d.db.WithContext(ctx).Transaction(func(db *gorm.DB) error {
		if err := db.Exec(`SELECT pg_advisory_xact_lock(?)`, migrationLock).Error; err != nil {
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if err := db.Exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			name       TEXT    NOT NULL,
			applied_at BIGINT  NOT NULL)`).Error; err != nil {
			return err
		}
		var current int
		if err := db.Raw(`SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Row().Scan(&current); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if current > len(ms) {
			return ledger.Errorf(ledger.CodeUnsupportedVersion,
				"database schema version %d is newer than this build of ledger understands (%d): upgrade ledger, or open a copy made by this version",
				current, len(ms))
		}
		sqlTx, err := sqlTxOf(db)
		if err != nil {
			return err
		}
		for _, m := range ms[current:] {
			// A file holds several statements: it runs through the simple
			// query protocol, as one string without arguments.
			if _, err := sqlTx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("apply %s: %w", m.name, err)
			}
			if err := db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
				m.version, m.name, d.now().UnixMicro()).Error; err != nil {
				return fmt.Errorf("record %s: %w", m.name, err)
			}
		}
		return nil
	})
	return wrapErr("migrate", err)
}

// sqlTxOf is the database/sql transaction a GORM transaction runs on.
func sqlTxOf(db *gorm.DB) (*sql.Tx, error) {
	t, ok := db.Statement.ConnPool.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("not in a database/sql transaction but on %T", db.Statement.ConnPool)
	}
	return t, nil
}
