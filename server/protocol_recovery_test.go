package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// The agent protocol's recovery where the agent is late, wrong or gone
// (docs/recovery.md, "Tools the ledger cannot call"), black box.

// lapse begins an attempt of a, then lets its lease lapse.
func (e *env) lapse(t testing.TB, a server.Action, key string) server.BeginResponse {
	t.Helper()
	b := e.beginOK(t, a.ID, key)
	e.Clock.Advance(clientLease.HeartbeatTimeout + time.Second)
	return b
}

// actionOK reads an action as ada.
func (e *env) actionOK(t testing.TB, id ledger.ActionID) server.Action {
	t.Helper()
	res := e.get(t, "ada", "/v1/actions/"+string(id))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var a server.Action
	decode(t, res, &a)
	return a
}

// resolveOK settles an action as bob.
func (e *env) resolveOK(t testing.TB, id ledger.ActionID, outcome string) {
	t.Helper()
	res := e.post(t, "bob", "/v1/actions/"+string(id)+"/resolve", `{"outcome":"`+outcome+`","note":"checked the tool"}`)
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
}

// TestProtocolUnansweredDecision: a decision the agent never answers
// goes to a person once the tool's decision timeout passes; nothing is
// left waiting forever.
func TestProtocolUnansweredDecision(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	for i, tc := range []struct{ tool, args, directive string }{
		{toolQuery, `{"to":"acct_1","cents":500}`, "query"},
		{toolDedup, `{"id":"x1"}`, "resend"},
		{toolCancel, `{"id":"x1"}`, "cancel"},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			run := e.clientRun(t, "ada", "u"+string(rune('a'+i)))
			a := e.approvedWrite(t, run, "w", tc.tool, tc.args)
			e.lapse(t, a, "b")
			d := e.nextOK(t, run).Directives[0]
			require.Equal(t, tc.directive, d.Directive, d.Rationale)

			e.Clock.Advance(engine.DefaultDecisionTimeout - time.Second)
			again := e.nextOK(t, run).Directives[0]
			require.Equal(t, tc.directive, again.Directive, "not due yet")
			require.Equal(t, d.DecisionID, again.DecisionID, "asking again changes nothing")

			e.Clock.Advance(2 * time.Second)
			d = e.nextOK(t, run).Directives[0]
			require.Equal(t, "review", d.Directive, d.Rationale)
			require.Equal(t, ledger.ActionNeedsReview, e.actionOK(t, a.ID).State)
			require.Equal(t, ledger.RunNeedsReview, e.run(t, run).State)

			e.resolveOK(t, a.ID, "not_happened")
			require.Equal(t, ledger.ActionFailed, e.actionOK(t, a.ID).State)
		})
	}
}

// TestProtocolResolveLapsed: a person can settle an action whose
// attempt's lease lapsed, without waiting for anyone to ask /next.
func TestProtocolResolveLapsed(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "rl")
	a := e.approvedWrite(t, run, "w", toolQuery, `{"to":"acct_1","cents":500}`)

	t.Run("ErrLeaseLive", func(t *testing.T) {
		e.beginOK(t, a.ID, "b")
		requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/resolve", `{"outcome":"happened"}`),
			http.StatusConflict, "conflict")
		require.Equal(t, ledger.ActionRunning, e.actionOK(t, a.ID).State, "a call in flight is its agent's")
	})
	t.Run("ErrOtherTenant", func(t *testing.T) {
		e.Clock.Advance(clientLease.HeartbeatTimeout + time.Second)
		requireProblem(t, e.post(t, "gina", "/v1/actions/"+string(a.ID)+"/resolve", `{"outcome":"happened"}`),
			http.StatusNotFound, "not_found")
		require.Equal(t, ledger.ActionRunning, e.actionOK(t, a.ID).State, "another tenant's resolve changes nothing")
	})
	t.Run("OK", func(t *testing.T) {
		e.resolveOK(t, a.ID, "happened")
		got := e.actionOK(t, a.ID)
		require.Equal(t, ledger.ActionSucceeded, got.State)
		require.Equal(t, "propose", e.nextOK(t, run).Directives[0].Directive)
	})
}

// TestProtocolLateHappenedDuringResend: a late happened for attempt 1
// while attempt 2 runs may mean the effect happened twice: a person
// decides, and attempt 2 is left to finish and is recorded.
func TestProtocolLateHappenedDuringResend(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "lr")
	a := e.approvedWrite(t, run, "w", toolDedup, `{"id":"x1"}`)
	b1 := e.beginOK(t, a.ID, "b1")
	res := e.attemptPost(t, "ada", b1.Attempt.ID, "abandon", "")
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	require.Equal(t, "resend", e.nextOK(t, run).Directives[0].Directive)
	b2 := e.beginOK(t, a.ID, "b2")

	requireProblem(t, e.attemptPost(t, "ada", b1.Attempt.ID, "complete", tokenBody(b1.AttemptToken, `"status":"succeeded","effect":"happened"`)),
		http.StatusConflict, "attempt_closed")
	require.Equal(t, ledger.ActionNeedsReview, e.actionOK(t, a.ID).State)
	require.Equal(t, "review", e.nextOK(t, run).Directives[0].Directive)

	res = e.attemptPost(t, "ada", b2.Attempt.ID, "complete", tokenBody(b2.AttemptToken, `"status":"succeeded","effect":"happened"`))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var cr server.CompleteResponse
	decode(t, res, &cr)
	require.Equal(t, ledger.AttemptSucceeded, cr.Attempt.Status, "the live attempt was not closed by the review")
	require.Equal(t, ledger.EffectHappened, cr.Attempt.Effect)
	require.Equal(t, ledger.ActionNeedsReview, e.actionOK(t, a.ID).State, "the person still decides")
}

// TestProtocolConflictingLateOutcome: a cancel confirmed for attempt 1,
// attempt 2 begun, then a late happened for attempt 1: the evidence
// contradicts what was established, and a person is told.
func TestProtocolConflictingLateOutcome(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "cl")
	a := e.approvedWrite(t, run, "w", toolCancel, `{"id":"x1"}`)
	b1 := e.lapse(t, a, "b1")
	d := e.nextOK(t, run).Directives[0]
	require.Equal(t, "cancel", d.Directive)
	res := e.attemptPost(t, "ada", b1.Attempt.ID, "observations", `{"decision_id":"`+d.DecisionID+`","kind":"cancel","confirmed":true}`)
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))

	d = e.nextOK(t, run).Directives[0]
	require.Equal(t, "execute", d.Directive, "the tool does not dedup: a new attempt, not a resend")
	e.beginOK(t, a.ID, "b2")
	requireProblem(t, e.attemptPost(t, "ada", b1.Attempt.ID, "complete", tokenBody(b1.AttemptToken, `"status":"succeeded","effect":"happened"`)),
		http.StatusConflict, "attempt_closed")
	require.Equal(t, ledger.ActionNeedsReview, e.actionOK(t, a.ID).State)
}

// TestProtocolSupersededDecision: once a late happened reconciled the
// action, an answer to the query decided before is stale, even one that
// agrees.
func TestProtocolSupersededDecision(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "sd")
	a := e.approvedWrite(t, run, "w", toolQuery, `{"to":"acct_1","cents":500}`)
	b := e.lapse(t, a, "b")
	d := e.nextOK(t, run).Directives[0]
	require.Equal(t, "query", d.Directive)
	requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "complete", tokenBody(b.AttemptToken, `"status":"succeeded","effect":"happened"`)),
		http.StatusConflict, "attempt_closed")
	require.Equal(t, ledger.ActionSucceeded, e.actionOK(t, a.ID).State)
	requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "observations", `{"decision_id":"`+d.DecisionID+`","kind":"query","effect":"happened"}`),
		http.StatusConflict, "stale_decision")
}

// TestProtocolInterruptedRead: a read carries no effect: interrupted, it
// is run again, never handed to a person.
func TestProtocolInterruptedRead(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "ir")
	r := e.proposeOK(t, run, "r", toolRead, `{"q":"balance"}`)
	e.lapse(t, r, "b1")
	d := e.nextOK(t, run).Directives[0]
	require.Contains(t, []string{"execute", "resend"}, d.Directive, d.Rationale)
	b2 := e.beginOK(t, r.ID, "b2")
	res := e.attemptPost(t, "ada", b2.Attempt.ID, "complete", tokenBody(b2.AttemptToken, `"status":"succeeded"`))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	require.Equal(t, ledger.ActionSucceeded, e.actionOK(t, r.ID).State)
	require.Equal(t, ledger.RunRunning, e.run(t, run).State)
}

// TestProtocolSupersedes: supersedes names an action of the run that has
// not begun; another tenant's is as unknown as one that does not exist.
func TestProtocolSupersedes(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "sp")
	other := e.clientRun(t, "ada", "sp-other")
	globex := e.clientRun(t, "gus", "sp-globex")
	theirs := e.proposeOK2(t, "gus", globex, "w", toolDedup, `{"id":"g1"}`)
	mine := e.proposeOK(t, other, "w", toolDedup, `{"id":"o1"}`)
	w := e.proposeOK(t, run, "w1", toolDedup, `{"id":"x1"}`)
	supersede := func(key string, id ledger.ActionID) response {
		return e.propose(t, "ada", run, key, `{"tool":"mail.send","arguments":{"id":"x2"},"supersedes":"`+string(id)+`"}`)
	}

	t.Run("ErrOtherTenant", func(t *testing.T) {
		unknown := requireProblem(t, supersede("s1", "act_01J0000000000000000000000"), http.StatusNotFound, "not_found")
		foreign := requireProblem(t, supersede("s2", theirs.ID), http.StatusNotFound, "not_found")
		require.Equal(t, unknown.Detail, foreign.Detail, "another tenant's action reveals nothing")
	})
	t.Run("ErrOtherRun", func(t *testing.T) {
		requireProblem(t, supersede("s3", mine.ID), http.StatusConflict, "cannot_supersede")
	})
	t.Run("OK", func(t *testing.T) {
		res := supersede("s4", w.ID)
		require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	})
	t.Run("ErrSupersededAlready", func(t *testing.T) {
		requireProblem(t, supersede("s5", w.ID), http.StatusConflict, "cannot_supersede")
	})
}

// proposeOK2 proposes as principal.
func (e *env) proposeOK2(t testing.TB, principal string, run ledger.RunID, stepKey, tool, args string) server.Action {
	t.Helper()
	res := e.propose(t, principal, run, stepKey, `{"tool":"`+tool+`","arguments":`+args+`}`)
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var a server.Action
	decode(t, res, &a)
	return a
}

// TestProtocolTokenBudgetAtPropose: a proposal whose own usage spends the
// token budget is refused, and its run stops; nothing runs.
func TestProtocolTokenBudgetAtPropose(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	res := e.submitRaw(t, "ada", "tb", `{"agent":"`+clientAgent+`","input":{"task":"x"},"budgets":{"max_tokens":1000}}`)
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var sr server.SubmitResponse
	decode(t, res, &sr)
	p := requireProblem(t, e.propose(t, "ada", sr.ID, "k", `{"tool":"notes.read","arguments":{"q":"x"},"usage":{"input_tokens":4000,"output_tokens":1000}}`),
		http.StatusConflict, "run_stopped")
	require.Equal(t, ledger.StopTokenBudgetExceeded, p.StopReason)
	require.Equal(t, ledger.RunStopped, e.run(t, sr.ID).State)
	acts, err := e.Store.FindActions(t.Context(), ledger.ActionFilter{RunID: &sr.ID})
	require.NoError(t, err)
	require.Empty(t, acts)
}

// TestProtocolPendingCapAtPropose: a run cannot queue approvals past the
// tenant's cap; its first one takes the place the run held.
func TestProtocolPendingCapAtPropose(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{config: func(c *server.Config) { c.MaxPendingApprovals = 3 }})
	run := e.clientRun(t, "ada", "pc")
	ok := 0
	var last response
	for i := range 6 {
		last = e.propose(t, "ada", run, "w"+string(rune('a'+i)), `{"tool":"mail.send","arguments":{"id":"`+string(rune('a'+i))+`"}}`)
		if last.Status != http.StatusCreated {
			break
		}
		ok++
	}
	requireProblem(t, last, http.StatusTooManyRequests, server.CodeTooManyPendingApprovals)
	require.NotEmpty(t, last.Header.Get("Retry-After"))
	require.Equal(t, 2, ok, "the run's own place, and one more under a cap of 3 with the run live")
	// A read needs no approval: the cap does not stop it.
	e.proposeOK(t, run, "read", toolRead, `{"q":"x"}`)
}
