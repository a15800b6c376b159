package simulator_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// fenced is a call of run's action act under a lease with token.
func fenced(run string, act string, token int64) engine.Call {
	c := call(run+"/"+act, 1)
	c.RunID, c.ActionID, c.FencingToken = ledger.RunID(run), ledger.ActionID(act), token
	return c
}

// outcomes are the recorded calls' outcomes and tokens, in order.
func outcomes(t *testing.T, s *simulator.EffectStore) []simulator.CallRecord {
	t.Helper()
	calls, err := s.Calls(context.Background())
	require.NoError(t, err)
	for i := range calls {
		calls[i].Seq, calls[i].DedupKey, calls[i].Tool, calls[i].Attempt, calls[i].CreatedAt = 0, "", "", 0, time.Time{}
	}
	return calls
}

// TestToolFencing: a write whose fencing token is lower than one the store
// has seen for its run (a later holder's) is refused with code fenced and
// effect not_happened, and recorded fenced; nothing is written. The fence
// is per run, a call under no lease (token 0) is not fenced, the holder's
// own token (or a newer one) writes, and the fence survives a restart of
// the store.
func TestToolFencing(t *testing.T) {
	ctx := context.Background()
	s := newSetup(t)
	tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &noDedup})

	_, err := tool.Execute(ctx, fenced("run_1", "act_1", 2))
	require.NoError(t, err)
	_, err = tool.Execute(ctx, fenced("run_1", "act_1", 1))
	requireToolError(t, err, simulator.CodeFenced, ledger.EffectNotHappened)
	require.ErrorContains(t, err, "fenced: stale fencing token 1 for run run_1")
	require.ErrorContains(t, err, "token 2")
	require.Equal(t, 1, effectCount(t, s.store, "run_1/act_1"), "the stale call wrote nothing")

	// The same holder, a newer one, another run, and no lease: all write.
	for _, c := range []engine.Call{fenced("run_1", "act_2", 2), fenced("run_1", "act_2", 3), fenced("run_2", "act_1", 1), fenced("run_1", "act_3", 0)} {
		res, err := tool.Execute(ctx, c)
		require.NoError(t, err, "token %d of %s", c.FencingToken, c.RunID)
		require.Equal(t, ledger.EffectHappened, res.Effect)
	}
	// Token 3 raised run_1's fence: 2 is stale now.
	_, err = tool.Execute(ctx, fenced("run_1", "act_2", 2))
	requireToolError(t, err, simulator.CodeFenced, ledger.EffectNotHappened)
	require.Equal(t, 2, effectCount(t, s.store, "run_1/act_2"))

	require.Equal(t, []simulator.CallRecord{
		{FencingToken: 2, Outcome: simulator.CallEffect},
		{FencingToken: 1, Outcome: simulator.CallFenced},
		{FencingToken: 2, Outcome: simulator.CallEffect},
		{FencingToken: 3, Outcome: simulator.CallEffect},
		{FencingToken: 1, Outcome: simulator.CallEffect},
		{FencingToken: 0, Outcome: simulator.CallEffect},
		{FencingToken: 2, Outcome: simulator.CallFenced},
	}, outcomes(t, s.store))

	t.Run("AcrossRestarts", func(t *testing.T) {
		require.NoError(t, s.store.Close())
		again := openStore(t, s.path, s.clock.Now)
		_, err := writeTool(again, simulator.ToolConfig{Guarantees: &noDedup}).Execute(ctx, fenced("run_1", "act_4", 2))
		requireToolError(t, err, simulator.CodeFenced, ledger.EffectNotHappened)
		require.Zero(t, effectCount(t, again, "run_1/act_4"))
	})

	t.Run("BeforeDedup", func(t *testing.T) {
		// A deduplicating tool refuses the stale call too, rather than
		// answering with the effect a later holder made.
		s := newSetup(t)
		tool := writeTool(s.store, simulator.ToolConfig{})
		_, err := tool.Execute(ctx, fenced("run_1", "act_1", 5))
		require.NoError(t, err)
		_, err = tool.Execute(ctx, fenced("run_1", "act_1", 4))
		requireToolError(t, err, simulator.CodeFenced, ledger.EffectNotHappened)
	})

	t.Run("ReadsRaiseTheFence", func(t *testing.T) {
		// A later holder whose first call is a read has arrived all the
		// same: an older holder's write is refused after it.
		s := newSetup(t)
		read := simulator.NewTool(simulator.CardsCountDescriptor(), s.store, simulator.ToolConfig{})
		_, err := read.Execute(ctx, fenced("run_1", "act_2", 7))
		require.NoError(t, err)
		_, err = writeTool(s.store, simulator.ToolConfig{Guarantees: &noDedup}).Execute(ctx, fenced("run_1", "act_1", 6))
		requireToolError(t, err, simulator.CodeFenced, ledger.EffectNotHappened)
	})
}

// TestToolIgnoreDeadline: a tool configured to ignore the caller's deadline
// acts for a caller past it, as a remote service that already has the
// request would; only the fence then refuses a late call of an older
// holder.
func TestToolIgnoreDeadline(t *testing.T) {
	s := newSetup(t)
	tool := writeTool(s.store, simulator.ToolConfig{Guarantees: &noDedup, IgnoreDeadline: true})
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	res, err := tool.Execute(ctx, fenced("run_1", "act_1", 2))
	require.NoError(t, err)
	require.Equal(t, ledger.EffectHappened, res.Effect)
	_, err = tool.Execute(ctx, fenced("run_1", "act_1", 1))
	requireToolError(t, err, simulator.CodeFenced, ledger.EffectNotHappened)
	require.Equal(t, 1, effectCount(t, s.store, "run_1/act_1"))

	c, err := simulator.ParseConfig([]byte(`{"tools": {"cards.write": {"ignore_deadline": true}}}`))
	require.NoError(t, err)
	require.True(t, c.Tools[simulator.CardsWriteTool].IgnoreDeadline)
}

// TestEffectStoreUpgrade: a store an older version made (calls without
// fencing tokens, whose outcomes knew no "fenced") is upgraded when opened,
// its calls and their numbering kept, and fences from then on.
func TestEffectStoreUpgrade(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.effects.db")
	old, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL")
	require.NoError(t, err)
	for _, stmt := range []string{
		`CREATE TABLE calls (
			seq INTEGER PRIMARY KEY AUTOINCREMENT,
			dedup_key TEXT NOT NULL,
			tool TEXT NOT NULL,
			attempt INTEGER NOT NULL,
			outcome TEXT NOT NULL CHECK (outcome IN ('started', 'effect', 'deduplicated', 'read',
				'cancelled', 'invalid_arguments', 'simulated_error', 'timed_out', 'aborted',
				'crashed_before_effect', 'crashed_after_effect')),
			created_at INTEGER NOT NULL
		)`,
		`CREATE INDEX calls_dedup_key ON calls (dedup_key, tool)`,
		`INSERT INTO calls (dedup_key, tool, attempt, outcome, created_at) VALUES ('run_1/act_1', 'cards.write', 1, 'started', 1)`,
		`INSERT INTO calls (dedup_key, tool, attempt, outcome, created_at) VALUES ('run_1/act_1', 'cards.write', 2, 'effect', 2)`,
	} {
		_, err := old.ExecContext(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	require.NoError(t, old.Close())

	c := newClock()
	s := openStore(t, path, c.Now)
	// Opened twice, as replicas sharing the file do: upgraded once.
	openStore(t, path, c.Now)
	calls, err := s.Calls(ctx)
	require.NoError(t, err)
	require.Len(t, calls, 2)
	require.Equal(t, simulator.CallRecord{Seq: 2, DedupKey: "run_1/act_1", Tool: simulator.CardsWriteTool, Attempt: 2,
		Outcome: simulator.CallEffect, CreatedAt: time.Unix(0, 2).UTC()}, calls[1])

	tool := writeTool(s, simulator.ToolConfig{Guarantees: &noDedup})
	_, err = tool.Execute(ctx, fenced("run_1", "act_1", 2))
	require.NoError(t, err)
	_, err = tool.Execute(ctx, fenced("run_1", "act_1", 1))
	requireToolError(t, err, simulator.CodeFenced, ledger.EffectNotHappened)
	calls, err = s.Calls(ctx)
	require.NoError(t, err)
	require.Len(t, calls, 4)
	require.Equal(t, int64(3), calls[2].Seq, "numbering goes on from the old calls")
	require.Equal(t, simulator.CallFenced, calls[3].Outcome)
}
