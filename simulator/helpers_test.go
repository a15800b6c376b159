package simulator_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/simulator"
)

// clock is a fake clock tests advance by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// openStore opens an effect store on a file in dir, closed at the end of
// the test.
func openStore(t *testing.T, path string, now func() time.Time) *simulator.EffectStore {
	t.Helper()
	s, err := simulator.OpenEffectStore(context.Background(), path, now)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// setup is a fresh store on a temp file with a fake clock.
type setup struct {
	path  string
	clock *clock
	store *simulator.EffectStore
}

func newSetup(t *testing.T) setup {
	t.Helper()
	path := filepath.Join(t.TempDir(), "effects.db")
	c := newClock()
	return setup{path: path, clock: c, store: openStore(t, path, c.Now)}
}

// bool pointer and int64 pointer helpers for configs.
func ptr[T any](v T) *T { return &v }

// writeTool returns cards.write under the given guarantees and config.
func writeTool(s *simulator.EffectStore, g simulator.ToolConfig) *simulator.Tool {
	return simulator.NewTool(simulator.CardsWriteDescriptor(), s, g)
}

const cardsArgs = `{"title":"Rust","cards":[{"front":"Q1","back":"A1"},{"front":"Q2","back":"A2"}]}`

func call(key string, attempt int64) engine.Call {
	return engine.Call{DedupKey: key, Attempt: attempt, Arguments: []byte(cardsArgs)}
}

func effectCount(t *testing.T, s *simulator.EffectStore, key string) int {
	t.Helper()
	n, err := s.CountEffects(context.Background(), key)
	require.NoError(t, err)
	return n
}
