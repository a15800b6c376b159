package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
)

func TestNotesAgent(t *testing.T) {
	dir := t.TempDir()
	o := options{DB: filepath.Join(dir, "agent.db"), Effects: filepath.Join(dir, "notes.db"), Key: "note-1", Text: "hello"}
	ctx := context.Background()
	first, err := runAgent(ctx, o)
	require.NoError(t, err)
	require.Equal(t, ledger.RunCompleted, first.State)

	again, err := runAgent(ctx, o)
	require.NoError(t, err)
	require.Equal(t, first.ID, again.ID, "the same key is the same run")

	o.Key, o.Text = "note-2", "world"
	second, err := runAgent(ctx, o)
	require.NoError(t, err)
	require.NotEqual(t, first.ID, second.ID)

	notes, err := openNotes(o.Effects)
	require.NoError(t, err)
	defer notes.db.Close()
	n, err := notes.count(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n, "one note per run, counted in the tool's own store")
	var token int64
	require.NoError(t, notes.db.QueryRowContext(ctx, `SELECT token FROM fences WHERE run_id = ?`, first.ID).Scan(&token))
	require.Positive(t, token, "the call carried the fencing token of the run's lease")

	store, err := sqlite.OpenStore(ctx, sqlite.Config{Path: o.DB})
	require.NoError(t, err)
	defer store.Close()
	rep, err := store.VerifyChain(ctx, first.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	aprs, err := store.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &first.ID})
	require.NoError(t, err)
	require.Len(t, aprs, 1)
	require.Equal(t, "operator", aprs[0].DecidedBy, "the write ran after a person's approval")
}

// TestNotesToolFencing: a call whose fencing token is older than one the
// tool has seen for the run is refused with effect not_happened, and
// writes nothing; the run's holder, a newer one and a call under no lease
// write.
func TestNotesToolFencing(t *testing.T) {
	ctx := context.Background()
	notes, err := openNotes(filepath.Join(t.TempDir(), "notes.db"))
	require.NoError(t, err)
	defer notes.db.Close()
	call := func(key string, token int64) error {
		_, err := notes.Execute(ctx, engine.Call{RunID: "run_1", DedupKey: "run_1/" + key, FencingToken: token,
			Arguments: json.RawMessage(`{"text":"hi"}`)})
		return err
	}
	require.NoError(t, call("act_1", 2))
	err = call("act_2", 1)
	var te *engine.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "fenced", te.Code)
	require.Equal(t, ledger.EffectNotHappened, te.Effect)
	require.ErrorContains(t, err, "stale fencing token 1")
	for i, token := range []int64{2, 3, 0} {
		require.NoError(t, call(fmt.Sprintf("act_%d", i+3), token))
	}
	n, err := notes.count(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n, "every call but the stale one wrote its note")
}
