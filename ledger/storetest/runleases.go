package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// Run leases (ledger/runleases.go). A driver compares leases against the
// Store's clock (SQLite) or the database's (PostgreSQL), so a test that
// needs a lease to lapse gives it a short TTL and lets both clocks pass it
// (lapse); a test that needs a lease to hold gives it an hour.

// shortTTL is the TTL of a lease a test lets lapse.
const shortTTL = 300 * time.Millisecond

// lapse lets a lease of shortTTL lapse on the Store's clock and on the
// database's.
func lapse(b *bundle) {
	b.Clock.Advance(time.Hour)
	time.Sleep(shortTTL + 100*time.Millisecond)
}

// claimOne claims run for owner with ttl, requiring that it gets it.
func claimOne(t *testing.T, s ledger.Store, owner string, run ledger.RunID, ttl time.Duration) ledger.RunLease {
	t.Helper()
	got, err := s.ClaimRuns(context.Background(), ledger.ClaimRunsParams{Owner: owner, TTL: ttl, Limit: 1,
		States: liveStates(), Runs: []ledger.RunID{run}})
	require.NoError(t, err)
	require.Len(t, got, 1, "%s claims %s", owner, run)
	require.Equal(t, run, got[0].Run)
	return got[0]
}

// liveStates are the states a run may be claimed in.
func liveStates() []ledger.RunState {
	var out []ledger.RunState
	for _, st := range ledger.RunStates() {
		if !st.Terminal() {
			out = append(out, st)
		}
	}
	return out
}

// leaseIDs are the runs of leases, in order.
func leaseIDs(ls []ledger.RunLease) []ledger.RunID {
	out := make([]ledger.RunID, len(ls))
	for i, l := range ls {
		out[i] = l.Run
	}
	return out
}

// runSnapshot is what a refused write must leave as it was: the run, its
// events and its actions.
type runSnapshot struct {
	Run     *ledger.Run
	Events  int
	Actions int
}

func snapshotRun(t *testing.T, s ledger.Store, run ledger.RunID) runSnapshot {
	t.Helper()
	ctx := context.Background()
	r, err := s.FindRunByID(ctx, run)
	require.NoError(t, err)
	evs, err := s.FindEvents(ctx, run)
	require.NoError(t, err)
	acts, err := s.FindActions(ctx, ledger.ActionFilter{RunID: &run})
	require.NoError(t, err)
	return runSnapshot{Run: r, Events: len(evs), Actions: len(acts)}
}

func testRunLeases(t *testing.T, h Harness) {
	ctx := context.Background()
	queued := []ledger.RunState{ledger.RunQueued}

	t.Run("OK claims free runs oldest first, each with token 1", func(t *testing.T) {
		b := openStore(t, h)
		var ids []ledger.RunID
		for i := range 4 {
			ids = append(ids, b.SubmitRun(t, fmt.Sprintf("k%d", i), ledger.BudgetLimits{}).ID)
		}
		running := b.RunningRun(t, "running", ledger.BudgetLimits{})
		got, err := b.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "a", TTL: time.Hour, Limit: 3, States: queued})
		require.NoError(t, err)
		require.Equal(t, ids[:3], leaseIDs(got), "the oldest three queued runs, in id order")
		for _, l := range got {
			require.Equal(t, "a", l.Owner)
			require.Equal(t, int64(1), l.Token)
			require.False(t, l.Until.IsZero())
			stored, err := b.Store.FindRunLease(ctx, l.Run)
			require.NoError(t, err)
			require.Equal(t, l, stored)
		}
		rest, err := b.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "a", TTL: time.Hour, Limit: 10, States: queued})
		require.NoError(t, err)
		require.Equal(t, ids[3:], leaseIDs(rest), "the claimed ones are not claimed again")
		free, err := b.Store.FindRunLease(ctx, running.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunLease{Run: running.ID}, free, "a run in another state stays free")
	})

	t.Run("OK NotAgents and Runs narrow the claim; a terminal run is never claimed", func(t *testing.T) {
		b := openStore(t, h)
		mine := b.RunningRun(t, "mine", ledger.BudgetLimits{})
		res, err := b.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "client", Principal: "alice",
			Agent: "client-agent", Input: json.RawMessage(`{}`), Start: true})
		require.NoError(t, err)
		client := res.Run
		other := b.RunningRun(t, "other", ledger.BudgetLimits{})
		ended := b.RunningRun(t, "ended", ledger.BudgetLimits{})
		endRun(t, b, ended.ID)
		got, err := b.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "a", TTL: time.Hour, Limit: 10,
			States: []ledger.RunState{ledger.RunRunning}, NotAgents: []string{"client-agent"}, Runs: []ledger.RunID{mine.ID, client.ID, ended.ID}})
		require.NoError(t, err)
		require.Equal(t, []ledger.RunID{mine.ID}, leaseIDs(got))
		got, err = b.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "a", TTL: time.Hour, Limit: 10, States: liveStates(),
			NotAgents: []string{"client-agent"}})
		require.NoError(t, err)
		require.Equal(t, []ledger.RunID{other.ID}, leaseIDs(got))
	})

	t.Run("OK a held lease is not claimed again, by anyone", func(t *testing.T) {
		b := openStore(t, h)
		run := b.SubmitRun(t, "k", ledger.BudgetLimits{})
		second := b.reopen(t, Options{})
		first := claimOne(t, b.Store, "a", run.ID, time.Hour)
		for _, s := range []ledger.Store{b.Store, second} {
			for _, owner := range []string{"a", "b"} {
				got, err := s.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: owner, TTL: time.Hour, Limit: 10, States: queued})
				require.NoError(t, err)
				require.Empty(t, got)
			}
		}
		stored, err := second.FindRunLease(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, first, stored)
	})

	t.Run("OK a lapsed lease is claimed by another with the token raised", func(t *testing.T) {
		b := openStore(t, h)
		run := b.SubmitRun(t, "k", ledger.BudgetLimits{})
		second := b.reopen(t, Options{})
		first := claimOne(t, b.Store, "a", run.ID, shortTTL)
		lapse(b)
		next := claimOne(t, second, "b", run.ID, time.Hour)
		require.Equal(t, "b", next.Owner)
		require.Equal(t, first.Token+1, next.Token)
		renewed, err := b.Store.RenewRunLeases(ctx, "a", []ledger.RunLease{first}, time.Hour)
		require.NoError(t, err)
		require.Empty(t, renewed, "the old holder's lease is gone")
		stored, err := b.Store.FindRunLease(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, next, stored)
	})

	t.Run("OK TakeOver claims a named holder's lease before it lapses, no one else's", func(t *testing.T) {
		b := openStore(t, h)
		r1, r2 := b.SubmitRun(t, "k1", ledger.BudgetLimits{}), b.SubmitRun(t, "k2", ledger.BudgetLimits{})
		b.SubmitRun(t, "k3", ledger.BudgetLimits{})
		dead := claimOne(t, b.Store, "dead", r1.ID, time.Hour)
		claimOne(t, b.Store, "alive", r2.ID, time.Hour)
		owners, err := b.Store.FindRunLeaseOwners(ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"alive", "dead"}, owners)
		got, err := b.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "heir", TTL: time.Hour, Limit: 10, States: queued,
			TakeOver: []string{"dead", "nobody"}})
		require.NoError(t, err)
		require.Len(t, got, 2, "the dead holder's run and the free one")
		require.Equal(t, r1.ID, got[0].Run)
		require.Equal(t, dead.Token+1, got[0].Token)
		stored, err := b.Store.FindRunLease(ctx, r2.ID)
		require.NoError(t, err)
		require.Equal(t, "alive", stored.Owner, "a live holder's lease stays")
		owners, err = b.Store.FindRunLeaseOwners(ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"alive", "heir"}, owners)
		require.NoError(t, b.Store.ReleaseRunLease(ctx, got[0]))
		require.NoError(t, b.Store.ReleaseRunLease(ctx, got[1]))
		owners, err = b.Store.FindRunLeaseOwners(ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"alive"}, owners, "a released lease has no owner")
	})

	t.Run("OK renew extends, never shortens, and keeps only what is held", func(t *testing.T) {
		b := openStore(t, h)
		r1, r2 := b.SubmitRun(t, "k1", ledger.BudgetLimits{}), b.SubmitRun(t, "k2", ledger.BudgetLimits{})
		l1 := claimOne(t, b.Store, "a", r1.ID, shortTTL)
		l2 := claimOne(t, b.Store, "a", r2.ID, time.Hour)
		renewed, err := b.Store.RenewRunLeases(ctx, "a", []ledger.RunLease{l1, l2}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []ledger.RunID{r1.ID, r2.ID}, leaseIDs(renewed))
		require.True(t, renewed[0].Until.After(l1.Until), "a short lease is extended")
		require.Equal(t, l2.Until, renewed[1].Until, "an hour's lease is not shortened to a minute")
		for _, l := range renewed {
			stored, err := b.Store.FindRunLease(ctx, l.Run)
			require.NoError(t, err)
			require.Equal(t, l, stored)
		}
		// Lapsed but claimed by nobody: still the holder's, renewed.
		l3 := claimOne(t, b.Store, "a", b.SubmitRun(t, "k3", ledger.BudgetLimits{}).ID, shortTTL)
		lapse(b)
		renewed, err = b.Store.RenewRunLeases(ctx, "a", []ledger.RunLease{l3}, time.Hour)
		require.NoError(t, err)
		require.Len(t, renewed, 1)
		require.Equal(t, l3.Token, renewed[0].Token)

		wrongToken := l2
		wrongToken.Token++
		renewed, err = b.Store.RenewRunLeases(ctx, "a", []ledger.RunLease{wrongToken}, time.Hour)
		require.NoError(t, err)
		require.Empty(t, renewed)
		_, err = b.Store.RenewRunLeases(ctx, "b", []ledger.RunLease{l2}, time.Hour)
		require.ErrorIs(t, err, ledger.ErrInvalid, "another owner's lease")
		renewed, err = b.Store.RenewRunLeases(ctx, "a", nil, time.Hour)
		require.NoError(t, err)
		require.Empty(t, renewed)
	})

	t.Run("OK release frees the run at once and keeps the token", func(t *testing.T) {
		b := openStore(t, h)
		run := b.SubmitRun(t, "k", ledger.BudgetLimits{})
		second := b.reopen(t, Options{})
		first := claimOne(t, b.Store, "a", run.ID, time.Hour)
		require.NoError(t, b.Store.ReleaseRunLease(ctx, first))
		stored, err := b.Store.FindRunLease(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunLease{Run: run.ID, Token: first.Token}, stored)
		renewed, err := b.Store.RenewRunLeases(ctx, "a", []ledger.RunLease{first}, time.Hour)
		require.NoError(t, err)
		require.Empty(t, renewed, "a released lease is not renewed")
		next := claimOne(t, second, "b", run.ID, time.Hour)
		require.Equal(t, first.Token+1, next.Token)
		require.NoError(t, b.Store.ReleaseRunLease(ctx, first), "releasing a lease no longer held does nothing")
		stored, err = b.Store.FindRunLease(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, next, stored)
	})

	t.Run("OK leases leave the chain alone", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		before := snapshotRun(t, b.Store, run.ID)
		l := claimOne(t, b.Store, "a", run.ID, time.Hour)
		_, err := b.Store.RenewRunLeases(ctx, "a", []ledger.RunLease{l}, 2*time.Hour)
		require.NoError(t, err)
		chainOK(t, b, run.ID)
		require.NoError(t, b.Store.ReleaseRunLease(ctx, l))
		require.Equal(t, before, snapshotRun(t, b.Store, run.ID))
		chainOK(t, b, run.ID)
	})

	t.Run("ErrLeaseLost a stale holder's write is refused and writes nothing", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		second := b.reopen(t, Options{})
		stale := claimOne(t, b.Store, "a", run.ID, shortTTL)
		lapse(b)
		current := claimOne(t, second, "b", run.ID, time.Hour)
		before := snapshotRun(t, b.Store, run.ID)
		staleCtx := ledger.WithRunLease(ctx, stale)

		_, err := b.Store.TransitionRun(staleCtx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunFailed,
			StopReason: ledger.StopInternalError, Actor: "engine"})
		require.ErrorIs(t, err, ledger.ErrLeaseLost)
		require.ErrorIs(t, err, ledger.ErrConflict)
		_, err = b.Store.CreateAction(staleCtx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: "step-1", Tool: "cards.write",
			ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"title":"t"}`), Gate: ledger.ActionApproved,
			StartAttempt: true, Actor: "engine"})
		require.ErrorIs(t, err, ledger.ErrLeaseLost)
		_, err = b.Store.AddUsage(staleCtx, ledger.AddUsageParams{RunID: run.ID, Steps: 1})
		require.ErrorIs(t, err, ledger.ErrLeaseLost)
		require.Equal(t, before, snapshotRun(t, b.Store, run.ID), "nothing written")

		// The holder writes, with its lease.
		_, err = second.TransitionRun(ledger.WithRunLease(ctx, current), ledger.RunTransition{ID: run.ID, From: ledger.RunRunning,
			To: ledger.RunFailed, StopReason: ledger.StopInternalError, Actor: "engine"})
		require.NoError(t, err)
		chainOK(t, b, run.ID)
	})

	t.Run("ErrConflict only when the lease is not what moved: an ordinary lost race stays a plain conflict", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		l := claimOne(t, b.Store, "a", run.ID, time.Hour)
		_, err := b.Store.TransitionRun(ledger.WithRunLease(ctx, l), ledger.RunTransition{ID: run.ID, From: ledger.RunQueued,
			To: ledger.RunRunning, Actor: "engine"})
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.NotErrorIs(t, err, ledger.ErrLeaseLost)
	})

	t.Run("OK a person's decisions are not fenced", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		second := b.reopen(t, Options{})
		stale := claimOne(t, b.Store, "a", run.ID, shortTTL)
		lapse(b)
		claimOne(t, second, "b", run.ID, time.Hour)
		// A process that holds no lease of the run (stale is not in ctx)
		// records a client's request, a person's approval, then a cancel.
		act := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval)
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunAwaitingApproval, Actor: "engine"})
		require.NoError(t, err)
		dec, err := b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: act.Action.ID,
			ActionDigest: act.Action.ActionDigest, Decision: ledger.DecisionGrant, Principal: "bob"})
		require.NoError(t, err)
		require.Equal(t, ledger.ActionApproved, dec.Action.State)
		_, err = b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "bob"})
		require.NoError(t, err)
		got, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunStopping, got.State)
		// A lease of another run fences nothing of this one.
		other := b.RunningRun(t, "other", ledger.BudgetLimits{})
		_, err = b.Store.AddUsage(ledger.WithRunLease(ctx, ledger.RunLease{Run: other.ID, Owner: "a", Token: stale.Token}),
			ledger.AddUsageParams{RunID: run.ID, Steps: 1})
		require.NoError(t, err)
		chainOK(t, b, run.ID)
	})

	t.Run("OK a stale holder's outcome is kept as an observation", func(t *testing.T) {
		b := openStore(t, h)
		run := b.RunningRun(t, "k", ledger.BudgetLimits{})
		res := b.Action(t, run.ID, "step-1", ledger.ActionApproved)
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: res.Action.ID, Actor: "engine"})
		require.NoError(t, err)
		obs, got, err := b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: att.ID,
			Source: ledger.ObservedStaleHolder, Effect: ledger.EffectHappened, Detail: json.RawMessage(`{"id":"c1"}`), Actor: "engine"})
		require.NoError(t, err)
		require.Equal(t, ledger.ObservedStaleHolder, obs.Source)
		require.Equal(t, ledger.EffectHappened, got.Effect)
		require.Equal(t, ledger.AttemptStarted, got.Status, "the attempt is the new holder's recovery's to close")
		chainOK(t, b, run.ID)
	})

	t.Run("OK two Stores claiming at once never both hold a run", func(t *testing.T) {
		b := openStore(t, h)
		const n = 40
		for i := range n {
			b.SubmitRun(t, fmt.Sprintf("k%02d", i), ledger.BudgetLimits{})
		}
		stores := []ledger.Store{b.Store, b.reopen(t, Options{})}
		held := make([][]ledger.RunID, 2*len(stores))
		var wg sync.WaitGroup
		errs := make(chan error, len(held))
		for i := range held {
			wg.Go(func() {
				s := stores[i%len(stores)]
				for {
					got, err := s.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: fmt.Sprintf("p%d", i), TTL: time.Hour, Limit: 3, States: queued})
					if err != nil {
						errs <- err
						return
					}
					if len(got) == 0 {
						return
					}
					held[i] = append(held[i], leaseIDs(got)...)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		var all []ledger.RunID
		for _, ids := range held {
			all = append(all, ids...)
		}
		slices.Sort(all)
		require.Len(t, all, n, "every run claimed")
		require.Len(t, slices.Compact(all), n, "no run claimed twice")
		for i, ids := range held {
			for _, id := range ids {
				l, err := b.Store.FindRunLease(ctx, id)
				require.NoError(t, err)
				require.Equal(t, fmt.Sprintf("p%d", i), l.Owner)
				require.Equal(t, int64(1), l.Token)
			}
		}
	})

	t.Run("ErrInvalid bad claims", func(t *testing.T) {
		b := openStore(t, h)
		ok := ledger.ClaimRunsParams{Owner: "a", TTL: time.Hour, Limit: 1, States: queued}
		for name, tweak := range map[string]func(*ledger.ClaimRunsParams){
			"no owner":       func(p *ledger.ClaimRunsParams) { p.Owner = "" },
			"control owner":  func(p *ledger.ClaimRunsParams) { p.Owner = "a\nb" },
			"no ttl":         func(p *ledger.ClaimRunsParams) { p.TTL = 0 },
			"no limit":       func(p *ledger.ClaimRunsParams) { p.Limit = 0 },
			"no state":       func(p *ledger.ClaimRunsParams) { p.States = nil },
			"terminal state": func(p *ledger.ClaimRunsParams) { p.States = []ledger.RunState{ledger.RunCompleted} },
			"unknown state":  func(p *ledger.ClaimRunsParams) { p.States = []ledger.RunState{"sleeping"} },
			"empty takeover": func(p *ledger.ClaimRunsParams) { p.TakeOver = []string{""} },
		} {
			p := ok
			tweak(&p)
			_, err := b.Store.ClaimRuns(ctx, p)
			require.ErrorIs(t, err, ledger.ErrInvalid, name)
		}
		_, err := b.Store.RenewRunLeases(ctx, "a", nil, 0)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		require.ErrorIs(t, b.Store.ReleaseRunLease(ctx, ledger.RunLease{Run: "run_x"}), ledger.ErrInvalid)
		_, err = b.Store.FindRunLease(ctx, "run_missing")
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}
