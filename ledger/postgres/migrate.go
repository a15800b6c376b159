package postgres

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrations are the embedded migrations.
var migrations = migrate.Embedded(migrationFiles, "migrations")

// SchemaVersion is the schema version this build writes.
func SchemaVersion() int { return migrations.Latest() }

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
	err := d.db.WithContext(ctx).Transaction(func(db *gorm.DB) error {
		if err := db.Exec(`SELECT pg_advisory_xact_lock(?)`, migrationLock).Error; err != nil {
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if err := db.Exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			name       TEXT    NOT NULL,
			applied_at BIGINT  NOT NULL)`).Error; err != nil {
			return err
		}
		sqlTx, err := sqlTxOf(db)
		if err != nil {
			return err
		}
		return migrate.Run(ctx, migrations, migrator{db: db, tx: sqlTx, now: d.now()})
	})
	return wrapErr("migrate", err)
}

// migrator is the migrate.Target of the migration transaction, under the
// migration lock.
type migrator struct {
	db  *gorm.DB
	tx  *sql.Tx // the same transaction, on database/sql
	now time.Time
}

func (m migrator) Version(context.Context) (int, error) {
	var v int
	err := m.db.Raw(migrate.VersionSQL).Row().Scan(&v)
	return v, err
}

func (m migrator) Apply(ctx context.Context, mig migrate.Migration) error {
	// A file holds several statements: it runs through the simple query
	// protocol, as one string without arguments.
	if _, err := m.tx.ExecContext(ctx, mig.SQL); err != nil {
		return err
	}
	if err := m.db.Exec(migrate.RecordSQL, mig.Version, mig.Name, m.now.UnixMicro()).Error; err != nil {
		return fmt.Errorf("record %s: %w", mig.Name, err)
	}
	return nil
}

// sqlTxOf is the database/sql transaction a GORM transaction runs on.
func sqlTxOf(db *gorm.DB) (*sql.Tx, error) {
	t, ok := db.Statement.ConnPool.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("not in a database/sql transaction but on %T", db.Statement.ConnPool)
	}
	return t, nil
}
