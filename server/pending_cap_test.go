package server_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// TestPendingApprovalsCap: with Config.MaxPendingApprovals a tenant's
// pending approvals and live runs (queued or running: each may ask for one)
// are capped at submit: 429 too_many_pending_approvals with Retry-After,
// nothing stored; replays are still answered; other tenants are not held
// up; once people decide and the run ends, submits go through again.
func TestPendingApprovalsCap(t *testing.T) {
	t.Parallel()
	const capN = 3
	e := newEnv(t, options{config: func(c *server.Config) { c.MaxPendingApprovals = capN }})
	var ids []ledger.RunID
	for i := range capN {
		ids = append(ids, e.submit(t, "alice", "k"+strconv.Itoa(i)))
	}
	refused := func(t *testing.T, principal, key string) {
		t.Helper()
		before := e.runCount(t)
		res := e.submitRaw(t, principal, key, submitBody(t))
		p := requireProblem(t, res, http.StatusTooManyRequests, server.CodeTooManyPendingApprovals)
		require.Equal(t, strconv.Itoa(server.PendingApprovalsRetryAfter), res.Header.Get("Retry-After"))
		require.Contains(t, p.Detail, strconv.Itoa(capN))
		require.Equal(t, before, e.runCount(t), "nothing stored")
	}

	t.Run("LiveRunsCount", func(t *testing.T) {
		refused(t, "alice", "one-more")
		refused(t, "amy", "another-submitter") // the cap is the tenant's
	})
	t.Run("PendingApprovalsCount", func(t *testing.T) {
		var actions []*ledger.Action
		for _, id := range ids {
			require.Equal(t, ledger.RunAwaitingApproval, e.advance(t, id).State)
			actions = append(actions, e.pendingAction(t, id))
		}
		refused(t, "alice", "one-more")

		res := e.get(t, "bob", "/v1/approvals")
		require.Equal(t, http.StatusOK, res.Status)
		var l approvalPage
		decode(t, res, &l)
		require.Len(t, l.Approvals, capN)

		// A replay is an old request, not a new run: still answered.
		replay := e.submitRaw(t, "alice", "k0", submitBody(t))
		require.Equal(t, http.StatusCreated, replay.Status, string(replay.Body))
		require.Equal(t, "true", replay.Header.Get(server.HeaderIdempotentReplayed))
		// Another tenant has its own cap.
		require.Equal(t, http.StatusCreated, e.submitRaw(t, "eve", "k0", submitBody(t)).Status)

		// A decision sends the run on (running: it may still ask again);
		// once it ends there is room.
		a := actions[0]
		require.Equal(t, http.StatusOK, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/deny", digestBody(a.ActionDigest)).Status)
		refused(t, "alice", "while-it-runs")
		require.Equal(t, ledger.RunStopped, e.advance(t, ids[0]).State)
		require.Equal(t, http.StatusCreated, e.submitRaw(t, "alice", "after-a-decision", submitBody(t)).Status)
		refused(t, "alice", "and-no-more")
	})
}

func TestPendingApprovalsCapConfig(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	_, err := server.New(server.Config{Store: e.Store, Engine: e.engine, Approvals: e.approvals, MaxPendingApprovals: -1})
	require.ErrorContains(t, err, "MaxPendingApprovals")
	// 0, the default of Config, is no cap.
	for i := range 5 {
		e.submit(t, "alice", "k"+strconv.Itoa(i))
	}
}
