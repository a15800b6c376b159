package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

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
