package migrate_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"testing/fstest"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/migrate"
)

func files(names map[string]string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for name, body := range names {
		fsys["m/"+name] = &fstest.MapFile{Data: []byte(body)}
	}
	return fsys
}

func TestEmbeddedParsesInVersionOrder(t *testing.T) {
	set := migrate.Embedded(files(map[string]string{
		"0002_more.sql": "CREATE TABLE b (x INTEGER);",
		"0001_init.sql": "-- a directive\nCREATE TABLE a (x INTEGER);",
	}), "m")
	ms, err := set.Load()
	require.NoError(t, err)
	require.Equal(t, []migrate.Migration{
		{Version: 1, Name: "0001_init.sql", SQL: "-- a directive\nCREATE TABLE a (x INTEGER);"},
		{Version: 2, Name: "0002_more.sql", SQL: "CREATE TABLE b (x INTEGER);"},
	}, ms)
	require.Equal(t, 2, set.Latest())
	require.Equal(t, "-- a directive", ms[0].FirstLine())
}

func TestEmbeddedRefusesGapsAndUnnumberedFiles(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"a gap":         files(map[string]string{"0001_a.sql": "", "0003_c.sql": ""}),
		"no number":     files(map[string]string{"0001_a.sql": "", "init.sql": ""}),
		"number zero":   files(map[string]string{"0000_a.sql": ""}),
		"no underscore": files(map[string]string{"0001.sql": ""}),
	} {
		t.Run(name, func(t *testing.T) {
			set := migrate.Embedded(fsys, "m")
			_, err := set.Load()
			require.Error(t, err)
			require.Zero(t, set.Latest())
			require.Equal(t, ledger.CodeInternal, ledger.Code(migrate.Run(context.Background(), set, nil)))
		})
	}
}

// target applies each migration in a transaction of its own on a real
// SQLite database, as a driver does, and counts what it applied.
type target struct {
	db      *sql.DB
	applied []string
}

func (d *target) Version(ctx context.Context) (int, error) {
	var v int
	err := d.db.QueryRowContext(ctx, migrate.VersionSQL).Scan(&v)
	return v, err
}

func (d *target) Apply(ctx context.Context, m migrate.Migration) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, migrate.RecordSQL, m.Version, m.Name, 1); err != nil {
		return err
	}
	d.applied = append(d.applied, m.Name)
	return tx.Commit()
}

func open(t *testing.T) *target {
	db, err := sql.Open("sqlite3", filepath.Join(t.TempDir(), "m.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`)
	require.NoError(t, err)
	return &target{db: db}
}

func TestRunAppliesWhatIsMissingInOrder(t *testing.T) {
	ctx := context.Background()
	d := open(t)
	two := migrate.Embedded(files(map[string]string{
		"0001_a.sql": "CREATE TABLE a (x INTEGER);",
		"0002_b.sql": "CREATE TABLE b (x INTEGER); INSERT INTO b VALUES (1);",
	}), "m")
	require.NoError(t, migrate.Run(ctx, two, d))
	require.Equal(t, []string{"0001_a.sql", "0002_b.sql"}, d.applied)
	require.NoError(t, migrate.Run(ctx, two, d))
	require.Len(t, d.applied, 2, "nothing applied again")

	three := migrate.Embedded(files(map[string]string{
		"0001_a.sql": "CREATE TABLE a (x INTEGER);",
		"0002_b.sql": "CREATE TABLE b (x INTEGER); INSERT INTO b VALUES (1);",
		"0003_c.sql": "CREATE TABLE c (x INTEGER);",
	}), "m")
	require.NoError(t, migrate.Run(ctx, three, d))
	require.Equal(t, []string{"0001_a.sql", "0002_b.sql", "0003_c.sql"}, d.applied, "only the new one")
	v, err := d.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, v)
}

func TestRunRefusesANewerDatabaseBeforeWriting(t *testing.T) {
	ctx := context.Background()
	d := open(t)
	_, err := d.db.Exec(migrate.RecordSQL, 5, "0005_future.sql", 1)
	require.NoError(t, err)
	set := migrate.Embedded(files(map[string]string{"0001_a.sql": "CREATE TABLE a (x INTEGER);"}), "m")
	err = migrate.Run(ctx, set, d)
	require.Equal(t, ledger.CodeUnsupportedVersion, ledger.Code(err))
	require.ErrorContains(t, err, "database schema version 5 is newer than this build of ledger understands (1)")
	require.Empty(t, d.applied)
}

func TestRunStopsAtAFailedFileAndNamesIt(t *testing.T) {
	ctx := context.Background()
	d := open(t)
	set := migrate.Embedded(files(map[string]string{
		"0001_a.sql":   "CREATE TABLE a (x INTEGER);",
		"0002_bad.sql": "CREATE TABLE b (x INTEGER); INSERT INTO nowhere VALUES (1);",
		"0003_c.sql":   "CREATE TABLE c (x INTEGER);",
	}), "m")
	err := migrate.Run(ctx, set, d)
	require.ErrorContains(t, err, "apply 0002_bad.sql: ")
	require.Equal(t, []string{"0001_a.sql"}, d.applied)
	v, err := d.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, v, "the failed file is not recorded, and the next not run")
}
