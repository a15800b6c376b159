package server_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// The agent protocol over HTTP (docs/agent-protocol.md), black box: a
// real engine and store behind the server, every answer checked against
// the served document; the test is the client-driven agent.

// clientRun submits a run of clientAgent as principal; it is running at
// once, the engine takes no step of it.
func (e *env) clientRun(t testing.TB, principal, key string) ledger.RunID {
	t.Helper()
	res := e.submitRaw(t, principal, key, `{"agent":"`+clientAgent+`","input":{"task":"pay acct_1"}}`)
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var sr server.SubmitResponse
	decode(t, res, &sr)
	require.Equal(t, ledger.RunRunning, e.run(t, sr.ID).State, "a client-driven run runs at once")
	return sr.ID
}

func withKey(key string) map[string][]string { return map[string][]string{"Idempotency-Key": {key}} }

// propose posts a proposal with the step key.
func (e *env) propose(t testing.TB, principal string, run ledger.RunID, stepKey, body string) response {
	t.Helper()
	return e.send(t, request{principal: principal, method: http.MethodPost, path: "/v1/runs/" + string(run) + "/actions",
		body: body, header: withKey(stepKey)})
}

// proposeOK proposes tool with args as alice and returns the action.
func (e *env) proposeOK(t testing.TB, run ledger.RunID, stepKey, tool, args string) server.Action {
	t.Helper()
	res := e.propose(t, "ada", run, stepKey, `{"tool":"`+tool+`","arguments":`+args+`}`)
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var a server.Action
	decode(t, res, &a)
	return a
}

// approveOK has bob grant a's pending approval.
func (e *env) approveOK(t testing.TB, a server.Action) {
	t.Helper()
	res := e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
}

// approvedWrite proposes a write of tool and has it approved.
func (e *env) approvedWrite(t testing.TB, run ledger.RunID, stepKey, tool, args string) server.Action {
	t.Helper()
	a := e.proposeOK(t, run, stepKey, tool, args)
	require.Equal(t, ledger.ActionAwaitingApproval, a.State)
	e.approveOK(t, a)
	return a
}

// begin posts a begin, with no body, as alice.
func (e *env) begin(t testing.TB, action ledger.ActionID, key string) response {
	t.Helper()
	return e.send(t, request{principal: "ada", method: http.MethodPost, path: "/v1/actions/" + string(action) + "/attempts",
		header: withKey(key)})
}

func (e *env) beginOK(t testing.TB, action ledger.ActionID, key string) server.BeginResponse {
	t.Helper()
	res := e.begin(t, action, key)
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var b server.BeginResponse
	decode(t, res, &b)
	return b
}

// attemptPost posts body to /v1/attempts/{id}/{what} as principal.
func (e *env) attemptPost(t testing.TB, principal string, id ledger.AttemptID, what, body string) response {
	t.Helper()
	return e.post(t, principal, "/v1/attempts/"+string(id)+"/"+what, body)
}

func tokenBody(token, rest string) string {
	if rest != "" {
		rest = "," + rest
	}
	return `{"attempt_token":"` + token + `"` + rest + `}`
}

func (e *env) nextOK(t testing.TB, run ledger.RunID) server.NextResponse {
	t.Helper()
	res := e.get(t, "ada", "/v1/runs/"+string(run)+"/next")
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var n server.NextResponse
	decode(t, res, &n)
	require.Equal(t, run, n.RunID)
	require.NotEmpty(t, n.Directives)
	return n
}

// TestProtocolRead is the happy path of a read: proposed and approved by
// the default rule, begun, heartbeat, completed; then /next says propose
// and finish ends the run.
func TestProtocolRead(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "r1")

	body := `{"tool":"notes.read","arguments":{"q":"balance"},"usage":{"input_tokens":12,"output_tokens":3}}`
	res := e.propose(t, "ada", run, "step-1", body)
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var a server.Action
	decode(t, res, &a)
	require.Equal(t, ledger.ActionApproved, a.State)
	require.Equal(t, toolRead, a.Tool)
	require.Positive(t, a.Version)
	require.Equal(t, "/v1/actions/"+string(a.ID), res.Header.Get("Location"))
	require.Empty(t, res.Header.Get(server.HeaderIdempotentReplayed))

	t.Run("ProposeReplay", func(t *testing.T) {
		again := e.propose(t, "ada", run, "step-1", body)
		require.Equal(t, http.StatusCreated, again.Status, string(again.Body))
		require.Equal(t, "true", again.Header.Get(server.HeaderIdempotentReplayed))
		var b server.Action
		decode(t, again, &b)
		require.Equal(t, a.ID, b.ID)
	})

	require.Equal(t, "execute", e.nextOK(t, run).Directives[0].Directive)
	b := e.beginOK(t, a.ID, "begin-1")
	require.NotEmpty(t, b.AttemptToken)
	require.Equal(t, a.DedupKey, b.DedupKey)
	require.Equal(t, a.ActionDigest, b.ActionDigest)
	require.JSONEq(t, `{"q":"balance"}`, string(b.Arguments))
	require.Equal(t, ledger.AttemptStarted, b.Attempt.Status)
	require.InDelta(t, 30, b.LeaseRemainingS, 0.001)

	t.Run("BeginReplay", func(t *testing.T) {
		res := e.begin(t, a.ID, "begin-1")
		require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
		require.Equal(t, "true", res.Header.Get(server.HeaderIdempotentReplayed))
		var again server.BeginResponse
		decode(t, res, &again)
		require.Equal(t, b.Attempt.ID, again.Attempt.ID)
		require.Equal(t, b.AttemptToken, again.AttemptToken)
	})

	n := e.nextOK(t, run)
	require.Equal(t, "in_flight", n.Directives[0].Directive)
	require.Equal(t, b.Attempt.ID, n.Directives[0].AttemptID)
	require.NotNil(t, n.Directives[0].LeaseRemainingS)

	e.Clock.Advance(10 * time.Second)
	res = e.attemptPost(t, "ada", b.Attempt.ID, "heartbeat", tokenBody(b.AttemptToken, `"progress":{"read_bytes":10}`))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var hb server.HeartbeatResponse
	decode(t, res, &hb)
	require.InDelta(t, 30, hb.LeaseRemainingS, 0.001, "renewed by the heartbeat timeout")
	require.False(t, hb.CancelRequested)

	done := tokenBody(b.AttemptToken, `"status":"succeeded","output":{"balance":12}`)
	res = e.attemptPost(t, "ada", b.Attempt.ID, "complete", done)
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var cr server.CompleteResponse
	decode(t, res, &cr)
	require.Equal(t, ledger.AttemptSucceeded, cr.Attempt.Status)
	require.Equal(t, ledger.ActionSucceeded, cr.Action.State)
	require.Greater(t, cr.Action.Version, a.Version)

	t.Run("CompleteReplay", func(t *testing.T) {
		res := e.attemptPost(t, "ada", b.Attempt.ID, "complete", done)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var again server.CompleteResponse
		decode(t, res, &again)
		require.Equal(t, cr.Attempt.ID, again.Attempt.ID)
		require.Equal(t, ledger.ActionSucceeded, again.Action.State)
	})

	require.Equal(t, "propose", e.nextOK(t, run).Directives[0].Directive)

	fin := `{"outcome":"completed","output":{"summary":"balance read"},"usage":{"input_tokens":5,"output_tokens":2}}`
	res = e.post(t, "ada", "/v1/runs/"+string(run)+"/finish", fin)
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var r server.Run
	decode(t, res, &r)
	require.Equal(t, ledger.RunCompleted, r.State)
	require.Len(t, r.Actions, 1)

	t.Run("FinishReplay", func(t *testing.T) {
		res := e.post(t, "ada", "/v1/runs/"+string(run)+"/finish", fin)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var again server.Run
		decode(t, res, &again)
		require.Equal(t, ledger.RunCompleted, again.State)
	})
	t.Run("ErrRunStopped", func(t *testing.T) {
		p := requireProblem(t, e.propose(t, "ada", run, "step-2", `{"tool":"notes.read","arguments":{"q":"more"}}`),
			http.StatusConflict, "run_stopped")
		require.Equal(t, ledger.StopCompleted, p.StopReason)
	})
	t.Run("NextSaysStop", func(t *testing.T) {
		n := e.nextOK(t, run)
		require.Equal(t, ledger.RunCompleted, n.RunState)
		require.Equal(t, "stop", n.Directives[0].Directive)
	})
}

// asyncSend sends r on another goroutine and delivers the answer (Status
// 0 if the request failed): no assertion runs off the test's goroutine.
func (e *env) asyncSend(r request) <-chan response {
	out := make(chan response, 1)
	go func() {
		req, err := http.NewRequest(r.method, e.ts.URL+r.path, strings.NewReader(r.body))
		if err != nil {
			out <- response{}
			return
		}
		if r.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Authorization", "Bearer "+e.tokens[r.principal])
		res, err := e.client.Do(req)
		if err != nil {
			out <- response{}
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		out <- response{Status: res.StatusCode, Header: res.Header, Body: b}
	}()
	return out
}

// TestProtocolWriteWaitsForApproval: a write waits for a person; the
// agent long-polls its action, an approver's grant wakes the poll, and the
// agent begins and completes it.
func TestProtocolWriteWaitsForApproval(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "w1")
	a := e.proposeOK(t, run, "pay-1", toolQuery, `{"to":"acct_1","cents":500}`)
	require.Equal(t, ledger.ActionAwaitingApproval, a.State)
	require.Len(t, a.Approvals, 1)
	require.Equal(t, ledger.ApprovalPending, a.Approvals[0].State)
	require.NotNil(t, a.Approvals[0].ExpiresAt)
	require.Equal(t, "wait_approval", e.nextOK(t, run).Directives[0].Directive)
	requireProblem(t, e.begin(t, a.ID, "b0"), http.StatusConflict, "not_approved")

	path := "/v1/actions/" + string(a.ID)
	v := strconv.FormatInt(a.Version, 10)
	t.Run("AtOnceOnAnotherVersion", func(t *testing.T) {
		res := e.get(t, "ada", path+"?wait=30s&version="+strconv.FormatInt(a.Version+7, 10))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var got server.Action
		decode(t, res, &got)
		require.Equal(t, a.Version, got.Version)
	})
	t.Run("WaitEnds", func(t *testing.T) {
		res := e.get(t, "ada", path+"?wait=0.2&version="+v)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var got server.Action
		decode(t, res, &got)
		require.Equal(t, a.Version, got.Version)
		require.Equal(t, ledger.ActionAwaitingApproval, got.State)
	})
	t.Run("ErrBadParameters", func(t *testing.T) {
		for q, param := range map[string]string{
			"wait=soon&version=" + v: "wait", "wait=61s&version=" + v: "wait", "wait=-1s&version=" + v: "wait",
			"wait=NaN&version=" + v: "wait", "wait=1e9&version=" + v: "wait",
			"wait=1s&version=-1": "version", "wait=1s&version=one": "version",
		} {
			p := requireProblem(t, e.get(t, "ada", path+"?"+q), http.StatusBadRequest, "invalid")
			requireLocation(t, p, param, "")
		}
	})

	// The poll waits; the grant, a moment later, wakes it.
	granted := make(chan response, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		granted <- <-e.asyncSend(request{principal: "bob", method: http.MethodPost, path: path + "/approve",
			body: digestBody(a.ActionDigest)})
	}()
	res := e.get(t, "ada", path+"?wait=30s&version="+v)
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var woken server.Action
	decode(t, res, &woken)
	require.Equal(t, ledger.ActionApproved, woken.State, "answered once the approval changed the action")
	require.Greater(t, woken.Version, a.Version)
	require.Equal(t, http.StatusOK, (<-granted).Status)

	b := e.beginOK(t, a.ID, "b1")
	require.JSONEq(t, `{"to":"acct_1","cents":500}`, string(b.Arguments))
	res = e.attemptPost(t, "ada", b.Attempt.ID, "complete",
		tokenBody(b.AttemptToken, `"status":"succeeded","effect":"happened","output":{"payment_id":"pay_9"}`))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var cr server.CompleteResponse
	decode(t, res, &cr)
	require.Equal(t, ledger.ActionSucceeded, cr.Action.State)
	require.Equal(t, ledger.EffectHappened, cr.Attempt.Effect)
}

// TestProtocolProposeRefusals: every bad proposal the doc names, each
// refused with its code and nothing recorded.
func TestProtocolProposeRefusals(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{config: func(c *server.Config) { c.MaxBodyBytes = 4096 }})
	run := e.clientRun(t, "ada", "p1")
	keys := 0
	propose := func(body string) response {
		keys++
		return e.propose(t, "ada", run, "k"+strconv.Itoa(keys), body)
	}

	t.Run("ErrUnknownTool", func(t *testing.T) {
		requireProblem(t, propose(`{"tool":"nope.tool","arguments":{}}`), http.StatusUnprocessableEntity, "unknown_tool")
	})
	t.Run("ErrToolNotAllowed", func(t *testing.T) {
		requireProblem(t, propose(`{"tool":"cards.count","arguments":{"title":"x"}}`), http.StatusUnprocessableEntity, "tool_not_allowed")
	})
	t.Run("ErrInvalidArguments", func(t *testing.T) {
		p := requireProblem(t, propose(`{"tool":"payments.send","arguments":{"to":"acct_1","cents":0,"memo":"x"}}`),
			http.StatusUnprocessableEntity, "invalid_arguments")
		require.NotEmpty(t, p.Errors)
		for _, fe := range p.Errors {
			require.True(t, strings.HasPrefix(fe.Location, "/arguments"), fe.Location)
		}
	})
	t.Run("ErrStepKeyReused", func(t *testing.T) {
		first := e.proposeOK(t, run, "reused", toolRead, `{"q":"first"}`)
		p := requireProblem(t, e.propose(t, "ada", run, "reused", `{"tool":"notes.read","arguments":{"q":"second"}}`),
			http.StatusUnprocessableEntity, "step_key_reused")
		require.NotNil(t, p.Action)
		require.Equal(t, first.ID, p.Action.ID)
		require.JSONEq(t, `{"q":"first"}`, string(p.Action.Arguments))
	})
	t.Run("ErrOtherTenant", func(t *testing.T) {
		requireProblem(t, e.propose(t, "gus", run, "k", `{"tool":"notes.read","arguments":{"q":"x"}}`), http.StatusNotFound, "not_found")
	})
	t.Run("ErrUnknownRun", func(t *testing.T) {
		requireProblem(t, e.propose(t, "ada", "run_nope", "k", `{"tool":"notes.read","arguments":{"q":"x"}}`), http.StatusNotFound, "not_found")
	})
	t.Run("ErrRole", func(t *testing.T) {
		requireProblem(t, e.propose(t, "bob", run, "k", `{"tool":"notes.read","arguments":{"q":"x"}}`), http.StatusForbidden, "forbidden")
		// A submitter reads runs; only an agent bound to the run's agent
		// (or an admin) drives them.
		requireProblem(t, e.propose(t, "alice", run, "k", `{"tool":"notes.read","arguments":{"q":"x"}}`), http.StatusForbidden, "forbidden")
	})
	t.Run("ErrOtherAgent", func(t *testing.T) {
		// andy drives payer's runs, not my-agent's: the run is not found.
		requireProblem(t, e.propose(t, "andy", run, "k", `{"tool":"notes.read","arguments":{"q":"x"}}`), http.StatusNotFound, "not_found")
	})
	t.Run("ErrNoIdempotencyKey", func(t *testing.T) {
		res := e.send(t, request{principal: "ada", method: http.MethodPost, path: "/v1/runs/" + string(run) + "/actions",
			body: `{"tool":"notes.read","arguments":{"q":"x"}}`})
		requireProblem(t, res, http.StatusBadRequest, server.CodeIdempotencyKeyInvalid)
	})
	t.Run("ErrContentType", func(t *testing.T) {
		res := e.send(t, request{principal: "ada", method: http.MethodPost, path: "/v1/runs/" + string(run) + "/actions",
			body:   `{"tool":"notes.read","arguments":{"q":"x"}}`,
			header: map[string][]string{"Idempotency-Key": {"k"}, "Content-Type": {"text/plain"}}})
		requireProblem(t, res, http.StatusUnsupportedMediaType, server.CodeUnsupportedMediaType)
	})
	t.Run("ErrTooLarge", func(t *testing.T) {
		requireProblem(t, propose(`{"tool":"notes.read","arguments":{"q":"`+strings.Repeat("x", 5000)+`"}}`),
			http.StatusRequestEntityTooLarge, server.CodePayloadTooLarge)
	})
	t.Run("ErrBody", func(t *testing.T) {
		for body, want := range map[string][2]string{
			`{"tool":"notes.read","arguments":{"q":"x"},"extra":1}`:            {server.CodeSchemaViolation, "/extra"},
			`{"tool":"notes.read"}`:                                            {server.CodeSchemaViolation, "/arguments"},
			`{"tool":"notes.read","arguments":"q"}`:                            {server.CodeSchemaViolation, "/arguments"},
			`{"tool":7,"arguments":{}}`:                                        {server.CodeSchemaViolation, "/tool"},
			`{"tool":"","arguments":{}}`:                                       {server.CodeSchemaViolation, "/tool"},
			`{"tool":"notes.read","arguments":{},"usage":{"input_tokens":-1}}`: {server.CodeSchemaViolation, "/usage/input_tokens"},
			`{"tool":"a","tool":"b","arguments":{}}`:                           {server.CodeInvalidJSON, ""},
			`{"tool":`:                                                         {server.CodeInvalidJSON, ""},
		} {
			p := requireProblem(t, propose(body), http.StatusBadRequest, want[0])
			if want[1] != "" {
				requireLocation(t, p, want[1], "")
			}
		}
	})
	t.Run("ErrNotClientDriven", func(t *testing.T) {
		builtin := e.submit(t, "alice", "builtin-1")
		requireProblem(t, e.propose(t, "root", builtin, "k", `{"tool":"cards.count","arguments":{"title":"x"}}`),
			http.StatusConflict, "not_client_driven")
	})

	acts, err := e.Store.FindActions(t.Context(), ledger.ActionFilter{RunID: &run})
	require.NoError(t, err)
	require.Len(t, acts, 1, "only the one proposal that was accepted is recorded")
}

// TestProtocolInDoubtAndCancelled: a write while another write runs is
// refused; so is a proposal, a begin, once the run's cancel is accepted,
// and a heartbeat tells the call in flight.
func TestProtocolInDoubtAndCancelled(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "d1")
	w := e.approvedWrite(t, run, "pay-1", toolQuery, `{"to":"acct_1","cents":500}`)
	b := e.beginOK(t, w.ID, "b1")
	read := e.proposeOK(t, run, "read-1", toolRead, `{"q":"x"}`)
	require.Equal(t, ledger.ActionApproved, read.State, "a read is not held up by a write in flight")

	requireProblem(t, e.propose(t, "ada", run, "pay-2", `{"tool":"mail.send","arguments":{"id":"m1"}}`),
		http.StatusConflict, "action_in_doubt")

	res := e.post(t, "ada", "/v1/runs/"+string(run)+"/cancel", `{"reason":"wrong account"}`)
	require.Equal(t, http.StatusAccepted, res.Status, string(res.Body))
	requireProblem(t, e.propose(t, "ada", run, "read-2", `{"tool":"notes.read","arguments":{"q":"y"}}`),
		http.StatusConflict, "run_cancelled")
	requireProblem(t, e.begin(t, read.ID, "b2"), http.StatusConflict, "run_cancelled")

	res = e.attemptPost(t, "ada", b.Attempt.ID, "heartbeat", tokenBody(b.AttemptToken, ""))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var hb server.HeartbeatResponse
	decode(t, res, &hb)
	require.True(t, hb.CancelRequested)
}

// TestProtocolBeginRefusals: a begin of an action not approved, a second
// open attempt, and the begin's own header and body.
func TestProtocolBeginRefusals(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "b1")
	a := e.proposeOK(t, run, "pay-1", toolDedup, `{"id":"m1"}`)
	requireProblem(t, e.begin(t, a.ID, "k1"), http.StatusConflict, "not_approved")
	e.approveOK(t, a)

	t.Run("ErrNoIdempotencyKey", func(t *testing.T) {
		res := e.send(t, request{principal: "ada", method: http.MethodPost, path: "/v1/actions/" + string(a.ID) + "/attempts"})
		requireProblem(t, res, http.StatusBadRequest, server.CodeIdempotencyKeyInvalid)
	})
	t.Run("ErrBody", func(t *testing.T) {
		res := e.send(t, request{principal: "ada", method: http.MethodPost, path: "/v1/actions/" + string(a.ID) + "/attempts",
			body: `{"retry":true}`, header: withKey("k1")})
		requireLocation(t, requireProblem(t, res, http.StatusBadRequest, server.CodeSchemaViolation), "/retry", "unknown field")
	})
	t.Run("ErrOtherTenant", func(t *testing.T) {
		res := e.send(t, request{principal: "gus", method: http.MethodPost, path: "/v1/actions/" + string(a.ID) + "/attempts",
			header: withKey("k1")})
		requireProblem(t, res, http.StatusNotFound, "not_found")
	})

	res := e.send(t, request{principal: "ada", method: http.MethodPost, path: "/v1/actions/" + string(a.ID) + "/attempts",
		body: `{}`, header: withKey("k1")})
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	requireProblem(t, e.begin(t, a.ID, "k2"), http.StatusConflict, "attempt_open")
}

// TestProtocolCompleteAndHeartbeat: tokens, outcomes a tool may not
// report, a second outcome, and a lease that lapsed.
func TestProtocolCompleteAndHeartbeat(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "c1")
	w := e.approvedWrite(t, run, "pay-1", toolQuery, `{"to":"acct_1","cents":500}`)
	b := e.beginOK(t, w.ID, "b1")
	att := b.Attempt.ID

	t.Run("ErrBadToken", func(t *testing.T) {
		requireProblem(t, e.attemptPost(t, "ada", att, "heartbeat", tokenBody("at_forged", "")), http.StatusForbidden, "bad_attempt_token")
		requireProblem(t, e.attemptPost(t, "ada", att, "complete", tokenBody("at_forged", `"status":"succeeded","effect":"happened"`)),
			http.StatusForbidden, "bad_attempt_token")
	})
	t.Run("ErrBody", func(t *testing.T) {
		requireLocation(t, requireProblem(t, e.attemptPost(t, "ada", att, "heartbeat", `{}`), http.StatusBadRequest, server.CodeSchemaViolation),
			"/attempt_token", "required")
		requireLocation(t, requireProblem(t, e.attemptPost(t, "ada", att, "complete", tokenBody(b.AttemptToken, "")),
			http.StatusBadRequest, server.CodeSchemaViolation), "/status", "required")
		requireLocation(t, requireProblem(t, e.attemptPost(t, "ada", att, "complete",
			tokenBody(b.AttemptToken, `"status":"failed","effect":"not_happened","error":{"message":"no code"}`)),
			http.StatusBadRequest, server.CodeSchemaViolation), "/error/code", "")
	})
	t.Run("ErrUnknownOrOtherTenant", func(t *testing.T) {
		requireProblem(t, e.attemptPost(t, "ada", "att_nope", "heartbeat", tokenBody(b.AttemptToken, "")), http.StatusNotFound, "not_found")
		requireProblem(t, e.attemptPost(t, "gus", att, "heartbeat", tokenBody(b.AttemptToken, "")), http.StatusNotFound, "not_found")
	})
	t.Run("ErrOutcomeNotAllowed", func(t *testing.T) {
		for _, o := range []string{`"status":"succeeded","effect":"not_happened"`, `"status":"succeeded"`,
			`"status":"started","effect":"unknown"`, `"status":"exploded","effect":"unknown"`} {
			requireProblem(t, e.attemptPost(t, "ada", att, "complete", tokenBody(b.AttemptToken, o)),
				http.StatusUnprocessableEntity, "outcome_not_allowed")
		}
	})

	res := e.attemptPost(t, "ada", att, "complete", tokenBody(b.AttemptToken, `"status":"succeeded","effect":"happened"`))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))

	t.Run("ErrOutcomeConflict", func(t *testing.T) {
		p := requireProblem(t, e.attemptPost(t, "ada", att, "complete",
			tokenBody(b.AttemptToken, `"status":"failed","effect":"not_happened","error":{"code":"declined","message":"card declined"}`)),
			http.StatusConflict, "outcome_conflict")
		require.NotNil(t, p.Recorded)
		require.Equal(t, ledger.AttemptSucceeded, p.Recorded.Status)
		require.Equal(t, ledger.EffectHappened, p.Recorded.Effect)
	})
	t.Run("ErrHeartbeatClosed", func(t *testing.T) {
		requireProblem(t, e.attemptPost(t, "ada", att, "heartbeat", tokenBody(b.AttemptToken, "")), http.StatusConflict, "attempt_closed")
	})

	t.Run("ErrLeaseLapsed", func(t *testing.T) {
		r := e.proposeOK(t, run, "read-1", toolRead, `{"q":"x"}`)
		b := e.beginOK(t, r.ID, "b2")
		e.Clock.Advance(clientLease.HeartbeatTimeout + time.Second)
		requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "heartbeat", tokenBody(b.AttemptToken, "")),
			http.StatusConflict, "attempt_closed")
		requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "complete", tokenBody(b.AttemptToken, `"status":"succeeded"`)),
			http.StatusConflict, "attempt_closed")
	})
}

// TestProtocolAbandonAndNext: a lost call is abandoned, and /next says
// what the tool's guarantees allow: query, resend, cancel, or a person's
// review; the agent's answers are observations.
func TestProtocolAbandonAndNext(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	for i, tc := range []struct{ tool, directive string }{
		{toolQuery, "query"}, {toolDedup, "resend"}, {toolCancel, "cancel"}, {toolNone, "review"},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			run := e.clientRun(t, "ada", "a"+strconv.Itoa(i))
			args := `{"id":"x1"}`
			if tc.tool == toolQuery {
				args = `{"to":"acct_1","cents":500}`
			}
			a := e.approvedWrite(t, run, "w", tc.tool, args)
			b := e.beginOK(t, a.ID, "b")

			res := e.attemptPost(t, "ada", b.Attempt.ID, "abandon", `{"reason":"the worker restarted"}`)
			require.Equal(t, http.StatusOK, res.Status, string(res.Body))
			var cr server.CompleteResponse
			decode(t, res, &cr)
			require.Equal(t, ledger.AttemptUncertain, cr.Attempt.Status)
			require.Equal(t, ledger.EffectUnknown, cr.Attempt.Effect)
			requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "abandon", ""), http.StatusConflict, "attempt_closed")

			n := e.nextOK(t, run)
			d := n.Directives[0]
			require.Equal(t, tc.directive, d.Directive, d.Rationale)
			require.Equal(t, a.ID, d.ActionID)
			require.Equal(t, a.DedupKey, d.DedupKey)
			require.NotEmpty(t, d.DecisionID)
			require.NotEmpty(t, d.Rationale)
			require.Equal(t, d.DecisionID, e.nextOK(t, run).Directives[0].DecisionID, "asking twice changes nothing")

			switch tc.directive {
			case "query":
				requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "observations",
					`{"decision_id":"dec_stale","kind":"query","effect":"not_happened"}`), http.StatusConflict, "stale_decision")
				res := e.attemptPost(t, "ada", b.Attempt.ID, "observations",
					`{"decision_id":"`+d.DecisionID+`","kind":"query","effect":"not_happened","detail":{"lookup":"no payment"}}`)
				require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
				var or server.ObservationResponse
				decode(t, res, &or)
				require.Equal(t, ledger.EffectNotHappened, or.Observation.Effect)
				require.Equal(t, a.ID, or.Observation.ActionID)
				require.NotEmpty(t, or.Next)
				requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "observations",
					`{"decision_id":"`+d.DecisionID+`","kind":"query","effect":"happened"}`), http.StatusConflict, "stale_decision")
			case "cancel":
				res := e.attemptPost(t, "ada", b.Attempt.ID, "observations", `{"decision_id":"`+d.DecisionID+`","kind":"cancel","confirmed":true}`)
				require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
				var or server.ObservationResponse
				decode(t, res, &or)
				require.NotEmpty(t, or.Next)
			case "resend":
				again := e.beginOK(t, a.ID, "b-resend")
				require.NotEqual(t, b.Attempt.ID, again.Attempt.ID)
				require.Equal(t, b.DedupKey, again.DedupKey, "the tool gets the same dedup key")
			}
		})
	}

	t.Run("LateOutcome", func(t *testing.T) {
		// An outcome after the abandon is refused, and kept: a late
		// happened answers recovery's question.
		run := e.clientRun(t, "ada", "late")
		a := e.approvedWrite(t, run, "w", toolNone, `{"id":"x1"}`)
		b := e.beginOK(t, a.ID, "b")
		res := e.attemptPost(t, "ada", b.Attempt.ID, "abandon", "")
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "complete", tokenBody(b.AttemptToken, `"status":"succeeded","effect":"happened"`)),
			http.StatusConflict, "attempt_closed")
		res = e.get(t, "ada", "/v1/actions/"+string(a.ID))
		require.Equal(t, http.StatusOK, res.Status)
		var got server.Action
		decode(t, res, &got)
		require.Equal(t, ledger.ActionSucceeded, got.State)
		require.Equal(t, "propose", e.nextOK(t, run).Directives[0].Directive)
	})
	t.Run("ErrObservationBody", func(t *testing.T) {
		run := e.clientRun(t, "ada", "obs")
		a := e.approvedWrite(t, run, "w", toolQuery, `{"to":"acct_1","cents":1}`)
		b := e.beginOK(t, a.ID, "b")
		for body, at := range map[string]string{
			`{"kind":"query","effect":"unknown"}`:                           "/decision_id",
			`{"decision_id":"d","effect":"unknown"}`:                        "/kind",
			`{"decision_id":"d","kind":"peek","effect":"unknown"}`:          "/kind",
			`{"decision_id":"d","kind":"query"}`:                            "/effect",
			`{"decision_id":"d","kind":"query","effect":"maybe"}`:           "/effect",
			`{"decision_id":"d","kind":"query","confirmed":true}`:           "/confirmed",
			`{"decision_id":"d","kind":"cancel"}`:                           "/confirmed",
			`{"decision_id":"d","kind":"cancel","effect":"happened"}`:       "/effect",
			`{"decision_id":"d","kind":"query","error":{"message":"down"}}`: "/error/code",
			`{"decision_id":"d","kind":"query","effect":"unknown","x":1}`:   "/x",
		} {
			requireLocation(t, requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "observations", body),
				http.StatusBadRequest, server.CodeSchemaViolation), at, "")
		}
	})
	t.Run("ErrObservationOfClosedAttempt", func(t *testing.T) {
		run := e.clientRun(t, "ada", "closed")
		r := e.proposeOK(t, run, "r", toolRead, `{"q":"x"}`)
		b := e.beginOK(t, r.ID, "b")
		res := e.attemptPost(t, "ada", b.Attempt.ID, "complete", tokenBody(b.AttemptToken, `"status":"succeeded"`))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		requireProblem(t, e.attemptPost(t, "ada", b.Attempt.ID, "observations",
			`{"decision_id":"dec_any","kind":"query","effect":"happened"}`), http.StatusConflict, "stale_decision")
	})
}

// TestProtocolFinish: a run with an attempt in doubt cannot finish; a
// failed finish takes its stop reason; actions never started are
// cancelled.
func TestProtocolFinish(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	finish := func(run ledger.RunID, body string) response {
		return e.post(t, "ada", "/v1/runs/"+string(run)+"/finish", body)
	}

	t.Run("ErrActionInDoubt", func(t *testing.T) {
		run := e.clientRun(t, "ada", "f1")
		a := e.approvedWrite(t, run, "w", toolNone, `{"id":"f"}`)
		b := e.beginOK(t, a.ID, "b")
		requireProblem(t, finish(run, `{"outcome":"completed"}`), http.StatusConflict, "action_in_doubt")
		res := e.attemptPost(t, "ada", b.Attempt.ID, "abandon", "")
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		requireProblem(t, finish(run, `{"outcome":"completed"}`), http.StatusConflict, "action_in_doubt")
	})
	t.Run("Failed", func(t *testing.T) {
		run := e.clientRun(t, "ada", "f2")
		pending := e.proposeOK(t, run, "w", toolDedup, `{"id":"m"}`)
		require.Equal(t, ledger.ActionAwaitingApproval, pending.State)
		res := finish(run, `{"outcome":"failed","stop_reason":"tool_error"}`)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var r server.Run
		decode(t, res, &r)
		require.Equal(t, ledger.RunFailed, r.State)
		require.Equal(t, ledger.StopToolError, r.StopReason)
		require.Len(t, r.Actions, 1)
		require.Equal(t, ledger.ActionCancelled, r.Actions[0].State, "never started: cancelled")
		require.Equal(t, ledger.ApprovalInvalidated, r.Actions[0].Approvals[0].State)

		res = finish(run, `{"outcome":"failed","stop_reason":"tool_error"}`)
		require.Equal(t, http.StatusOK, res.Status, "a replay: %s", res.Body)
		p := requireProblem(t, finish(run, `{"outcome":"completed"}`), http.StatusConflict, "run_stopped")
		require.Equal(t, ledger.StopToolError, p.StopReason)
	})
	t.Run("ErrBody", func(t *testing.T) {
		run := e.clientRun(t, "ada", "f3")
		for body, at := range map[string]string{
			`{}`:                            "/outcome",
			`{"outcome":"done"}`:            "/outcome",
			`{"outcome":"completed","x":1}`: "/x",
			`{"outcome":"completed","usage":{"input_tokens":1,"output_tokens":-1}}`: "/usage/output_tokens",
		} {
			requireLocation(t, requireProblem(t, finish(run, body), http.StatusBadRequest, server.CodeSchemaViolation), at, "")
		}
		requireProblem(t, finish(run, ""), http.StatusUnsupportedMediaType, server.CodeUnsupportedMediaType)
		requireProblem(t, e.post(t, "gus", "/v1/runs/"+string(run)+"/finish", `{"outcome":"completed"}`), http.StatusNotFound, "not_found")
		require.Equal(t, ledger.RunRunning, e.run(t, run).State)
	})
}
