package storehealth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// Defaults of Config.
const (
	DefaultLogInterval = 10 * time.Second
	DefaultHold        = 2 * time.Second
)

// Tracker follows the operations of the ledger store it observes
// (Observe, the store's ledger.Options.Observe): it counts the store's
// failures by operation, and knows whether writes fail now, so /readyz can
// say so and a full disk is seen. Writes fail from the first failed write
// until a write succeeds with no write failed for Hold: a disk that is
// nearly full lets some writes through (SQLite reuses its WAL after a
// checkpoint), and one lucky write must not make the store look sound.
// Once Hold has passed without a failed write, a probe write is due
// (ProbeDue, ledger.Store.ProbeWrite), so that a process with nothing else
// to write does not stay failing.
//
// A failure is an error the store could not help (IsFailure). The domain's
// own answers (a lost race is CodeConflict, an unknown id CodeNotFound,
// and the other codes) mean the database answered: they are not failures,
// and, since they may be answered without writing, not successes either.
// Nor is a write that succeeds without changing anything (ledger.Op.Wrote
// clear): a replayed submit, a duplicate action, an existing cancellation,
// an expiry pass with nothing due, a recovery that records nothing, a
// claim of no run. Errors of a cancelled context are neither. A read that
// fails is counted, but writes alone decide whether the store is failing
// (a read that fails is seen by /readyz's own read).
type Tracker struct {
	now  func() time.Time
	log  *slog.Logger
	logs *FailureLog
	hold time.Duration

	countsMu sync.RWMutex
	counts   map[string]*atomic.Uint64 // by op; every op of ledger.StoreOps is present
	failing  atomic.Bool

	mu       sync.Mutex
	since    time.Time // first failed write of this episode
	last     time.Time // last failed write
	okAfter  bool      // a write succeeded after the last failed one
	failures int64     // failed writes in this episode
	first    error     // the first of them
	lastOK   time.Time // when "succeed again" was last logged
	// ok is closed when this episode ends: whoever backs off waits on it
	// too, to resume as soon as writes succeed again.
	ok chan struct{}
}

// Config builds a Tracker.
type Config struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives "store writes failing" when writes start to fail and
	// "store writes succeed again" when they stop; nil discards.
	Logger *slog.Logger
	// LogInterval is the most often either line is logged; a failure that
	// repeats within it is counted in the next line. 0 means
	// DefaultLogInterval.
	LogInterval time.Duration
	// Hold is how long writes must have stopped failing before one that
	// succeeds ends the failing; 0 means DefaultHold.
	Hold time.Duration
}

// New returns a Tracker with nothing failing. It sees nothing until it is
// the store's hook: open the store with Observe as its
// ledger.Options.Observe (the drivers' and ledger/stores' Config.Observe).
func New(cfg Config) *Tracker {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = DefaultLogInterval
	}
	if cfg.Hold <= 0 {
		cfg.Hold = DefaultHold
	}
	h := &Tracker{now: cfg.Now, log: cfg.Logger, logs: NewFailureLog(cfg.Logger, cfg.Now, cfg.LogInterval),
		hold: cfg.Hold, counts: map[string]*atomic.Uint64{}}
	for _, op := range ledger.StoreOps() {
		h.counts[op] = new(atomic.Uint64)
	}
	return h
}

// Observe notes the outcome of one operation of the store: it is the
// store's observation hook (ledger.ObserveFunc).
func (h *Tracker) Observe(ctx context.Context, op ledger.Op) {
	if op.Write {
		h.write(ctx, op.Name, op.Err, op.Wrote)
		return
	}
	if IsFailure(op.Err) {
		h.counter(op.Name).Add(1)
	}
}

// counter is op's failure count; an op of no Store method (which the
// store's conformance suite rules out) gets one when it first fails.
func (h *Tracker) counter(op string) *atomic.Uint64 {
	h.countsMu.RLock()
	c := h.counts[op]
	h.countsMu.RUnlock()
	if c != nil {
		return c
	}
	h.countsMu.Lock()
	defer h.countsMu.Unlock()
	if c = h.counts[op]; c == nil {
		c = new(atomic.Uint64)
		h.counts[op] = c
	}
	return c
}

// Err is nil while writes succeed; while they fail, it says since when,
// how many failed and the first error.
func (h *Tracker) Err() error {
	if !h.failing.Load() {
		return nil
	}
	h.settle(context.Background())
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing.Load() {
		return nil
	}
	return fmt.Errorf("store writes failing since %s (%d failed): %w", h.since.UTC().Format(time.RFC3339), h.failures, h.first)
}

// Failing reports whether writes fail now, without settling the episode
// (Err does): cheap enough for every log line.
func (h *Tracker) Failing() bool { return h.failing.Load() }

// Errors returns the number of failures so far by operation, every
// operation of the Store (ledger.StoreOps) present.
func (h *Tracker) Errors() map[string]uint64 {
	h.countsMu.RLock()
	defer h.countsMu.RUnlock()
	out := make(map[string]uint64, len(h.counts))
	for op, n := range h.counts {
		out[op] = n.Load()
	}
	return out
}

// IsFailure reports whether err is a failure of the store rather than one
// of its answers (see Tracker): CodeInternal (I/O, a full disk, a corrupt
// file) or CodeUnsupportedVersion, and never the error of a cancelled
// context.
func IsFailure(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch ledger.Code(err) {
	case ledger.CodeInternal, ledger.CodeUnsupportedVersion:
		return true
	}
	return false
}

// write notes the outcome of a write; wrote says whether a write that
// succeeded changed anything.
func (h *Tracker) write(ctx context.Context, op string, err error, wrote bool) {
	switch {
	case err == nil && wrote:
		if h.failing.Load() {
			h.mu.Lock()
			h.okAfter = true
			h.mu.Unlock()
			h.settle(ctx)
		}
	case IsFailure(err):
		h.counter(op).Add(1)
		now := h.now()
		h.mu.Lock()
		if !h.failing.Load() {
			h.since, h.failures, h.first, h.ok = now, 0, err, make(chan struct{})
			h.failing.Store(true)
		}
		h.failures++
		h.last, h.okAfter = now, false
		h.mu.Unlock()
		h.logs.Error(ctx, "store writes failing", err, "op", op)
	}
}

// settle ends a failing episode once a write has succeeded and none has
// failed for Hold.
func (h *Tracker) settle(ctx context.Context) {
	h.mu.Lock()
	now := h.now()
	if !h.failing.Load() || !h.okAfter || now.Sub(h.last) < h.hold {
		h.mu.Unlock()
		return
	}
	h.failing.Store(false)
	close(h.ok)
	n, took := h.failures, now.Sub(h.since)
	quiet := now.Sub(h.lastOK) >= h.logs.every
	if quiet {
		h.lastOK = now
	}
	h.mu.Unlock()
	if quiet {
		h.log.InfoContext(ctx, "store writes succeed again", "failed", n, "after", took.Round(time.Millisecond).String())
	}
}

// ProbeDue reports whether a failing episode has gone Hold without a
// failed write, so that a probe write (ledger.Store.ProbeWrite) may end
// it: a process with nothing else to write would otherwise stay failing.
// The probe's outcome reaches the Tracker as any write's does.
func (h *Tracker) ProbeDue() bool {
	if !h.failing.Load() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failing.Load() && h.now().Sub(h.last) >= h.hold
}

// Recovered returns a channel closed when writes succeed again, or nil
// (never ready) while they do not fail.
func (h *Tracker) Recovered() <-chan struct{} {
	if !h.failing.Load() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing.Load() {
		return nil
	}
	return h.ok
}

// Flush writes the failure counts that are due, and ends a failing episode
// whose Hold is over (the engine's pool calls it on each pass).
func (h *Tracker) Flush(ctx context.Context) {
	h.logs.Flush(ctx)
	if h.failing.Load() {
		h.settle(ctx)
	}
}
