// Package ledgertest opens real Stores on SQLite files in t.TempDir() and
// provides a fake clock, sequential ids and fixtures for tests; the fixtures
// (SubmitRun, RunningRun, Action) also work on any ledger.Store. It is for
// tests only.
package ledgertest

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
)

// Clock is a fake clock that moves only when told to.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock set to a fixed instant.
func NewClock() *Clock {
	return &Clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// SequentialIDs returns a NewIDFunc making prefix_<26 digits>, counting up
// from 1, so ids in golden files and assertions are stable.
func SequentialIDs() ledger.NewIDFunc {
	var mu sync.Mutex
	n := 0
	return func(prefix string) string {
		mu.Lock()
		defer mu.Unlock()
		n++
		return fmt.Sprintf("%s_%026d", prefix, n)
	}
}

// Bundle is what OpenStore returns.
type Bundle struct {
	Store *ledger.DB
	Clock *Clock
	Path  string
}

// OpenStore opens a Store on a new SQLite file in tb.TempDir(), with a fake
// clock and sequential ids, and closes it when the test ends.
func OpenStore(tb testing.TB) *Bundle {
	tb.Helper()
	return OpenStoreAt(tb, filepath.Join(tb.TempDir(), "ledger.db"), NewClock())
}

// OpenStoreAt opens a Store on path with the given clock and real ULIDs (so
// several stores on one file never collide), closing it when the test ends.
func OpenStoreAt(tb testing.TB, path string, clock *Clock) *Bundle {
	tb.Helper()
	return openStore(tb, sqlite.Config{Path: path, Now: clock.Now}, clock)
}

// OpenStoreWith is OpenStore with a last say on the store's configuration
// (a hook such as OnCommit); tune may not change Now.
func OpenStoreWith(tb testing.TB, tune func(*sqlite.Config)) *Bundle {
	tb.Helper()
	clock := NewClock()
	cfg := sqlite.Config{Path: filepath.Join(tb.TempDir(), "ledger.db"), Now: clock.Now}
	tune(&cfg)
	return openStore(tb, cfg, clock)
}

func openStore(tb testing.TB, cfg sqlite.Config, clock *Clock) *Bundle {
	tb.Helper()
	s, err := sqlite.OpenStore(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return &Bundle{Store: s, Clock: clock, Path: cfg.Path}
}

// SubmitRun submits a run with a fresh key and default content.
func (b *Bundle) SubmitRun(tb testing.TB, key string, budgets ledger.BudgetLimits) *ledger.Run {
	tb.Helper()
	return SubmitRun(tb, b.Store, key, budgets)
}

// RunningRun submits a run and moves it to running.
func (b *Bundle) RunningRun(tb testing.TB, key string, budgets ledger.BudgetLimits) *ledger.Run {
	tb.Helper()
	return RunningRun(tb, b.Store, key, budgets)
}

// Action records a cards.write action on run with the given gate.
func (b *Bundle) Action(tb testing.TB, run ledger.RunID, key string, gate ledger.ActionState) ledger.CreateActionResult {
	tb.Helper()
	return Action(tb, b.Store, run, key, gate)
}

// SubmitRun submits a run to s (tenant acme, principal alice, agent
// practice-cards) with a fresh key and default content.
func SubmitRun(tb testing.TB, s ledger.Store, key string, budgets ledger.BudgetLimits) *ledger.Run {
	tb.Helper()
	res, err := s.SubmitRun(context.Background(), ledger.SubmitRunParams{
		Tenant: "acme", IdempotencyKey: key, Principal: "alice", Agent: "practice-cards",
		Input: json.RawMessage(`{"title":"t","markdown":"# a"}`), Budgets: budgets,
	})
	if err != nil {
		tb.Fatalf("submit run: %v", err)
	}
	return res.Run
}

// RunningRun submits a run to s and moves it to running.
func RunningRun(tb testing.TB, s ledger.Store, key string, budgets ledger.BudgetLimits) *ledger.Run {
	tb.Helper()
	run := SubmitRun(tb, s, key, budgets)
	run, err := s.TransitionRun(context.Background(), ledger.RunTransition{
		ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "worker"})
	if err != nil {
		tb.Fatalf("run → running: %v", err)
	}
	return run
}

// Action records on s a cards.write action of run with the given gate
// (and an approval TTL of one hour).
func Action(tb testing.TB, s ledger.Store, run ledger.RunID, key string, gate ledger.ActionState) ledger.CreateActionResult {
	tb.Helper()
	res, err := s.CreateAction(context.Background(), ledger.CreateActionParams{
		RunID: run, IdempotencyKey: key, Tool: "cards.write", ToolVersion: "1", Effect: ledger.EffectWrite,
		Arguments: json.RawMessage(`{"cards":[{"front":"q","back":"a"}]}`), Gate: gate, ApprovalTTL: time.Hour,
		Actor: "engine",
	})
	if err != nil {
		tb.Fatalf("create action: %v", err)
	}
	return res
}

// LegacyCancellation writes, with raw SQL beside the Store, the row an
// older build could leave behind (InsertLegacyCancellation) and returns
// its id.
func (b *Bundle) LegacyCancellation(tb testing.TB, run ledger.RunID, state ledger.CancellationState) ledger.CancellationID {
	tb.Helper()
	return InsertLegacyCancellation(tb, SQLiteFile(tb, b.Path), b.Clock.Now, run, state)
}

// ColumnsHolding opens the SQLite file at path raw and returns every
// table.column (sorted) holding s in any row (ColumnsIn).
func ColumnsHolding(tb testing.TB, path, s string) []string {
	tb.Helper()
	return ColumnsIn(tb, SQLiteFile(tb, path), s)
}

// Dump opens the SQLite file at path raw, read-only, and returns every row
// of every table but schema_migrations (whose rows carry the time the file
// was made) as text: one line per row, tables in name order, rows in
// rowid order, each column as name=value (NULL for SQL NULL). Two runs of
// the same writes with the same clock and ids give the same dump, so a
// test can hold what a change writes to what the code wrote before it,
// byte for byte.
func Dump(tb testing.TB, path string) string {
	tb.Helper()
	db := SQLiteFile(tb, path)
	tables, err := db.Tables(context.Background())
	require.NoError(tb, err)
	var b strings.Builder
	for _, table := range tables {
		if table == "schema_migrations" {
			continue
		}
		eachRow(tb, db, fmt.Sprintf(`SELECT * FROM "%s" ORDER BY rowid`, table), func(cols []string, vals []any) {
			b.WriteString(table)
			for i, v := range vals {
				b.WriteString(" " + cols[i] + "=")
				switch x := v.(type) {
				case nil:
					b.WriteString("NULL")
				case []byte:
					b.WriteString(strconv.Quote(string(x)))
				case string:
					b.WriteString(strconv.Quote(x))
				default:
					fmt.Fprint(&b, x)
				}
			}
			b.WriteByte('\n')
		})
	}
	return b.String()
}
