package storetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// testFindEventsAfter: FindEventsAfter is FindEvents from a seq on, a page
// at a time: the same events, field for field, of that run alone, in
// order; nothing after the head nor for an unknown run; pages that put
// together make the whole chain.
func testFindEventsAfter(t *testing.T, h Harness) {
	ctx := context.Background()
	b, run, _ := chainFixture(t, h)
	// Another run's events interleave with the fixture's in the table.
	other := b.RunningRun(t, "other", ledger.BudgetLimits{})
	for range 3 {
		_, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, Tokens: 1})
		require.NoError(t, err)
		_, err = b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: other.ID, Steps: 1, Tokens: 1})
		require.NoError(t, err)
	}
	all, err := b.Store.FindEvents(ctx, run.ID)
	require.NoError(t, err)
	head := int64(len(all))
	require.Equal(t, head, all[len(all)-1].Seq)
	after := func(t *testing.T, f ledger.EventFilter) []*ledger.Event {
		t.Helper()
		evs, err := b.Store.FindEventsAfter(ctx, f)
		require.NoError(t, err)
		require.NotNil(t, evs, "an empty slice, not nil")
		return evs
	}

	t.Run("OK", func(t *testing.T) {
		require.Equal(t, all, after(t, ledger.EventFilter{RunID: run.ID}), "from the start, no limit: every event")
		require.Equal(t, all[3:], after(t, ledger.EventFilter{RunID: run.ID, AfterSeq: 3}))
		require.Equal(t, all[3:5], after(t, ledger.EventFilter{RunID: run.ID, AfterSeq: 3, Limit: 2}))
		require.Equal(t, all[head-1:], after(t, ledger.EventFilter{RunID: run.ID, AfterSeq: head - 1, Limit: 10}))
	})
	t.Run("OK pages", func(t *testing.T) {
		var got []*ledger.Event
		for seq := int64(0); ; {
			page := after(t, ledger.EventFilter{RunID: run.ID, AfterSeq: seq, Limit: 3})
			require.LessOrEqual(t, len(page), 3)
			if len(page) == 0 {
				break
			}
			got = append(got, page...)
			seq = page[len(page)-1].Seq
		}
		require.Equal(t, all, got)
	})
	t.Run("OK none", func(t *testing.T) {
		require.Empty(t, after(t, ledger.EventFilter{RunID: run.ID, AfterSeq: head}), "nothing after the head")
		require.Empty(t, after(t, ledger.EventFilter{RunID: run.ID, AfterSeq: head + 100}))
		require.Empty(t, after(t, ledger.EventFilter{RunID: "run_nope"}), "an unknown run has none")
	})
	t.Run("OK new events", func(t *testing.T) {
		_, err := b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, Tokens: 1})
		require.NoError(t, err)
		evs := after(t, ledger.EventFilter{RunID: run.ID, AfterSeq: head})
		require.Len(t, evs, 1, "the one written since")
		require.Equal(t, head+1, evs[0].Seq)
		require.Equal(t, run.ID, evs[0].RunID)
		require.Equal(t, all[len(all)-1].Hash, evs[0].PrevHash, "the next link of the chain")
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		_, err := b.Store.FindEventsAfter(ctx, ledger.EventFilter{RunID: run.ID, AfterSeq: -1})
		require.ErrorIs(t, err, ledger.ErrInvalid)
		_, err = b.Store.FindEventsAfter(ctx, ledger.EventFilter{RunID: run.ID, Limit: -1})
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})
}
