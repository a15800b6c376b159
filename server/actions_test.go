package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// markerRE matches a redaction marker.
var markerRE = `^\[redacted:[0-9a-f]{8}\]$`

func TestListApprovals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	_, a1 := e.awaiting(t, "alice", "k1")
	_, a2 := e.awaiting(t, "amy", "k2")
	e.awaiting(t, "eve", "k3")
	require.Equal(t, http.StatusOK, e.post(t, "bob", "/v1/actions/"+string(a2.ID)+"/deny", digestBody(a2.ActionDigest)).Status)

	list := func(t *testing.T, who, q string) []server.Approval {
		t.Helper()
		res := e.get(t, who, "/v1/approvals"+q)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var l server.ApprovalList
		decode(t, res, &l)
		return l.Approvals
	}
	t.Run("PendingByDefault", func(t *testing.T) {
		for _, who := range []string{"bob", "carol", "root"} {
			got := list(t, who, "")
			require.Len(t, got, 1, who)
			require.Equal(t, a1.ID, got[0].ActionID)
			require.Equal(t, a1.ActionDigest, got[0].ActionDigest)
			require.Equal(t, ledger.ApprovalPending, got[0].State)
			require.Equal(t, got, list(t, who, "?state=pending"))
		}
	})
	t.Run("Denied", func(t *testing.T) {
		got := list(t, "bob", "?state=denied")
		require.Len(t, got, 1)
		require.Equal(t, a2.ID, got[0].ActionID)
		require.Equal(t, "bob", got[0].DecidedBy)
		require.Equal(t, "looks right", got[0].Reason)
	})
	t.Run("OtherTenant", func(t *testing.T) {
		got := list(t, "gina", "")
		require.Len(t, got, 1)
		require.NotEqual(t, a1.ID, got[0].ActionID)
		require.Empty(t, list(t, "gina", "?state=denied"))
	})
	t.Run("ErrInvalidState", func(t *testing.T) {
		requireProblem(t, e.get(t, "bob", "/v1/approvals?state=open"), http.StatusBadRequest, "invalid")
	})
	t.Run("ErrForbidden", func(t *testing.T) {
		requireProblem(t, e.get(t, "alice", "/v1/approvals"), http.StatusForbidden, "forbidden")
		requireProblem(t, e.get(t, "eve", "/v1/approvals"), http.StatusForbidden, "forbidden")
	})
}

func TestGetAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	_, a := e.awaiting(t, "alice", "k1")
	path := "/v1/actions/" + string(a.ID)
	t.Run("OK", func(t *testing.T) {
		for _, who := range []string{"alice", "bob", "carol", "root"} {
			res := e.get(t, who, path)
			require.Equal(t, http.StatusOK, res.Status, who)
			var v server.Action
			decode(t, res, &v)
			require.Equal(t, a.ID, v.ID)
			require.Equal(t, a.RunID, v.RunID)
			require.Equal(t, simulator.CardsWriteTool, v.Tool)
			require.Equal(t, ledger.EffectWrite, v.Effect)
			require.Equal(t, ledger.ActionAwaitingApproval, v.State)
			require.Equal(t, a.ActionDigest, v.ActionDigest)
			require.Equal(t, a.DedupKey, v.DedupKey)
			require.Equal(t, string(a.Arguments), string(v.Arguments), "no secret paths: shown as recorded")
			require.Len(t, v.Approvals, 1)
			require.NotNil(t, v.Attempts)
		}
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		for _, who := range []string{"eve", "gina", "amy"} {
			p := requireProblem(t, e.get(t, who, path), http.StatusNotFound, "not_found")
			require.Equal(t, "action "+string(a.ID)+" not found", p.Detail)
		}
		requireProblem(t, e.get(t, "bob", "/v1/actions/act_unknown"), http.StatusNotFound, "not_found")
		requireProblem(t, e.get(t, "bob", "/v1/actions/"+strings.Repeat("x", 200)), http.StatusNotFound, "not_found")
	})
}

func TestGetActionRedactsSecretPaths(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{secretPaths: []string{"/title", "/cards/0/back", "/absent"}})
	id, a := e.awaiting(t, "alice", "k1")
	res := e.get(t, "bob", "/v1/actions/"+string(a.ID))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var v server.Action
	decode(t, res, &v)
	var args struct {
		Title string `json:"title"`
		Cards []struct {
			Front string `json:"front"`
			Back  string `json:"back"`
		} `json:"cards"`
	}
	require.NoError(t, json.Unmarshal(v.Arguments, &args))
	require.Regexp(t, markerRE, args.Title)
	require.Regexp(t, markerRE, args.Cards[0].Back)
	require.NotRegexp(t, markerRE, args.Cards[0].Front)
	require.NotContains(t, string(res.Body), `"title":"Go`, "the secret is not in the answer")
	require.Equal(t, a.ActionDigest, v.ActionDigest, "the digest is of the real arguments")

	// The same redaction within the run.
	var r server.Run
	decode(t, e.get(t, "bob", "/v1/runs/"+string(id)), &r)
	require.JSONEq(t, string(v.Arguments), string(r.Actions[0].Arguments))
}

func TestApprove(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "alice", "k1")
		res := e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest))
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var d server.DecisionResponse
		decode(t, res, &d)
		require.Equal(t, ledger.ApprovalGranted, d.Approval.State)
		require.Equal(t, "bob", d.Approval.DecidedBy)
		require.Equal(t, "looks right", d.Approval.Reason)
		require.Equal(t, a.ActionDigest, d.Approval.ActionDigest)
		require.Equal(t, ledger.ActionApproved, d.Action.State)
		require.Zero(t, e.effectCount(t), "approving runs nothing by itself")

		run := e.advance(t, id)
		require.Equal(t, ledger.RunCompleted, run.State)
		require.Equal(t, ledger.StopCompleted, run.StopReason)
		es, err := e.effects.Effects(context.Background())
		require.NoError(t, err)
		require.Len(t, es, 1)
		require.Equal(t, a.DedupKey, es[0].DedupKey)

		// Deciding again is a conflict and changes nothing.
		requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)),
			http.StatusConflict, "conflict")
		requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/deny", digestBody(a.ActionDigest)),
			http.StatusConflict, "conflict")
		require.Equal(t, 1, e.effectCount(t))
	})
	t.Run("AdminApproves", func(t *testing.T) {
		e := newEnv(t, options{})
		_, a := e.awaiting(t, "alice", "k1")
		require.Equal(t, http.StatusOK, e.post(t, "root", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)).Status)
	})
	t.Run("ErrStaleDigest", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "alice", "k1")
		stale := ledger.Digest("sha256:" + strings.Repeat("0", 64))
		requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(stale)),
			http.StatusConflict, "conflict")
		require.Equal(t, a.ID, e.pendingAction(t, id).ID, "the approval is still pending")
		require.Equal(t, ledger.RunAwaitingApproval, e.advance(t, id).State)
		require.Zero(t, e.effectCount(t))
	})
	t.Run("ErrSelfApproval", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "sam", "k1")
		p := requireProblem(t, e.post(t, "sam", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)),
			http.StatusForbidden, "forbidden")
		require.Contains(t, p.Detail, "cannot approve")
		require.Equal(t, a.ID, e.pendingAction(t, id).ID)
		require.Equal(t, ledger.RunAwaitingApproval, e.advance(t, id).State)
		require.Zero(t, e.effectCount(t))
		// The submitter may still deny its own run's action.
		require.Equal(t, http.StatusOK, e.post(t, "sam", "/v1/actions/"+string(a.ID)+"/deny", digestBody(a.ActionDigest)).Status)
	})
	t.Run("ErrNotAnApprover", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "alice", "k1")
		for _, who := range []string{"alice", "amy", "carol"} {
			requireProblem(t, e.post(t, who, "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)),
				http.StatusForbidden, "forbidden")
		}
		require.Equal(t, a.ID, e.pendingAction(t, id).ID)
	})
	t.Run("ErrBody", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "alice", "k1")
		path := "/v1/actions/" + string(a.ID) + "/approve"
		p := requireProblem(t, e.post(t, "bob", path, `{"reason":"ok"}`), http.StatusBadRequest, server.CodeSchemaViolation)
		requireLocation(t, p, "/action_digest", "required")
		p = requireProblem(t, e.post(t, "bob", path, `{"action_digest":"`+string(a.ActionDigest)+`","state":"granted"}`),
			http.StatusBadRequest, server.CodeSchemaViolation)
		requireLocation(t, p, "/state", "unknown field")
		p = requireProblem(t, e.post(t, "bob", path, `{"action_digest":42}`), http.StatusBadRequest, server.CodeSchemaViolation)
		requireLocation(t, p, "/action_digest", "expected string")
		requireProblem(t, e.post(t, "bob", path, `{"action_digest":"md5:abc"}`), http.StatusBadRequest, "invalid")
		requireProblem(t, e.post(t, "bob", path, `{"action_digest":"x","action_digest":"y"}`), http.StatusBadRequest, server.CodeInvalidJSON)
		requireProblem(t, e.post(t, "bob", path, `[]`), http.StatusBadRequest, server.CodeSchemaViolation)
		requireProblem(t, e.send(t, request{principal: "bob", method: http.MethodPost, path: path}),
			http.StatusUnsupportedMediaType, server.CodeUnsupportedMediaType)
		requireProblem(t, e.send(t, request{principal: "bob", method: http.MethodPost, path: path,
			header: map[string][]string{"Content-Type": {"application/json"}}}), http.StatusBadRequest, server.CodeInvalidJSON)
		long := `{"action_digest":"` + string(a.ActionDigest) + `","reason":"` + strings.Repeat("r", 1001) + `"}`
		requireProblem(t, e.post(t, "bob", path, long), http.StatusBadRequest, "invalid")
		require.Equal(t, a.ID, e.pendingAction(t, id).ID, "still pending")
	})
	t.Run("ErrExpired", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "alice", "k1")
		e.Clock.Advance(48 * time.Hour)
		requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)),
			http.StatusConflict, "conflict")
		require.Equal(t, ledger.RunAwaitingApproval, e.run(t, id).State)
		require.Zero(t, e.effectCount(t))
	})
}

func TestDeny(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	id, a := e.awaiting(t, "alice", "k1")
	res := e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/deny", `{"action_digest":"`+string(a.ActionDigest)+`"}`)
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	var d server.DecisionResponse
	decode(t, res, &d)
	require.Equal(t, ledger.ApprovalDenied, d.Approval.State)
	require.Equal(t, ledger.ActionDenied, d.Action.State)
	run := e.advance(t, id)
	require.Equal(t, ledger.RunStopped, run.State)
	require.Equal(t, ledger.StopApprovalDenied, run.StopReason)
	require.Zero(t, e.effectCount(t))
}

// TestOtherTenant: tenant globex gets 404 for every object of acme, on
// every route, and nothing changes.
func TestOtherTenant(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	id, a := e.awaiting(t, "alice", "k1")
	before := e.run(t, id)
	for _, tc := range []struct{ who, method, path, body string }{
		{"gina", http.MethodGet, "/v1/runs/" + string(id), ""},
		{"gina", http.MethodGet, "/v1/runs/" + string(id) + "/timeline", ""},
		{"gina", http.MethodGet, "/v1/runs/" + string(id) + "/evidence", ""},
		{"gina", http.MethodGet, "/v1/actions/" + string(a.ID), ""},
		{"gina", http.MethodPost, "/v1/actions/" + string(a.ID) + "/approve", digestBody(a.ActionDigest)},
		{"gina", http.MethodPost, "/v1/actions/" + string(a.ID) + "/deny", digestBody(a.ActionDigest)},
		{"gina", http.MethodPost, "/v1/actions/" + string(a.ID) + "/resolve", `{"outcome":"happened"}`},
		{"eve", http.MethodPost, "/v1/runs/" + string(id) + "/cancel", `{}`},
		{"eve", http.MethodGet, "/v1/runs/" + string(id), ""},
		{"eve", http.MethodGet, "/v1/actions/" + string(a.ID), ""},
	} {
		res := e.send(t, request{principal: tc.who, method: tc.method, path: tc.path, body: tc.body})
		requireProblem(t, res, http.StatusNotFound, "not_found")
	}
	require.Equal(t, before, e.run(t, id), "nothing changed")
	require.Equal(t, a.ID, e.pendingAction(t, id).ID)
	_, err := e.Store.FindCancellation(context.Background(), id)
	require.ErrorIs(t, err, ledger.ErrNotFound)
	require.Zero(t, e.effectCount(t))
}

func TestResolve(t *testing.T) {
	t.Parallel()
	t.Run("ErrNotInReview", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "alice", "k1")
		requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/resolve", `{"outcome":"happened"}`),
			http.StatusConflict, "conflict")
		require.Equal(t, a.ID, e.pendingAction(t, id).ID)
	})
	t.Run("ErrBody", func(t *testing.T) {
		e := newEnv(t, options{})
		_, a := e.awaiting(t, "alice", "k1")
		path := "/v1/actions/" + string(a.ID) + "/resolve"
		p := requireProblem(t, e.post(t, "bob", path, `{"note":"x"}`), http.StatusBadRequest, server.CodeSchemaViolation)
		requireLocation(t, p, "/outcome", "required")
		p = requireProblem(t, e.post(t, "bob", path, `{"outcome":"happened","effect":"x"}`), http.StatusBadRequest, server.CodeSchemaViolation)
		requireLocation(t, p, "/effect", "unknown field")
		requireProblem(t, e.post(t, "bob", path, `{"outcome":"maybe"}`), http.StatusBadRequest, "invalid")
		requireProblem(t, e.post(t, "carol", path, `{"outcome":"happened"}`), http.StatusForbidden, "forbidden")
		requireProblem(t, e.post(t, "alice", path, `{"outcome":"happened"}`), http.StatusForbidden, "forbidden")
		requireProblem(t, e.post(t, "bob", "/v1/actions/act_unknown/resolve", `{"outcome":"happened"}`), http.StatusNotFound, "not_found")
	})
	t.Run("Review", func(t *testing.T) {
		// The tool times out and can neither be asked nor deduplicate nor
		// cancel: the effect is unknown and a person decides.
		e := newEnv(t, options{sim: simulator.Config{Tools: map[string]simulator.ToolConfig{
			simulator.CardsWriteTool: {Guarantees: &contracts.Guarantees{}, TimeoutMS: ptr(int64(20)), Faults: []simulator.Fault{{Kind: simulator.FaultTimeout, Calls: []int{1}}}},
		}}})
		id, a := e.awaiting(t, "alice", "k1")
		require.Equal(t, http.StatusOK, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)).Status)
		run := e.advance(t, id)
		require.Equal(t, ledger.RunNeedsReview, run.State)
		require.Zero(t, e.effectCount(t))

		res := e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/resolve", `{"outcome":"happened","note":"checked the deck store by hand"}`)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var v server.Action
		decode(t, res, &v)
		require.Equal(t, ledger.ActionSucceeded, v.State)
		require.Len(t, v.Attempts, 1)
		require.Equal(t, ledger.AttemptTimedOut, v.Attempts[0].Status)
		require.Equal(t, ledger.EffectHappened, v.Attempts[0].Effect, "a person established the effect")

		run = e.advance(t, id)
		require.Equal(t, ledger.RunCompleted, run.State)
		require.Zero(t, e.effectCount(t), "nothing ran again")

		requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/resolve", `{"outcome":"happened"}`),
			http.StatusConflict, "conflict")
	})
}

// TestWorkerPool drives runs with the engine's pool: the server's Notify
// after submit and approve wakes it.
func TestWorkerPool(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.engine.Start(ctx)
	defer e.engine.Stop()

	id := e.submit(t, "alice", "k1")
	waitState(t, e, id, ledger.RunAwaitingApproval)
	a := e.pendingAction(t, id)
	require.Equal(t, http.StatusOK, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)).Status)
	waitState(t, e, id, ledger.RunCompleted)
	require.Equal(t, 1, e.effectCount(t))
}

func waitState(t *testing.T, e *env, id ledger.RunID, want ledger.RunState) {
	t.Helper()
	require.Eventually(t, func() bool {
		run, err := e.Store.FindRunByID(context.Background(), id)
		return err == nil && run.State == want
	}, 10*time.Second, 5*time.Millisecond, "run never reached %s", want)
}
