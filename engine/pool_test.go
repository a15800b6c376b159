package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/storehealth"
	"github.com/stretchr/testify/require"
)

// lockedBuffer collects a JSON logger's lines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// messages returns the msg of each line at level.
func (b *lockedBuffer) messages(t *testing.T, level string) []string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for line := range strings.Lines(b.buf.String()) {
		var r struct{ Level, Msg string }
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		if r.Level == level {
			out = append(out, r.Msg)
		}
	}
	return out
}

// TestPoolBackoff drives the pool's pass (RunOnce) and a worker's turn
// (Work) on a fake clock while the store's every write fails, as on a full
// disk (the store's own write fault, seen by its health through the
// store's hook): the failed run is not handed out again before its backoff
// is over, the pass whose claim failed backs off instead of polling, the
// failures are logged once, counted, and make the store unhealthy; once
// writes succeed, the probe write makes it healthy and all starts over.
func TestPoolBackoff(t *testing.T) {
	ctx := context.Background()
	full := &atomic.Bool{}
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	var health *storehealth.Tracker
	lb := ledgertest.OpenStoreWith(t, func(c *sqlite.Config) {
		c.WriteFaultFunc = func(_ int64, at ledger.WritePoint) error {
			if at == ledger.WriteBeforeCommit && full.Load() {
				return errors.New("database or disk is full")
			}
			return nil
		}
		health = storehealth.New(storehealth.Config{Now: c.Now, Logger: log})
		c.Observe = health.Observe
	})
	effects, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), lb.Clock.Now)
	require.NoError(t, err)
	t.Cleanup(func() { _ = effects.Close() })
	cards := simulator.PracticeCardsAgent(effects, simulator.Config{})
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	tools := func(string) (contracts.ToolDescriptor, bool) { return cards.Tools[0].Descriptor(), true }
	svc := approval.NewService(lb.Store, policy, tools, approval.Options{})
	eng, err := engine.New(engine.Config{Store: lb.Store, Approvals: svc, Agents: []engine.Agent{cards}, Now: lb.Clock.Now,
		Logger: log, Health: health, PollInterval: 250 * time.Millisecond, RetryMin: 100 * time.Millisecond, RetryMax: time.Second})
	require.NoError(t, err)

	title, md := simulator.SampleDocument()
	input, err := json.Marshal(map[string]string{"title": title, "markdown": md})
	require.NoError(t, err)
	res, err := lb.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k", Principal: "alice",
		Agent: simulator.AgentName, Input: input})
	require.NoError(t, err)
	id := res.Run.ID

	work := make(chan ledger.RunID, 8)
	d := engine.NewDispatcher(eng, work)
	// pass runs one pass and returns its wait and the runs it handed out.
	pass := func() (time.Duration, bool, []ledger.RunID) {
		wait, wakeable := d.RunOnce(ctx)
		var out []ledger.RunID
		for len(work) > 0 {
			out = append(out, <-work)
		}
		return wait, wakeable, out
	}
	turn := func(id ledger.RunID) {
		eng.Work(ctx, id)
		d.Done(id)
	}

	t.Run("HealthyPassPolls", func(t *testing.T) {
		wait, wakeable, ids := pass()
		require.Equal(t, 250*time.Millisecond, wait)
		require.True(t, wakeable)
		require.Equal(t, []ledger.RunID{id}, ids, "claimed and handed out")
	})

	full.Store(true)
	t.Run("FailedRunAndFailingPassBackOff", func(t *testing.T) {
		turn(id)
		require.Equal(t, 1, eng.Failures(id))

		wait, wakeable, ids := pass()
		require.False(t, wakeable, "a wake-up does not cut a backoff short")
		require.GreaterOrEqual(t, wait, 50*time.Millisecond, "its claim failed")
		require.Less(t, wait, 100*time.Millisecond)
		require.Empty(t, ids, "the failed run waits out its backoff")

		wait, _, ids = pass()
		require.GreaterOrEqual(t, wait, 100*time.Millisecond, "the second failed pass waits twice as long")
		require.Less(t, wait, 200*time.Millisecond)
		require.Empty(t, ids)
	})

	t.Run("RunRetriedAfterItsBackoff", func(t *testing.T) {
		lb.Clock.Advance(100 * time.Millisecond) // the first backoff is below 100ms
		_, _, ids := pass()
		require.Equal(t, []ledger.RunID{id}, ids, "still held: handed out without a claim")
		turn(id)
		require.Equal(t, 2, eng.Failures(id))
		lb.Clock.Advance(99 * time.Millisecond) // the second is at least 100ms
		_, _, ids = pass()
		require.Empty(t, ids)
		lb.Clock.Advance(101 * time.Millisecond)
		_, _, ids = pass()
		require.Equal(t, []ledger.RunID{id}, ids)
		turn(id)
		require.Equal(t, 3, eng.Failures(id))
	})

	t.Run("FailuresCountedLoggedOnceUnhealthy", func(t *testing.T) {
		require.Error(t, eng.Health().Err())
		require.EqualValues(t, 3, eng.Health().Errors()["transition_run"])
		require.EqualValues(t, 5, eng.Health().Errors()["claim_runs"])
		require.Zero(t, eng.Health().Errors()["expire_approvals"], "nothing due: no write to fail")
		require.Equal(t, []string{"store writes failing"}, logs.messages(t, "ERROR"),
			"eight failures, one line: the rest are counted for the next")
	})

	full.Store(false)
	t.Run("SuccessStartsOver", func(t *testing.T) {
		lb.Clock.Advance(2 * time.Second)
		wait, wakeable, ids := pass()
		require.True(t, wakeable)
		require.Equal(t, 250*time.Millisecond, wait)
		require.NoError(t, eng.Health().Err(),
			"the pass's probe write succeeded: sound again, though nothing else wrote (an expiry pass with nothing due proves no write)")
		require.Equal(t, []ledger.RunID{id}, ids)
		turn(id)
		require.Zero(t, eng.Failures(id))
		require.NoError(t, eng.Health().Err(), "the run's writes succeeded")
		run, err := lb.Store.FindRunByID(ctx, id)
		require.NoError(t, err)
		require.Equal(t, ledger.RunAwaitingApproval, run.State, "nothing was lost: the run goes on")
		require.Contains(t, logs.messages(t, "INFO"), "store writes succeed again")
	})
}
