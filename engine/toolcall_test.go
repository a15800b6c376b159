package engine_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// TestOnToolCall: the hook hears of every call a tool answered, with the
// tool's name, the status recorded for the attempt and how long the call
// took on the engine's clock.
func TestOnToolCall(t *testing.T) {
	type seen struct {
		mu    sync.Mutex
		calls []engine.ToolCallStats
	}
	// setupSeen builds the bundle with the hook, on the fake clock or,
	// with realClock, on time.Now (to see a duration).
	setupSeen := func(t *testing.T, cfg simulator.Config, realClock bool) (*bundle, *seen) {
		s := &seen{}
		b := setupWith(t, cfg, func(c *engine.Config) {
			if realClock {
				c.Now = time.Now
			}
			c.OnToolCall = func(st engine.ToolCallStats) {
				s.mu.Lock()
				s.calls = append(s.calls, st)
				s.mu.Unlock()
			}
		})
		return b, s
	}

	t.Run("OK", func(t *testing.T) {
		b, s := setupSeen(t, simulator.Config{}, false)
		run := b.submit(t, "reader", "k1")
		run = b.advance(t, run.ID)
		require.Equal(t, ledger.RunCompleted, run.State)
		s.mu.Lock()
		defer s.mu.Unlock()
		require.Equal(t, []engine.ToolCallStats{{Tool: "cards.count", Status: ledger.AttemptSucceeded}}, s.calls,
			"the fake clock did not move during the call")
	})

	t.Run("Failed", func(t *testing.T) {
		b, s := setupSeen(t, simulator.Config{Tools: map[string]simulator.ToolConfig{
			"cards.write": {Faults: []simulator.Fault{{Kind: simulator.FaultError}}}}}, false)
		run := b.submit(t, "practice-cards", "k1")
		run = b.advance(t, run.ID)
		a := b.pendingAction(t, run.ID)
		require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
		run = b.advance(t, run.ID)
		require.Equal(t, ledger.RunFailed, run.State)
		s.mu.Lock()
		defer s.mu.Unlock()
		require.Len(t, s.calls, 1)
		require.Equal(t, "cards.write", s.calls[0].Tool)
		require.Equal(t, ledger.AttemptFailed, s.calls[0].Status)
	})

	t.Run("TimedOut", func(t *testing.T) {
		timeout := int64(20)
		b, s := setupSeen(t, simulator.Config{Tools: map[string]simulator.ToolConfig{
			"cards.write": {TimeoutMS: &timeout, Faults: []simulator.Fault{{Kind: simulator.FaultTimeout, Calls: []int{1}}}}}}, true)
		run := b.submit(t, "practice-cards", "k1")
		run = b.advance(t, run.ID)
		a := b.pendingAction(t, run.ID)
		require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
		b.advance(t, run.ID)
		s.mu.Lock()
		defer s.mu.Unlock()
		require.NotEmpty(t, s.calls)
		require.Equal(t, "cards.write", s.calls[0].Tool)
		require.Equal(t, ledger.AttemptTimedOut, s.calls[0].Status)
		require.GreaterOrEqual(t, s.calls[0].Duration, 20*time.Millisecond, "the call waited for its timeout")
	})
}
