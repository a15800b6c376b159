package simulator_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

var (
	allOn   = contracts.Guarantees{Query: true, Dedup: true, Cancel: true}
	noDedup = contracts.Guarantees{Query: true, Dedup: false, Cancel: true}
	nothing = contracts.Guarantees{}
)

func requireToolError(t *testing.T, err error, code string, effect ledger.EffectFact) {
	t.Helper()
	var te *engine.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, code, te.Code)
	require.Equal(t, effect, te.Effect)
}

func TestToolWrite(t *testing.T) {
	ctx := context.Background()

	t.Run("NoDedupRunsTwice", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &noDedup})
		r1, err := tool.Execute(ctx, call("run_1/act_1", 1))
		require.NoError(t, err)
		r2, err := tool.Execute(ctx, call("run_1/act_1", 2))
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, r1.Effect)
		require.Equal(t, ledger.EffectHappened, r2.Effect)
		require.JSONEq(t, `{"effect_seq":1,"title":"Rust","written":2}`, string(r1.Output))
		require.JSONEq(t, `{"effect_seq":2,"title":"Rust","written":2}`, string(r2.Output))
		require.Equal(t, 2, effectCount(t, s.store, "run_1/act_1"))
	})

	t.Run("DedupReturnsOriginal", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{})
		r1, err := tool.Execute(ctx, call("run_1/act_1", 1))
		require.NoError(t, err)
		s.clock.Advance(time.Hour)
		r2, err := tool.Execute(ctx, call("run_1/act_1", 2))
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, r2.Effect)
		require.Equal(t, string(r1.Output), string(r2.Output))
		require.Equal(t, 1, effectCount(t, s.store, "run_1/act_1"))

		effects, err := s.store.Effects(ctx)
		require.NoError(t, err)
		require.Len(t, effects, 1)
		digest, err := ledger.DigestJSON([]byte(cardsArgs))
		require.NoError(t, err)
		require.Equal(t, simulator.Effect{
			Seq: 1, DedupKey: "run_1/act_1", Tool: simulator.CardsWriteTool, ArgumentsDigest: digest,
			Output: r1.Output, CreatedAt: newClock().Now(),
		}, effects[0])

		calls, err := s.store.Calls(ctx)
		require.NoError(t, err)
		require.Len(t, calls, 2)
		require.Equal(t, simulator.CallEffect, calls[0].Outcome)
		require.Equal(t, simulator.CallDeduplicated, calls[1].Outcome)
		require.Equal(t, int64(2), calls[1].Attempt)
	})

	t.Run("DedupRetentionPassed", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{DedupRetentionMS: ptr(int64(1000))})
		r1, err := tool.Execute(ctx, call("k", 1))
		require.NoError(t, err)
		s.clock.Advance(time.Second) // at the edge: still honoured
		r2, err := tool.Execute(ctx, call("k", 2))
		require.NoError(t, err)
		require.Equal(t, string(r1.Output), string(r2.Output))
		require.Equal(t, 1, effectCount(t, s.store, "k"))

		s.clock.Advance(time.Millisecond) // past the window: a new effect
		r3, err := tool.Execute(ctx, call("k", 3))
		require.NoError(t, err)
		require.JSONEq(t, `{"effect_seq":2,"title":"Rust","written":2}`, string(r3.Output))
		require.Equal(t, 2, effectCount(t, s.store, "k"))
	})

	t.Run("WrittenWithoutCards", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{})
		r, err := tool.Execute(ctx, engine.Call{DedupKey: "k", Arguments: json.RawMessage(`{"note":"x"}`)})
		require.NoError(t, err)
		require.JSONEq(t, `{"effect_seq":1,"written":1}`, string(r.Output))
	})

	t.Run("ErrInvalidArguments", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{})
		for _, args := range []string{`[1]`, `{"a":1,"a":2}`, `nope`, `null`} {
			_, err := tool.Execute(ctx, engine.Call{DedupKey: "k", Arguments: json.RawMessage(args)})
			requireToolError(t, err, simulator.CodeInvalidArguments, ledger.EffectNotHappened)
		}
		require.Equal(t, 0, effectCount(t, s.store, "k"))
	})

	t.Run("SurvivesReopen", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{})
		r1, err := tool.Execute(ctx, call("k", 1))
		require.NoError(t, err)
		require.NoError(t, s.store.Close())

		reopened := openStore(t, s.path, s.clock.Now)
		effects, err := reopened.Effects(ctx)
		require.NoError(t, err)
		require.Len(t, effects, 1)
		require.Equal(t, string(r1.Output), string(effects[0].Output))

		// Dedup still holds across the restart.
		r2, err := writeTool(reopened, simulator.ToolConfig{}).Execute(ctx, call("k", 2))
		require.NoError(t, err)
		require.Equal(t, string(r1.Output), string(r2.Output))
		require.Equal(t, 1, effectCount(t, reopened, "k"))
	})

	t.Run("ConcurrentDedup", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{})
		const n = 20
		outputs := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				r, err := tool.Execute(ctx, call("run_1/act_1", int64(i+1)))
				outputs[i], errs[i] = string(r.Output), err
			})
		}
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
			require.Equal(t, outputs[0], outputs[i])
		}
		require.Equal(t, 1, effectCount(t, s.store, "run_1/act_1"))
		calls, err := s.store.Calls(ctx)
		require.NoError(t, err)
		require.Len(t, calls, n)
	})
}

func TestToolRead(t *testing.T) {
	ctx := context.Background()
	s := newSetup(t)
	write := writeTool(s.store, simulator.ToolConfig{Guarantees: &noDedup})
	read := simulator.NewTool(simulator.CardsCountDescriptor(), s.store, simulator.ToolConfig{})

	for i := range 2 {
		_, err := write.Execute(ctx, call("w", int64(i+1)))
		require.NoError(t, err)
	}
	r, err := read.Execute(ctx, engine.Call{DedupKey: "r", Attempt: 1, Arguments: json.RawMessage(`{"title":"Rust"}`)})
	require.NoError(t, err)
	require.Equal(t, ledger.EffectNotHappened, r.Effect)
	require.JSONEq(t, `{"count":2,"title":"Rust"}`, string(r.Output))

	r, err = read.Execute(ctx, engine.Call{DedupKey: "r2", Attempt: 1, Arguments: json.RawMessage(`{"title":"Go"}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"count":0,"title":"Go"}`, string(r.Output))

	require.Equal(t, 0, effectCount(t, s.store, "r"))
	effects, err := s.store.Effects(ctx)
	require.NoError(t, err)
	require.Len(t, effects, 2)

	q, err := read.Query(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, ledger.EffectNotHappened, q.Effect)
}

func TestToolQuery(t *testing.T) {
	ctx := context.Background()

	t.Run("Visibility", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{QueryVisibilityMS: ptr(int64(1000))})
		q, err := tool.Query(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectNotHappened, q.Effect)

		r, err := tool.Execute(ctx, call("k", 1))
		require.NoError(t, err)

		s.clock.Advance(999 * time.Millisecond)
		q, err = tool.Query(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectNotHappened, q.Effect, "a young effect is not yet visible")

		s.clock.Advance(time.Millisecond)
		q, err = tool.Query(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, q.Effect)
		require.Equal(t, string(r.Output), string(q.Output))

		queries, err := s.store.Queries(ctx)
		require.NoError(t, err)
		outcomes := make([]simulator.QueryOutcome, 0, len(queries))
		for _, q := range queries {
			outcomes = append(outcomes, q.Outcome)
		}
		require.Equal(t, []simulator.QueryOutcome{simulator.QueryNotHappened, simulator.QueryNotVisible, simulator.QueryHappened}, outcomes)
	})

	t.Run("NoVisibilityDelay", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{})
		_, err := tool.Execute(ctx, call("k", 1))
		require.NoError(t, err)
		q, err := tool.Query(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, q.Effect)
	})

	t.Run("ErrUnsupported", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &nothing})
		q, err := tool.Query(ctx, "k")
		require.ErrorIs(t, err, errors.ErrUnsupported)
		require.Equal(t, ledger.EffectUnknown, q.Effect)
		_, err = tool.Cancel(ctx, "k")
		require.ErrorIs(t, err, errors.ErrUnsupported)
		require.Equal(t, nothing, tool.Descriptor().Guarantees)
	})
}

func TestToolCancel(t *testing.T) {
	ctx := context.Background()

	t.Run("BeforeEffect", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &allOn,
			Faults: []simulator.Fault{{Kind: simulator.FaultSlow, Calls: []int{1}, Delay: 300 * time.Millisecond}}})
		// A call in flight when the cancel comes is refused.
		done := make(chan error, 1)
		go func() { _, err := tool.Execute(ctx, call("k", 1)); done <- err }()
		require.Eventually(t, func() bool {
			calls, err := s.store.Calls(ctx)
			return err == nil && len(calls) == 1
		}, 5*time.Second, time.Millisecond)
		c, err := tool.Cancel(ctx, "k")
		require.NoError(t, err)
		require.True(t, c.Confirmed)
		c, err = tool.Cancel(ctx, "k")
		require.NoError(t, err)
		require.True(t, c.Confirmed, "cancelling twice confirms twice")
		requireToolError(t, <-done, simulator.CodeCancelled, ledger.EffectNotHappened)
		require.Equal(t, 0, effectCount(t, s.store, "k"))
		calls, err := s.store.Calls(ctx)
		require.NoError(t, err)
		require.Equal(t, simulator.CallCancelled, calls[0].Outcome)

		// A call that starts after the cancel (a retry under the same
		// approval) proceeds.
		_, err = tool.Execute(ctx, call("k", 2))
		require.NoError(t, err)
		require.Equal(t, 1, effectCount(t, s.store, "k"))

		// Other keys are untouched.
		_, err = tool.Execute(ctx, call("other", 1))
		require.NoError(t, err)
	})

	t.Run("AfterEffect", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &allOn})
		_, err := tool.Execute(ctx, call("k", 1))
		require.NoError(t, err)
		c, err := tool.Cancel(ctx, "k")
		require.NoError(t, err)
		require.False(t, c.Confirmed)
		require.JSONEq(t, `{"dedup_key":"k","cancelled":false,"effect_seq":1}`, string(c.Detail))
		require.Equal(t, 1, effectCount(t, s.store, "k"))
	})
}

// pastDeadline is a context whose deadline has passed by the wall clock
// but which is not done yet: what a process resumed after being paused
// past its caller's deadline holds until its timer fires.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Second), true }

// TestToolNoEffectPastDeadline: a write tool makes no effect for a caller
// whose deadline has passed, even before the context says so: a replica
// frozen mid-call and resumed after another took its run over must not act
// behind its back. The call is recorded aborted and answers the deadline's
// error; a call within its deadline acts as before.
func TestToolNoEffectPastDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"NotFiredYet", func() (context.Context, context.CancelFunc) { return pastDeadline{context.Background()}, func() {} }},
		{"Expired", func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t)
			tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &noDedup})
			ctx, cancel := tc.ctx()
			defer cancel()
			_, err := tool.Execute(ctx, call("run_1/act_1", 1))
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Zero(t, effectCount(t, s.store, "run_1/act_1"))
			calls, err := s.store.Calls(context.Background())
			require.NoError(t, err)
			for _, c := range calls { // an ended context records no call at all
				require.Equal(t, simulator.CallAborted, c.Outcome)
			}
			if tc.name == "NotFiredYet" {
				require.Len(t, calls, 1, "recorded, then aborted")
			}
		})
	}
	t.Run("WithinDeadline", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &noDedup})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := tool.Execute(ctx, call("run_1/act_1", 1))
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, res.Effect)
		require.Equal(t, 1, effectCount(t, s.store, "run_1/act_1"))
	})
}

// TestQuiesce: while Quiesce's function runs, no call of the process
// touches the effect store; the call waiting for it goes on once it
// returns.
func TestQuiesce(t *testing.T) {
	s := newSetup(t)
	tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &noDedup})
	done := make(chan error, 1)
	require.NoError(t, s.store.Quiesce(context.Background(), func() {
		go func() {
			_, err := tool.Execute(context.Background(), call("run_1/act_1", 1))
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("a call went through while the store was quiesced (%v)", err)
		case <-time.After(200 * time.Millisecond):
		}
	}))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not go on after Quiesce returned")
	}
	require.Equal(t, 1, effectCount(t, s.store, "run_1/act_1"))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.store.Quiesce(ctx, func() { t.Fatal("ran with an ended context") }), context.Canceled)
}
