package server_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

func TestListRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	var alices, amys []ledger.RunID
	for i := range 5 {
		alices = append(alices, e.submit(t, "alice", "a"+strconv.Itoa(i)))
		amys = append(amys, e.submit(t, "amy", "m"+strconv.Itoa(i)))
	}
	e.submit(t, "eve", "e0")
	e.advance(t, alices[0]) // awaiting_approval

	list := func(t *testing.T, principal, query string) server.RunList {
		t.Helper()
		res := e.get(t, principal, "/v1/runs"+query)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var l server.RunList
		decode(t, res, &l)
		return l
	}
	ids := func(l server.RunList) []ledger.RunID {
		out := []ledger.RunID{}
		for _, r := range l.Runs {
			out = append(out, r.ID)
		}
		return out
	}

	t.Run("ApproverSeesTheTenant", func(t *testing.T) {
		l := list(t, "bob", "")
		require.Len(t, l.Runs, 10)
		require.Empty(t, l.NextCursor)
		for _, r := range l.Runs {
			require.Equal(t, "acme", r.Tenant)
		}
	})
	t.Run("SubmitterSeesItsOwn", func(t *testing.T) {
		require.Equal(t, alices, ids(list(t, "alice", "")))
		require.Equal(t, amys, ids(list(t, "amy", "")))
	})
	t.Run("OtherTenant", func(t *testing.T) {
		l := list(t, "gina", "")
		require.Len(t, l.Runs, 1)
		require.Equal(t, "globex", l.Runs[0].Tenant)
	})
	t.Run("FilterByState", func(t *testing.T) {
		l := list(t, "carol", "?state=awaiting_approval")
		require.Equal(t, []ledger.RunID{alices[0]}, ids(l))
		require.Empty(t, ids(list(t, "amy", "?state=awaiting_approval")))
	})
	t.Run("Pages", func(t *testing.T) {
		var got []ledger.RunID
		cursor := ""
		pages := 0
		for {
			q := "?limit=3"
			if cursor != "" {
				q += "&cursor=" + url.QueryEscape(cursor)
			}
			l := list(t, "root", q)
			require.LessOrEqual(t, len(l.Runs), 3)
			got = append(got, ids(l)...)
			pages++
			if l.NextCursor == "" {
				break
			}
			cursor = l.NextCursor
		}
		require.Equal(t, 4, pages)
		require.Len(t, got, 10)
		require.IsIncreasing(t, got)
	})
	t.Run("SubmitterPages", func(t *testing.T) {
		first := list(t, "alice", "?limit=2")
		require.Equal(t, alices[:2], ids(first))
		require.Equal(t, string(alices[1]), first.NextCursor)
		second := list(t, "alice", "?limit=2&cursor="+first.NextCursor)
		require.Equal(t, alices[2:4], ids(second))
		last := list(t, "alice", "?limit=2&cursor="+second.NextCursor)
		require.Equal(t, alices[4:], ids(last))
		require.Empty(t, last.NextCursor)
	})
	for name, q := range map[string]string{
		"state":        "?state=done",
		"limit zero":   "?limit=0",
		"limit big":    "?limit=201",
		"limit text":   "?limit=ten",
		"cursor":       "?cursor=act_01",
		"cursor chars": "?cursor=" + url.QueryEscape("run_../../x"),
	} {
		t.Run("ErrInvalid/"+name, func(t *testing.T) {
			requireProblem(t, e.get(t, "bob", "/v1/runs"+q), http.StatusBadRequest, "invalid")
		})
	}
}

func TestGetRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	id, a := e.awaiting(t, "alice", "k1")

	t.Run("OK", func(t *testing.T) {
		for _, who := range []string{"alice", "bob", "carol", "root", "sam"} {
			res := e.get(t, who, "/v1/runs/"+string(id))
			require.Equal(t, http.StatusOK, res.Status, who)
			var r server.Run
			decode(t, res, &r)
			require.Equal(t, id, r.ID)
			require.Equal(t, "acme", r.Tenant)
			require.Equal(t, ledger.RunAwaitingApproval, r.State)
			require.Equal(t, "alice", r.SubmittedBy)
			require.Nil(t, r.Cancellation)
			require.Len(t, r.Actions, 1)
			act := r.Actions[0]
			require.Equal(t, a.ID, act.ID)
			require.Equal(t, a.ActionDigest, act.ActionDigest)
			require.Equal(t, ledger.ActionAwaitingApproval, act.State)
			require.JSONEq(t, string(a.Arguments), string(act.Arguments))
			require.Empty(t, act.Attempts)
			require.Len(t, act.Approvals, 1)
			require.Equal(t, ledger.ApprovalPending, act.Approvals[0].State)
		}
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		for _, tc := range []struct{ who, id string }{
			{"eve", string(id)},    // another tenant
			{"gina", string(id)},   // another tenant, reading roles
			{"amy", string(id)},    // another submitter's run
			{"bob", "run_unknown"}, // no such run
			{"bob", "act_" + string(id)[4:]},
		} {
			p := requireProblem(t, e.get(t, tc.who, "/v1/runs/"+tc.id), http.StatusNotFound, "not_found")
			require.Equal(t, "run "+tc.id+" not found", p.Detail, "the same answer whatever the reason")
		}
	})
}

func TestCancelRun(t *testing.T) {
	t.Parallel()
	t.Run("Accepted", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "alice", "k1")
		res := e.post(t, "alice", "/v1/runs/"+string(id)+"/cancel", `{"reason":"changed my mind"}`)
		require.Equal(t, http.StatusAccepted, res.Status, string(res.Body))
		var c server.Cancellation
		decode(t, res, &c)
		require.Contains(t, []ledger.CancellationState{ledger.CancelAccepted, ledger.CancelStopping, ledger.CancelStopped}, c.State,
			"the answer comes after acceptance committed")
		require.Equal(t, "alice", c.RequestedBy)
		require.Equal(t, "changed my mind", c.Reason)
		require.NotNil(t, c.AcceptedAt)

		// A second cancel answers with the cancellation as it stands.
		again := e.send(t, request{principal: "alice", method: http.MethodPost, path: "/v1/runs/" + string(id) + "/cancel"})
		require.Equal(t, http.StatusAccepted, again.Status, string(again.Body))

		run := e.advance(t, id)
		require.Equal(t, ledger.RunStopped, run.State)
		require.Equal(t, ledger.StopUserCancelled, run.StopReason)

		// The action was cancelled with the run: approving it now is a
		// conflict, and nothing runs.
		res = e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest))
		requireProblem(t, res, http.StatusConflict, "conflict")
		require.Zero(t, e.effectCount(t))
		atts, err := e.Store.FindAttempts(context.Background(), ledger.AttemptFilter{RunID: &id})
		require.NoError(t, err)
		require.Empty(t, atts, "no attempt starts after the cancel committed")

		var r server.Run
		decode(t, e.get(t, "alice", "/v1/runs/"+string(id)), &r)
		require.NotNil(t, r.Cancellation)
		require.Equal(t, ledger.CancelStopped, r.Cancellation.State)
		require.NotNil(t, r.Cancellation.StoppedAt)
		require.Equal(t, ledger.ActionCancelled, r.Actions[0].State)
	})
	t.Run("QueuedRunNeverRuns", func(t *testing.T) {
		e := newEnv(t, options{})
		id := e.submit(t, "alice", "k1")
		res := e.send(t, request{principal: "root", method: http.MethodPost, path: "/v1/runs/" + string(id) + "/cancel"})
		require.Equal(t, http.StatusAccepted, res.Status, string(res.Body))
		run := e.advance(t, id)
		require.Equal(t, ledger.RunStopped, run.State)
		require.Equal(t, ledger.StopUserCancelled, run.StopReason)
		actions, err := e.Store.FindActions(context.Background(), ledger.ActionFilter{RunID: &id})
		require.NoError(t, err)
		require.Empty(t, actions, "the model was never asked")
		require.Zero(t, e.effectCount(t))
	})
	t.Run("ErrConflictEnded", func(t *testing.T) {
		e := newEnv(t, options{})
		id, a := e.awaiting(t, "alice", "k1")
		require.Equal(t, http.StatusOK, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/deny", digestBody(a.ActionDigest)).Status)
		require.Equal(t, ledger.RunStopped, e.advance(t, id).State)
		res := e.post(t, "alice", "/v1/runs/"+string(id)+"/cancel", `{}`)
		requireProblem(t, res, http.StatusConflict, "conflict")
	})
	t.Run("ErrNotFoundAndForbidden", func(t *testing.T) {
		e := newEnv(t, options{})
		id := e.submit(t, "alice", "k1")
		path := "/v1/runs/" + string(id) + "/cancel"
		requireProblem(t, e.post(t, "eve", path, `{}`), http.StatusNotFound, "not_found")
		requireProblem(t, e.post(t, "amy", path, `{}`), http.StatusNotFound, "not_found")
		requireProblem(t, e.post(t, "sam", path, `{}`), http.StatusForbidden, "forbidden")
		requireProblem(t, e.post(t, "bob", path, `{}`), http.StatusForbidden, "forbidden")
		requireProblem(t, e.post(t, "carol", path, `{}`), http.StatusForbidden, "forbidden")
		requireProblem(t, e.post(t, "alice", "/v1/runs/run_unknown/cancel", `{}`), http.StatusNotFound, "not_found")
		_, err := e.Store.FindCancellation(context.Background(), id)
		require.ErrorIs(t, err, ledger.ErrNotFound, "nothing was recorded")
	})
	t.Run("ErrBody", func(t *testing.T) {
		e := newEnv(t, options{})
		id := e.submit(t, "alice", "k1")
		path := "/v1/runs/" + string(id) + "/cancel"
		p := requireProblem(t, e.post(t, "alice", path, `{"reason":"x","state":"stopped"}`), http.StatusBadRequest, server.CodeSchemaViolation)
		requireLocation(t, p, "/state", "unknown field")
		p = requireProblem(t, e.post(t, "alice", path, `{"reason":7}`), http.StatusBadRequest, server.CodeSchemaViolation)
		requireLocation(t, p, "/reason", "expected string")
		requireProblem(t, e.post(t, "alice", path, `{"reason":"a","reason":"b"}`), http.StatusBadRequest, server.CodeInvalidJSON)
		res := e.send(t, request{principal: "alice", method: http.MethodPost, path: path, body: `{}`,
			header: map[string][]string{"Content-Type": {"text/plain"}}})
		requireProblem(t, res, http.StatusUnsupportedMediaType, server.CodeUnsupportedMediaType)
		_, err := e.Store.FindCancellation(context.Background(), id)
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

func TestTimeline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	id, a := e.awaiting(t, "alice", "k1")
	require.Equal(t, http.StatusOK, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)).Status)
	require.Equal(t, ledger.RunCompleted, e.advance(t, id).State)
	path := "/v1/runs/" + string(id) + "/timeline"

	t.Run("OK", func(t *testing.T) {
		events, err := e.Store.FindEvents(context.Background(), id)
		require.NoError(t, err)
		for _, who := range []string{"carol", "root", "alice"} {
			res := e.get(t, who, path)
			require.Equal(t, http.StatusOK, res.Status, who)
			var tl server.Timeline
			decode(t, res, &tl)
			require.Equal(t, id, tl.RunID)
			require.True(t, tl.Chain.OK, tl.Chain.Reason)
			require.Equal(t, len(events), tl.Chain.Events)
			require.Len(t, tl.Events, len(events))
			for i, ev := range tl.Events {
				require.Equal(t, events[i].Seq, ev.Seq)
				require.Equal(t, events[i].Hash, ev.Hash)
				require.Equal(t, events[i].Type, ev.Type)
			}
			require.Equal(t, string(ledger.RunCompleted), tl.Events[len(tl.Events)-1].ToState)
		}
	})
	t.Run("ErrForbidden", func(t *testing.T) {
		requireProblem(t, e.get(t, "bob", path), http.StatusForbidden, "forbidden")
		requireProblem(t, e.get(t, "sam", path), http.StatusForbidden, "forbidden")
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		requireProblem(t, e.get(t, "amy", path), http.StatusNotFound, "not_found")
		requireProblem(t, e.get(t, "gina", path), http.StatusNotFound, "not_found")
		requireProblem(t, e.get(t, "carol", "/v1/runs/run_unknown/timeline"), http.StatusNotFound, "not_found")
	})
}

func TestEvidence(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	id := e.submit(t, "alice", "k1")
	path := "/v1/runs/" + string(id) + "/evidence"
	for q, ct := range map[string]string{"": "application/json", "?format=json": "application/json",
		"?format=md": "text/markdown; charset=utf-8", "?format=html": "text/html; charset=utf-8"} {
		res := e.get(t, "carol", path+q)
		require.Equal(t, http.StatusOK, res.Status, "%s: %s", q, res.Body)
		require.Equal(t, ct, res.Header.Get("Content-Type"), q)
		require.Contains(t, string(res.Body), string(id), q)
	}
	res := e.get(t, "root", path)
	require.Equal(t, http.StatusOK, res.Status)
	require.NoError(t, contracts.Validate(contracts.SchemaReport, res.Body), "the JSON report follows its schema")
	requireProblem(t, e.get(t, "carol", path+"?format=pdf"), http.StatusBadRequest, "invalid")
	requireProblem(t, e.get(t, "carol", "/v1/runs/run_unknown/evidence"), http.StatusNotFound, "not_found")
	requireProblem(t, e.get(t, "gina", path), http.StatusNotFound, "not_found")
	requireProblem(t, e.get(t, "alice", path), http.StatusForbidden, "forbidden")
	requireProblem(t, e.get(t, "bob", path), http.StatusForbidden, "forbidden")
}
