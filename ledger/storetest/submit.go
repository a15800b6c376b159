package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

func submitParams(key, title string) ledger.SubmitRunParams {
	return ledger.SubmitRunParams{
		Tenant: "acme", IdempotencyKey: key, Principal: "alice", Agent: "practice-cards",
		Input: json.RawMessage(fmt.Sprintf(`{"title": %q, "markdown": "# a"}`, title)),
	}
}

func testSubmitRun(t *testing.T, h Harness) {
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		b := openStore(t, h)
		res, err := b.Store.SubmitRun(ctx, submitParams("k1", "cards"))
		require.NoError(t, err)
		require.False(t, res.Replayed)
		run := res.Run
		require.True(t, ledger.ValidID(ledger.PrefixRun, string(run.ID)), run.ID)
		require.Equal(t, ledger.RunQueued, run.State)
		require.Empty(t, run.StopReason)
		require.True(t, run.RequestDigest.Valid())
		require.JSONEq(t, `{"title":"cards","markdown":"# a"}`, string(run.Input))
		require.Equal(t, "alice", run.SubmittedBy)
		require.Equal(t, int64(1), run.EventSeq)
	})

	t.Run("replay returns the same run", func(t *testing.T) {
		b := openStore(t, h)
		first, err := b.Store.SubmitRun(ctx, submitParams("k1", "cards"))
		require.NoError(t, err)
		// Same content, other key order and whitespace: the same request.
		p := submitParams("k1", "cards")
		p.Input = json.RawMessage(`{ "markdown":"# a",   "title":"cards" }`)
		again, err := b.Store.SubmitRun(ctx, p)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, first.Run.ID, again.Run.ID)
		require.Equal(t, first.Run.EventSeq, again.Run.EventSeq, "a replay writes nothing")
		runs, err := b.Store.FindRuns(ctx, ledger.RunFilter{})
		require.NoError(t, err)
		require.Len(t, runs, 1)
	})

	t.Run("ErrConflict on key reuse with another body, nothing changes", func(t *testing.T) {
		b := openStore(t, h)
		first, err := b.Store.SubmitRun(ctx, submitParams("k1", "cards"))
		require.NoError(t, err)
		for name, p := range map[string]ledger.SubmitRunParams{
			"input":   submitParams("k1", "other"),
			"agent":   func() ledger.SubmitRunParams { p := submitParams("k1", "cards"); p.Agent = "other"; return p }(),
			"budgets": func() ledger.SubmitRunParams { p := submitParams("k1", "cards"); p.Budgets.MaxSteps = 3; return p }(),
		} {
			t.Run(name, func(t *testing.T) {
				_, err := b.Store.SubmitRun(ctx, p)
				require.ErrorIs(t, err, ledger.ErrConflict)
				require.ErrorIs(t, err, ledger.ErrKeyReused, "the API answers 422 for this conflict alone")
				require.Contains(t, err.Error(), "different request")
			})
		}
		runs, err := b.Store.FindRuns(ctx, ledger.RunFilter{})
		require.NoError(t, err)
		require.Len(t, runs, 1)
		got, err := b.Store.FindRunByID(ctx, first.Run.ID)
		require.NoError(t, err)
		require.Equal(t, first.Run, got)
	})

	t.Run("a deadline is fixed at submit and does not change the digest of a replay", func(t *testing.T) {
		b := openStore(t, h)
		p := submitParams("k1", "cards")
		p.Budgets.DeadlineAfter = time.Hour
		first, err := b.Store.SubmitRun(ctx, p)
		require.NoError(t, err)
		require.Equal(t, b.Clock.Now().Add(time.Hour), *first.Run.Budget.Deadline)
		require.Equal(t, time.Hour, first.Run.Budget.Limits.DeadlineAfter)
		b.Clock.Advance(time.Minute)
		again, err := b.Store.SubmitRun(ctx, p)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, first.Run.Budget.Deadline, again.Run.Budget.Deadline, "the replay keeps the first deadline")
	})

	t.Run("keys are per tenant", func(t *testing.T) {
		b := openStore(t, h)
		a, err := b.Store.SubmitRun(ctx, submitParams("k1", "cards"))
		require.NoError(t, err)
		p := submitParams("k1", "other")
		p.Tenant = "globex"
		g, err := b.Store.SubmitRun(ctx, p)
		require.NoError(t, err)
		require.False(t, g.Replayed)
		require.NotEqual(t, a.Run.ID, g.Run.ID)
		tenant := "globex"
		runs, err := b.Store.FindRuns(ctx, ledger.RunFilter{Tenant: &tenant})
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.Equal(t, g.Run.ID, runs[0].ID)
		alice := "alice"
		mine, err := b.Store.FindRuns(ctx, ledger.RunFilter{Tenant: &tenant, SubmittedBy: &alice})
		require.NoError(t, err)
		require.Len(t, mine, 1)
		nobody := "nobody"
		none, err := b.Store.FindRuns(ctx, ledger.RunFilter{SubmittedBy: &nobody})
		require.NoError(t, err)
		require.Empty(t, none)
	})

	t.Run("ErrInvalid", func(t *testing.T) {
		b := openStore(t, h)
		long := make([]byte, 256)
		for i := range long {
			long[i] = 'k'
		}
		cases := map[string]func(p *ledger.SubmitRunParams){
			"no tenant":         func(p *ledger.SubmitRunParams) { p.Tenant = "" },
			"no key":            func(p *ledger.SubmitRunParams) { p.IdempotencyKey = "" },
			"key too long":      func(p *ledger.SubmitRunParams) { p.IdempotencyKey = string(long) },
			"key not printable": func(p *ledger.SubmitRunParams) { p.IdempotencyKey = "a\nb" },
			"key not ascii":     func(p *ledger.SubmitRunParams) { p.IdempotencyKey = "clé" },
			"no agent":          func(p *ledger.SubmitRunParams) { p.Agent = "" },
			"no principal":      func(p *ledger.SubmitRunParams) { p.Principal = "" },
			"no input":          func(p *ledger.SubmitRunParams) { p.Input = nil },
			"malformed input":   func(p *ledger.SubmitRunParams) { p.Input = json.RawMessage(`{"a":`) },
			"duplicate keys":    func(p *ledger.SubmitRunParams) { p.Input = json.RawMessage(`{"a":1,"a":2}`) },
			"too deep":          func(p *ledger.SubmitRunParams) { p.Input = deepJSON(33) },
			"trailing garbage":  func(p *ledger.SubmitRunParams) { p.Input = json.RawMessage(`{} {}`) },
		}
		for name, mutate := range cases {
			t.Run(name, func(t *testing.T) {
				p := submitParams("k1", "cards")
				mutate(&p)
				_, err := b.Store.SubmitRun(ctx, p)
				require.ErrorIs(t, err, ledger.ErrInvalid)
			})
		}
		runs, err := b.Store.FindRuns(ctx, ledger.RunFilter{})
		require.NoError(t, err)
		require.Empty(t, runs)
	})
}

// testSubmitRunRace races 50 goroutines, split over two Stores (two
// connection pools, as two processes would have) on one database,
// submitting the same key: exactly one run, everyone gets its id.
func testSubmitRunRace(t *testing.T, h Harness) {
	ctx := context.Background()
	b := openStore(t, h)
	stores := []ledger.Store{b.Store, b.reopen(t, Options{})}

	const n = 50
	var wg sync.WaitGroup
	ids := make([]ledger.RunID, n)
	replayed := make([]bool, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := stores[i%2].SubmitRun(ctx, submitParams("same-key", "cards"))
			errs[i] = err
			if err == nil {
				ids[i], replayed[i] = res.Run.ID, res.Replayed
			}
		})
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, ids[0], ids[i])
		if !replayed[i] {
			fresh++
		}
	}
	require.Equal(t, 1, fresh, "exactly one submit created the run")
	runs, err := stores[0].FindRuns(ctx, ledger.RunFilter{})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	events, err := stores[1].FindEvents(ctx, runs[0].ID)
	require.NoError(t, err)
	require.Len(t, events, 1, "one submitted event")
}

func deepJSON(depth int) json.RawMessage {
	s := ""
	for range depth {
		s += `{"a":`
	}
	s += "1"
	for range depth {
		s += "}"
	}
	return json.RawMessage(s)
}
