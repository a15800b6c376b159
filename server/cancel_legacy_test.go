package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// TestStuckCancellationRepaired makes the row the old three-write cancel
// left when the run completed between its writes (a cancellation accepted
// on a completed run, no event), then runs the start-up recovery scan, as
// a restart does: the cancellation is too_late, with its hash-chained
// event, in GET /v1/runs/{id}, the timeline, the evidence report and every
// later cancel's answer.
func TestStuckCancellationRepaired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, options{})
	id, a := e.awaiting(t, "alice", "k1")
	require.Equal(t, http.StatusOK, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)).Status)
	require.Equal(t, ledger.RunCompleted, e.advance(t, id).State)
	stuck := e.LegacyCancellation(t, id, ledger.CancelAccepted)
	r := getRunView(t, e, "alice", id)
	require.Equal(t, ledger.CancelAccepted, r.Cancellation.State, "stuck, as the old build left it")

	rep, err := e.engine.Recover(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Cancellations, 1)

	r = getRunView(t, e, "alice", id)
	require.Equal(t, ledger.RunCompleted, r.State, "the run keeps how it ended")
	require.Equal(t, stuck, r.Cancellation.ID)
	require.Equal(t, ledger.CancelTooLate, r.Cancellation.State)
	require.NotNil(t, r.Cancellation.TooLateAt)
	require.Nil(t, r.Cancellation.StoppedAt, "never confirmed")

	res := e.post(t, "alice", "/v1/runs/"+string(id)+"/cancel", `{}`)
	require.Equal(t, http.StatusAccepted, res.Status, string(res.Body))
	var c server.Cancellation
	decode(t, res, &c)
	require.Equal(t, stuck, c.ID)
	require.Equal(t, ledger.CancelTooLate, c.State)

	var tl server.Timeline
	decode(t, e.get(t, "carol", "/v1/runs/"+string(id)+"/timeline"), &tl)
	require.True(t, tl.Chain.OK, tl.Chain.Reason)
	last := tl.Events[len(tl.Events)-1]
	require.Equal(t, "cancellation.too_late", last.Type)
	require.Equal(t, string(ledger.CancelAccepted), last.FromState)

	res = e.get(t, "carol", "/v1/runs/"+string(id)+"/evidence")
	require.Equal(t, http.StatusOK, res.Status)
	require.NoError(t, contracts.Validate(contracts.SchemaReport, res.Body))
	require.True(t, strings.Contains(string(res.Body), `"state": "too_late"`), "the report shows too_late")
	res = e.get(t, "carol", "/v1/runs/"+string(id)+"/evidence?format=md")
	require.Equal(t, http.StatusOK, res.Status)
	require.True(t, strings.Contains(string(res.Body), "too late (the run ended first)"), "the Markdown report shows it")
}
