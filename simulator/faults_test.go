package simulator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// crashed is the sentinel an injected crash function panics with.
type crashed struct{}

func faulty(faults ...simulator.Fault) simulator.ToolConfig {
	return simulator.ToolConfig{Faults: faults}
}

func lastOutcome(t *testing.T, s *simulator.EffectStore) simulator.CallOutcome {
	t.Helper()
	calls, err := s.Calls(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, calls)
	return calls[len(calls)-1].Outcome
}

func TestFaults(t *testing.T) {
	ctx := context.Background()

	t.Run("Error", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, faulty(simulator.Fault{Kind: simulator.FaultError, Calls: []int{1}}))
		_, err := tool.Execute(ctx, call("k", 1))
		requireToolError(t, err, simulator.CodeSimulatedError, ledger.EffectNotHappened)
		require.Equal(t, 0, effectCount(t, s.store, "k"))
		require.Equal(t, simulator.CallSimulatedError, lastOutcome(t, s.store))

		r, err := tool.Execute(ctx, call("k", 2))
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, r.Effect)
		require.Equal(t, 1, effectCount(t, s.store, "k"))
	})

	t.Run("ErrorOnEveryCall", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, faulty(simulator.Fault{Kind: simulator.FaultError}))
		for i := range 3 {
			_, err := tool.Execute(ctx, call("k", int64(i+1)))
			requireToolError(t, err, simulator.CodeSimulatedError, ledger.EffectNotHappened)
		}
		require.Equal(t, 0, effectCount(t, s.store, "k"))
	})

	t.Run("Timeout", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, faulty(simulator.Fault{Kind: simulator.FaultTimeout, Calls: []int{1}}))
		tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, err := tool.Execute(tctx, call("k", 1))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, 0, effectCount(t, s.store, "k"))
		require.Equal(t, simulator.CallTimedOut, lastOutcome(t, s.store))
	})

	t.Run("Slow", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, faulty(simulator.Fault{Kind: simulator.FaultSlow, Delay: time.Millisecond}))
		r, err := tool.Execute(ctx, call("k", 1))
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, r.Effect)
		require.Equal(t, 1, effectCount(t, s.store, "k"))
	})

	t.Run("SlowPastDeadline", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, faulty(simulator.Fault{Kind: simulator.FaultSlow, Delay: time.Hour}))
		tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, err := tool.Execute(tctx, call("k", 1))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, 0, effectCount(t, s.store, "k"))
		require.Equal(t, simulator.CallAborted, lastOutcome(t, s.store))
	})

	t.Run("EffectThenCrash", func(t *testing.T) {
		s := newSetup(t)
		cfg := faulty(simulator.Fault{Kind: simulator.FaultEffectThenCrash, Calls: []int{1}})
		cfg.CrashFunc = func() { panic(crashed{}) }
		tool := writeTool(s.store, cfg)
		require.PanicsWithValue(t, crashed{}, func() { _, _ = tool.Execute(ctx, call("k", 1)) })
		require.Equal(t, 1, effectCount(t, s.store, "k"), "the effect was committed before the crash")
		require.Equal(t, simulator.CallCrashedAfterEffect, lastOutcome(t, s.store))

		// After the "restart" the dedup key still yields the one effect.
		r, err := writeTool(s.store, simulator.ToolConfig{}).Execute(ctx, call("k", 2))
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, r.Effect)
		require.Equal(t, 1, effectCount(t, s.store, "k"))
	})

	t.Run("EffectThenCrashReturning", func(t *testing.T) {
		s := newSetup(t)
		var crashes int
		cfg := faulty(simulator.Fault{Kind: simulator.FaultEffectThenCrash})
		cfg.CrashFunc = func() { crashes++ }
		_, err := writeTool(s.store, cfg).Execute(ctx, call("k", 1))
		require.ErrorIs(t, err, simulator.ErrSimulatedCrash)
		require.Equal(t, 1, crashes)
		require.Equal(t, 1, effectCount(t, s.store, "k"))
	})

	t.Run("CrashBeforeEffect", func(t *testing.T) {
		s := newSetup(t)
		var crashes int
		cfg := faulty(simulator.Fault{Kind: simulator.FaultCrashBeforeEffect, Calls: []int{1}})
		cfg.CrashFunc = func() { crashes++ }
		tool := writeTool(s.store, cfg)
		_, err := tool.Execute(ctx, call("k", 1))
		require.ErrorIs(t, err, simulator.ErrSimulatedCrash)
		require.Equal(t, 1, crashes)
		require.Equal(t, 0, effectCount(t, s.store, "k"))
		require.Equal(t, simulator.CallCrashedBeforeEffect, lastOutcome(t, s.store))
	})

	t.Run("CrashBeforeEffectPanicking", func(t *testing.T) {
		s := newSetup(t)
		cfg := simulator.Config{
			Tools:     map[string]simulator.ToolConfig{simulator.CardsWriteTool: faulty(simulator.Fault{Kind: simulator.FaultCrashBeforeEffect})},
			CrashFunc: func() { panic(crashed{}) },
		}
		agent := simulator.PracticeCardsAgent(s.store, cfg)
		require.PanicsWithValue(t, crashed{}, func() { _, _ = agent.Tools[0].Execute(ctx, call("k", 1)) })
		require.Equal(t, 0, effectCount(t, s.store, "k"))
	})

	t.Run("QueryError", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, faulty(simulator.Fault{Kind: simulator.FaultQueryError, Calls: []int{1}}))
		_, err := tool.Execute(ctx, call("k", 1))
		require.NoError(t, err, "query_error does not touch Execute")

		q, err := tool.Query(ctx, "k")
		requireToolError(t, err, simulator.CodeSimulatedQueryError, ledger.EffectUnknown)
		require.Equal(t, ledger.EffectUnknown, q.Effect)

		q, err = tool.Query(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, q.Effect)

		queries, err := s.store.Queries(ctx)
		require.NoError(t, err)
		require.Len(t, queries, 2)
		require.Equal(t, simulator.QueryError, queries[0].Outcome)
	})

	t.Run("CallsCountedPerDedupKey", func(t *testing.T) {
		s := newSetup(t)
		tool := writeTool(s.store, faulty(simulator.Fault{Kind: simulator.FaultError, Calls: []int{1}}))
		for _, key := range []string{"a", "b"} {
			_, err := tool.Execute(ctx, call(key, 1))
			requireToolError(t, err, simulator.CodeSimulatedError, ledger.EffectNotHappened)
			_, err = tool.Execute(ctx, call(key, 2))
			require.NoError(t, err)
		}
	})

	t.Run("CallsCountSurvivesReopen", func(t *testing.T) {
		s := newSetup(t)
		cfg := faulty(simulator.Fault{Kind: simulator.FaultError, Calls: []int{1}})
		_, err := writeTool(s.store, cfg).Execute(ctx, call("k", 1))
		requireToolError(t, err, simulator.CodeSimulatedError, ledger.EffectNotHappened)
		require.NoError(t, s.store.Close())

		reopened := openStore(t, s.path, s.clock.Now)
		r, err := writeTool(reopened, cfg).Execute(ctx, call("k", 2))
		require.NoError(t, err, "this is call 2 of the key, which the fault does not cover")
		require.Equal(t, ledger.EffectHappened, r.Effect)
		require.Equal(t, 1, effectCount(t, reopened, "k"))

		calls, err := reopened.Calls(ctx)
		require.NoError(t, err)
		require.Len(t, calls, 2)
		require.Equal(t, []simulator.CallOutcome{simulator.CallSimulatedError, simulator.CallEffect},
			[]simulator.CallOutcome{calls[0].Outcome, calls[1].Outcome})
	})

	t.Run("FirstApplicableFaultWins", func(t *testing.T) {
		s := newSetup(t)
		var crashes int
		cfg := faulty(
			simulator.Fault{Kind: simulator.FaultQueryError},
			simulator.Fault{Kind: simulator.FaultError, Calls: []int{2}},
			simulator.Fault{Kind: simulator.FaultCrashBeforeEffect},
		)
		cfg.CrashFunc = func() { crashes++ }
		tool := writeTool(s.store, cfg)
		_, err := tool.Execute(ctx, call("k", 1))
		require.True(t, errors.Is(err, simulator.ErrSimulatedCrash))
		_, err = tool.Execute(ctx, call("k", 2))
		requireToolError(t, err, simulator.CodeSimulatedError, ledger.EffectNotHappened)
		require.Equal(t, 1, crashes)
	})

	t.Run("ReadToolFault", func(t *testing.T) {
		s := newSetup(t)
		read := simulator.NewTool(simulator.CardsCountDescriptor(), s.store,
			faulty(simulator.Fault{Kind: simulator.FaultError, Calls: []int{1}}))
		_, err := read.Execute(ctx, call("r", 1))
		requireToolError(t, err, simulator.CodeSimulatedError, ledger.EffectNotHappened)
	})

	t.Run("InvalidConfigPanics", func(t *testing.T) {
		s := newSetup(t)
		require.Panics(t, func() { writeTool(s.store, faulty(simulator.Fault{Kind: "meteor"})) })
	})
}
