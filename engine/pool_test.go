package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// diskFull fails the writes of a real store that the pool's path makes,
// as a full disk does, while full is set.
type diskFull struct {
	ledger.Store
	full *atomic.Bool
}

func (s diskFull) err(op string) error {
	if s.full.Load() {
		return ledger.Errorf(ledger.CodeInternal, "%s: database or disk is full", op)
	}
	return nil
}

func (s diskFull) TransitionRun(ctx context.Context, p ledger.RunTransition) (*ledger.Run, error) {
	if err := s.err("transition run"); err != nil {
		return nil, err
	}
	return s.Store.TransitionRun(ctx, p)
}

func (s diskFull) ProbeWrite(ctx context.Context) error {
	if err := s.err("probe write"); err != nil {
		return err
	}
	return s.Store.ProbeWrite(ctx)
}

func (s diskFull) ExpireApprovals(ctx context.Context) ([]*ledger.Approval, error) {
	if err := s.err("expire approvals"); err != nil {
		return nil, err
	}
	return s.Store.ExpireApprovals(ctx)
}

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
// (Work) on a fake clock while every write of the run fails: the pass backs
// off instead of polling, the failed run is not handed out again before its
// backoff is over, the failures are logged once, counted, and make the
// store unhealthy; one success makes it healthy and starts over.
func TestPoolBackoff(t *testing.T) {
	ctx := context.Background()
	lb := ledgertest.OpenStore(t)
	effects, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), lb.Clock.Now)
	require.NoError(t, err)
	t.Cleanup(func() { _ = effects.Close() })
	full := &atomic.Bool{}
	store := diskFull{Store: lb.Store, full: full}
	cards := simulator.PracticeCardsAgent(effects, simulator.Config{})
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	tools := func(string) (contracts.ToolDescriptor, bool) { return cards.Tools[0].Descriptor(), true }
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	health := engine.NewStoreHealth(engine.StoreHealthConfig{Now: lb.Clock.Now, Logger: log})
	svc := approval.NewService(health.Watch(store), policy, tools, approval.Options{})
	eng, err := engine.New(engine.Config{Store: store, Approvals: svc, Agents: []engine.Agent{cards}, Now: lb.Clock.Now,
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
		wait, wakeable, _ := pass()
		require.Equal(t, 250*time.Millisecond, wait)
		require.True(t, wakeable)
		d.Done(id) // handed out, not worked: give it back
	})

	full.Store(true)
	t.Run("FailingPassBacksOff", func(t *testing.T) {
		wait, wakeable, ids := pass()
		require.False(t, wakeable, "a wake-up does not cut a backoff short")
		require.GreaterOrEqual(t, wait, 50*time.Millisecond)
		require.Less(t, wait, 100*time.Millisecond)
		require.Equal(t, []ledger.RunID{id}, ids, "reads still work: the run is handed out")
		turn(id)
		require.Equal(t, 1, eng.Failures(id))

		wait, _, ids = pass()
		require.GreaterOrEqual(t, wait, 100*time.Millisecond, "the second failed pass waits twice as long")
		require.Less(t, wait, 200*time.Millisecond)
		require.Empty(t, ids, "the failed run waits out its backoff")
	})

	t.Run("RunRetriedAfterItsBackoff", func(t *testing.T) {
		lb.Clock.Advance(100 * time.Millisecond) // the first backoff is below 100ms
		_, _, ids := pass()
		require.Equal(t, []ledger.RunID{id}, ids)
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
		require.EqualValues(t, 5, eng.Health().Errors()["expire_approvals"])
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
