package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// The tests of this file go through HTTP only, against the real engine
// and store: what an outside client (or attacker) sees.

// waitTerminal waits, with a deadline, until the engine's pool has ended
// the run.
func waitTerminal(t *testing.T, e *env, id ledger.RunID) *ledger.Run {
	t.Helper()
	var run *ledger.Run
	require.Eventually(t, func() bool {
		r, err := e.Store.FindRunByID(context.Background(), id)
		run = r
		return err == nil && r.State.Terminal()
	}, 10*time.Second, 2*time.Millisecond, "run %s never ended", id)
	return run
}

// getRunView reads GET /v1/runs/{id} as principal.
func getRunView(t *testing.T, e *env, principal string, id ledger.RunID) server.Run {
	t.Helper()
	res := e.get(t, principal, "/v1/runs/"+string(id))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var r server.Run
	decode(t, res, &r)
	return r
}

// TestCancelRacingCompletion cancels runs while the engine's pool is
// completing them: each cancel is sent the moment the worker passes a
// point of the attempt (after it is recorded, after the tool call, after
// its result is recorded), so it lands anywhere between the attempt and
// the run's end. Every answer must be one decision: 202 with a
// cancellation that settles (confirmed, the run stopped user_cancelled),
// or 409 with nothing stored (the run completed, no cancellation).
func TestCancelRacingCompletion(t *testing.T) {
	t.Parallel()
	points := []engine.FaultPoint{engine.FaultAfterAttemptRecorded, engine.FaultAfterToolCall, engine.FaultAfterResultRecorded}
	var armed atomic.Value // the engine.FaultPoint to report once
	armed.Store(engine.FaultPoint(""))
	reached := make(chan struct{}, 1)
	e := newEnv(t, options{fault: func(p engine.FaultPoint) {
		if armed.CompareAndSwap(p, engine.FaultPoint("")) {
			reached <- struct{}{}
		}
	}})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	e.engine.Start(ctx)
	defer e.engine.Stop()

	const tries = 45
	outcomes := map[int]int{}
	for i := range tries {
		id := e.submit(t, "alice", "race-"+strconv.Itoa(i))
		waitState(t, e, id, ledger.RunAwaitingApproval)
		a := e.pendingAction(t, id)
		armed.Store(points[i%len(points)])
		res := e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		select {
		case <-reached:
		case <-time.After(10 * time.Second):
			t.Fatalf("try %d: the worker never reached %s", i, points[i%len(points)])
		}
		res = e.post(t, "alice", "/v1/runs/"+string(id)+"/cancel", `{"reason":"race"}`)
		outcomes[res.Status]++
		switch res.Status {
		case http.StatusAccepted:
			waitTerminal(t, e, id)
			r := getRunView(t, e, "alice", id)
			require.NotNil(t, r.Cancellation, "try %d", i)
			require.Equal(t, ledger.CancelStopped, r.Cancellation.State, "try %d: a 202's cancellation settles", i)
			require.Equal(t, ledger.RunStopped, r.State, "try %d", i)
			require.Equal(t, ledger.StopUserCancelled, r.StopReason, "try %d", i)
		case http.StatusConflict:
			requireProblem(t, res, http.StatusConflict, "conflict")
			r := getRunView(t, e, "alice", id)
			require.Nil(t, r.Cancellation, "try %d: a 409 stores nothing", i)
			require.Equal(t, ledger.RunCompleted, r.State, "try %d", i)
		default:
			t.Fatalf("try %d: cancel answered %d: %s", i, res.Status, res.Body)
		}
		chain := e.get(t, "alice", "/v1/runs/"+string(id)+"/timeline")
		var tl server.Timeline
		decode(t, chain, &tl)
		require.True(t, tl.Chain.OK, "try %d: %s", i, tl.Chain.Reason)
	}
	t.Logf("answers: %v", outcomes)
}

// TestParallelCancels sends 20 cancels of one run at once: every one is
// 202 with the same cancellation, and so is a cancel after the run ended.
func TestParallelCancels(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	id, _ := e.awaiting(t, "alice", "k1")
	const n = 20
	var wg sync.WaitGroup
	answers := make([]response, n)
	for i := range n {
		wg.Go(func() {
			answers[i] = e.post(t, "alice", "/v1/runs/"+string(id)+"/cancel", `{"reason":"stop `+strconv.Itoa(i)+`"}`)
		})
	}
	wg.Wait()
	cancellationID := func(r response) string {
		var c map[string]any
		require.NoError(t, json.Unmarshal(r.Body, &c), string(r.Body))
		s, _ := c["id"].(string)
		return s
	}
	statuses := map[int]int{}
	ids := map[string]int{}
	for _, r := range answers {
		statuses[r.Status]++
		ids[cancellationID(r)]++
	}
	require.Equal(t, map[int]int{http.StatusAccepted: n}, statuses, "every repeat is the same 202")
	require.Len(t, ids, 1, "one cancellation: %v", ids)
	for cid := range ids {
		require.True(t, ledger.ValidID(ledger.PrefixCancellation, cid), cid)
	}

	run := e.advance(t, id)
	require.Equal(t, ledger.RunStopped, run.State)
	after := e.post(t, "root", "/v1/runs/"+string(id)+"/cancel", `{}`)
	require.Equal(t, http.StatusAccepted, after.Status, "also once the run has ended: %s", after.Body)
	require.Equal(t, answers[0].Status, after.Status)
	require.Contains(t, ids, cancellationID(after))
	var c server.Cancellation
	decode(t, after, &c)
	require.Equal(t, ledger.CancelStopped, c.State)
	require.Equal(t, "alice", c.RequestedBy, "the first request stands")
}

// secretReason is a secret-shaped string a person might paste into a
// reason.
const secretReason = "sk-REASONsecretREASON0123456789abcd"

// TestReasonsRedacted gives a secret in the reason of an approve, a deny
// and a cancel, and in the note of a resolve: the answers, GET
// /v1/runs/{id}, GET /v1/actions/{id} and every column of the database
// hold its marker, never the secret.
func TestReasonsRedacted(t *testing.T) {
	t.Parallel()
	reason := "ok, rotated the old key " + secretReason + " already"
	body := func(d ledger.Digest) string {
		b, err := json.Marshal(map[string]string{"action_digest": string(d), "reason": reason})
		require.NoError(t, err)
		return string(b)
	}
	requireClean := func(t *testing.T, what string, b []byte) {
		t.Helper()
		require.NotContains(t, string(b), secretReason, what)
		require.Contains(t, string(b), "[redacted:", what)
	}

	t.Run("approve, deny and cancel", func(t *testing.T) {
		e := newEnv(t, options{})
		approved, a1 := e.awaiting(t, "alice", "k1")
		res := e.post(t, "bob", "/v1/actions/"+string(a1.ID)+"/approve", body(a1.ActionDigest))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		requireClean(t, "approve answer", res.Body)
		denied, a2 := e.awaiting(t, "alice", "k2")
		res = e.post(t, "bob", "/v1/actions/"+string(a2.ID)+"/deny", body(a2.ActionDigest))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		requireClean(t, "deny answer", res.Body)
		cancelled, _ := e.awaiting(t, "alice", "k3")
		res = e.post(t, "alice", "/v1/runs/"+string(cancelled)+"/cancel", `{"reason":"`+reason+`"}`)
		require.Equal(t, http.StatusAccepted, res.Status, string(res.Body))
		requireClean(t, "cancel answer", res.Body)

		for _, id := range []ledger.RunID{approved, denied, cancelled} {
			e.advance(t, id)
			res := e.get(t, "bob", "/v1/runs/"+string(id))
			require.Equal(t, http.StatusOK, res.Status)
			requireClean(t, "GET run", res.Body)
		}
		for _, a := range []*ledger.Action{a1, a2} {
			res := e.get(t, "bob", "/v1/actions/"+string(a.ID))
			require.Equal(t, http.StatusOK, res.Status)
			requireClean(t, "GET action", res.Body)
		}
		require.Empty(t, ledgertest.ColumnsHolding(t, e.Path, secretReason), "the database holds no reason raw")
		require.NotEmpty(t, ledgertest.ColumnsHolding(t, e.Path, "[redacted:"), "but their markers")
	})
	t.Run("resolve", func(t *testing.T) {
		e := newEnv(t, options{sim: simulator.Config{Tools: map[string]simulator.ToolConfig{
			simulator.CardsWriteTool: {Guarantees: &contracts.Guarantees{}, TimeoutMS: ptr(int64(20)), Faults: []simulator.Fault{{Kind: simulator.FaultTimeout, Calls: []int{1}}}},
		}}})
		id, a := e.awaiting(t, "alice", "k1")
		require.Equal(t, http.StatusOK, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)).Status)
		require.Equal(t, ledger.RunNeedsReview, e.advance(t, id).State)
		note, err := json.Marshal(map[string]string{"outcome": "happened", "note": reason})
		require.NoError(t, err)
		res := e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/resolve", string(note))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		require.Equal(t, ledger.RunCompleted, e.advance(t, id).State)
		require.Empty(t, ledgertest.ColumnsHolding(t, e.Path, secretReason), "the database holds no note raw")
		require.Contains(t, ledgertest.ColumnsHolding(t, e.Path, e.redactor.Marker(secretReason)), "observations.detail",
			"the note is kept with the process's marker")
		res = e.get(t, "carol", "/v1/runs/"+string(id)+"/timeline")
		require.Equal(t, http.StatusOK, res.Status)
		require.NotContains(t, string(res.Body), secretReason)
	})
}

// approvalPage is one page of GET /v1/approvals.
type approvalPage struct {
	Approvals  []server.Approval `json:"approvals"`
	NextCursor string            `json:"next_cursor"`
}

// TestListApprovalsPages fills a tenant with more pending approvals than
// a page holds: the list pages like GET /v1/runs, and refuses bad
// parameters with 400 naming them.
func TestListApprovalsPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	const n = server.DefaultPageSize + 5
	var want []ledger.ApprovalID
	for i := range n {
		run := e.RunningRun(t, "flood-"+strconv.Itoa(i), ledger.BudgetLimits{})
		res := e.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval)
		want = append(want, res.Approval.ID)
	}
	e.awaiting(t, "eve", "other-tenant") // globex's: never in acme's pages
	list := func(t *testing.T, query string) approvalPage {
		t.Helper()
		res := e.get(t, "bob", "/v1/approvals"+query)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var p approvalPage
		require.NoError(t, json.Unmarshal(res.Body, &p))
		return p
	}
	ids := func(p approvalPage) []ledger.ApprovalID {
		out := []ledger.ApprovalID{}
		for _, a := range p.Approvals {
			out = append(out, a.ID)
		}
		return out
	}

	t.Run("DefaultPage", func(t *testing.T) {
		first := list(t, "")
		require.Equal(t, want[:server.DefaultPageSize], ids(first), "a page, not everything")
		require.NotEmpty(t, first.NextCursor)
		rest := list(t, "?cursor="+url.QueryEscape(first.NextCursor))
		require.Equal(t, want[server.DefaultPageSize:], ids(rest))
		require.Empty(t, rest.NextCursor, "the last page says so")
	})
	t.Run("Pages", func(t *testing.T) {
		var got []ledger.ApprovalID
		cursor, pages := "", 0
		for {
			q := "?state=pending&limit=7"
			if cursor != "" {
				q += "&cursor=" + url.QueryEscape(cursor)
			}
			p := list(t, q)
			require.LessOrEqual(t, len(p.Approvals), 7)
			got = append(got, ids(p)...)
			pages++
			if p.NextCursor == "" {
				break
			}
			cursor = p.NextCursor
		}
		require.Equal(t, want, got, "every approval once, oldest first")
		require.Equal(t, (n+6)/7, pages)
		require.Equal(t, want, ids(list(t, "?limit="+strconv.Itoa(server.MaxPageSize))))
	})
	t.Run("OtherState", func(t *testing.T) {
		p := list(t, "?state=granted&limit=1")
		require.Empty(t, p.Approvals)
		require.Empty(t, p.NextCursor)
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		for _, tc := range []struct{ query, location string }{
			{"?limit=0", "limit"}, {"?limit=-1", "limit"}, {"?limit=201", "limit"}, {"?limit=ten", "limit"}, {"?limit=", ""},
			{"?cursor=run_01J0000000000000000000000", "cursor"}, {"?cursor=apr_%20x", "cursor"}, {"?cursor=" + strings.Repeat("a", 300), "cursor"},
			{"?state=waiting", "state"},
		} {
			res := e.get(t, "bob", "/v1/approvals"+tc.query)
			if tc.location == "" {
				require.Equal(t, http.StatusOK, res.Status, "an empty limit is the default: %s", tc.query)
				continue
			}
			p := requireProblem(t, res, http.StatusBadRequest, "invalid")
			requireLocation(t, p, tc.location, "")
		}
	})
	t.Run("ErrForbidden", func(t *testing.T) {
		requireProblem(t, e.get(t, "alice", "/v1/approvals?limit=1"), http.StatusForbidden, "forbidden")
	})
}

// TestIdempotencyPerPrincipal: a request identity is (tenant, principal,
// key). Two submitters of one tenant with one key get two runs, each
// reading its own; each replays its own; another body with the same key
// is 422; and one's submit in flight does not hold up the other's.
func TestIdempotencyPerPrincipal(t *testing.T) {
	t.Parallel()
	t.Run("Sequential", func(t *testing.T) {
		e := newEnv(t, options{})
		alice := e.submitRaw(t, "alice", "shared", submitBody(t))
		require.Equal(t, http.StatusCreated, alice.Status, string(alice.Body))
		amy := e.submitRaw(t, "amy", "shared", submitBody(t))
		require.Equal(t, http.StatusCreated, amy.Status, string(amy.Body))
		require.Empty(t, amy.Header.Get(server.HeaderIdempotentReplayed), "amy's key is not alice's request")

		var aliceRun, amyRun server.SubmitResponse
		decode(t, alice, &aliceRun)
		decode(t, amy, &amyRun)
		require.NotEqual(t, aliceRun.ID, amyRun.ID, "two identities, two runs")
		require.Equal(t, http.StatusOK, e.get(t, "alice", "/v1/runs/"+string(aliceRun.ID)).Status)
		require.Equal(t, http.StatusOK, e.get(t, "amy", "/v1/runs/"+string(amyRun.ID)).Status, "amy reads the run she got")
		requireProblem(t, e.get(t, "amy", "/v1/runs/"+string(aliceRun.ID)), http.StatusNotFound, "not_found")

		for who, want := range map[string]response{"alice": alice, "amy": amy} {
			again := e.submitRaw(t, who, "shared", submitBody(t))
			require.Equal(t, http.StatusCreated, again.Status)
			require.Equal(t, "true", again.Header.Get(server.HeaderIdempotentReplayed), who)
			require.Equal(t, string(want.Body), string(again.Body), "%s replays its own run", who)
		}
		other := `{"agent":"practice-cards","input":{"title":"other","markdown":"# other"}}`
		requireProblem(t, e.submitRaw(t, "amy", "shared", other), http.StatusUnprocessableEntity, server.CodeIdempotencyKeyReused)
		requireProblem(t, e.submitRaw(t, "alice", "shared", other), http.StatusUnprocessableEntity, server.CodeIdempotencyKeyReused)
		// Another tenant's principal with the key: another identity too.
		require.Equal(t, http.StatusCreated, e.submitRaw(t, "eve", "shared", submitBody(t)).Status)
		require.Equal(t, 3, e.runCount(t))
	})
	t.Run("InFlight", func(t *testing.T) {
		entered := make(chan struct{})
		release := make(chan struct{})
		var held atomic.Bool
		hook := func() {
			if held.CompareAndSwap(false, true) {
				close(entered)
				<-release
			}
		}
		e := newEnv(t, options{config: func(c *server.Config) { server.SetBeforeSubmit(c, hook) }})
		var releaseOnce sync.Once
		releaseAlice := func() { releaseOnce.Do(func() { close(release) }) }
		defer releaseAlice() // a failing check must not leave alice's submit held

		aliceDone := make(chan response, 1)
		go func() { aliceDone <- e.submitRaw(t, "alice", "shared", submitBody(t)) }()
		<-entered
		amy := e.submitRaw(t, "amy", "shared", submitBody(t))
		// alice's own retry is still held off while hers is in flight.
		requireProblem(t, e.submitRaw(t, "alice", "shared", submitBody(t)), http.StatusConflict, server.CodeRequestInProgress)
		releaseAlice()
		alice := <-aliceDone
		require.Equal(t, http.StatusCreated, amy.Status, "amy's key is not alice's request: %s", amy.Body)
		require.Equal(t, http.StatusCreated, alice.Status, string(alice.Body))
		require.Equal(t, 2, e.runCount(t))
	})
}
