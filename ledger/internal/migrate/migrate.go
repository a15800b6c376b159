package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/actionledger/ledger/ledger"
)

// Statements on schema_migrations, the same in both dialects. The table
// itself is created by each driver, in its own column types.
const (
	// VersionSQL reads the schema version the database records: 0 for none.
	VersionSQL = `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`
	// RecordSQL records a migration (version, name, applied_at in unix
	// microseconds) as applied.
	RecordSQL = `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`
)

// Migration is one numbered, embedded SQL file.
type Migration struct {
	// Version is the file's number, 1 for the first.
	Version int
	// Name is the file's name, recorded with it.
	Name string
	// SQL is the file's text: one statement or several.
	SQL string
}

// FirstLine is the migration's first line, trimmed: where a driver reads
// a directive of its own.
func (m Migration) FirstLine() string {
	first, _, _ := strings.Cut(m.SQL, "\n")
	return strings.TrimSpace(first)
}

// Set is a driver's embedded migrations, parsed and checked on first use
// only (readiness probes ask for the schema version on every request).
type Set struct {
	load func() ([]Migration, error)
}

// Embedded is the set of the files of dir in fsys, named <n>_<what>.sql and
// numbered 1, 2, 3… without gaps.
func Embedded(fsys fs.FS, dir string) *Set {
	return &Set{load: sync.OnceValues(func() ([]Migration, error) { return parse(fsys, dir) })}
}

// Load returns the set's migrations in version order.
func (s *Set) Load() ([]Migration, error) { return s.load() }

// Latest is the schema version the set writes: its last migration's; 0 if
// the files do not parse.
func (s *Set) Latest() int {
	ms, err := s.load()
	if err != nil {
		return 0
	}
	return len(ms)
}

func parse(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: name must start with a positive number and _", e.Name())
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(body)})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: versions must run 1, 2, 3… without gaps", m.Name)
		}
	}
	return ms, nil
}

// Target is the database Run migrates, under the driver's locking.
type Target interface {
	// Version is the schema version the database records (VersionSQL).
	Version(ctx context.Context) (int, error)
	// Apply applies m and records it (RecordSQL) at once: both or
	// neither. If m turns out to be applied already (by another process
	// since Version), it does nothing.
	Apply(ctx context.Context, m Migration) error
}

// Run applies the migrations of set that db does not record yet, in
// order. A database newer than set is CodeUnsupportedVersion, before
// anything is written. Other errors name their step; the driver gives
// them their code.
func Run(ctx context.Context, set *Set, db Target) error {
	ms, err := set.Load()
	if err != nil {
		return ledger.Errorf(ledger.CodeInternal, "load migrations: %w", err)
	}
	current, err := db.Version(ctx)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current > len(ms) {
		return ledger.Errorf(ledger.CodeUnsupportedVersion,
			"database schema version %d is newer than this build of ledger understands (%d): upgrade ledger, or open a copy made by this version",
			current, len(ms))
	}
	for _, m := range ms[current:] {
		if err := db.Apply(ctx, m); err != nil {
			return fmt.Errorf("apply %s: %w", m.Name, err)
		}
	}
	return nil
}
