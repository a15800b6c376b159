package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/ledger"
)

// TestProtocolStaleApproval: a write approved, then begun after its
// approval's execute_by, is refused with 409 approval_stale and asks a
// person again: the answer carries the action, back in awaiting_approval
// with a new pending approval for the same digest; the old approval shows
// when and why it went stale. Approving again takes the new approval (a
// wrong digest is still refused), and the begin then works.
func TestProtocolStaleApproval(t *testing.T) {
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "s1")
	a := e.approvedWrite(t, run, "pay-1", toolQuery, `{"to":"acct_1","cents":500}`)
	granted := e.actionOK(t, a.ID)
	require.Len(t, granted.Approvals, 1)
	require.NotNil(t, granted.Approvals[0].ExecuteBy, "a granted approval shows its execute_by")
	require.Equal(t, granted.Approvals[0].DecidedAt.Add(approval.DefaultExecuteWithin), *granted.Approvals[0].ExecuteBy)

	e.Clock.Advance(approval.DefaultExecuteWithin)
	p := requireProblem(t, e.begin(t, a.ID, "b1"), http.StatusConflict, "approval_stale")
	require.Contains(t, p.Detail, "execute_by")
	require.NotNil(t, p.Action)
	require.Equal(t, a.ID, p.Action.ID)
	require.Equal(t, ledger.ActionAwaitingApproval, p.Action.State)
	require.Len(t, p.Action.Approvals, 2)
	old, asked := p.Action.Approvals[0], p.Action.Approvals[1]
	require.Equal(t, ledger.ApprovalGranted, old.State)
	require.NotNil(t, old.StaleAt)
	require.Contains(t, old.StaleReason, "execute_by")
	require.Equal(t, ledger.ApprovalPending, asked.State)
	require.Equal(t, a.ActionDigest, asked.ActionDigest, "the same digest")
	require.Equal(t, "wait_approval", e.nextOK(t, run).Directives[0].Directive)
	requireProblem(t, e.begin(t, a.ID, "b1"), http.StatusConflict, "not_approved")

	pending := e.get(t, "bob", "/v1/approvals?state=pending")
	require.Equal(t, http.StatusOK, pending.Status, string(pending.Body))
	require.Contains(t, string(pending.Body), string(asked.ID))

	other := digestBody("sha256:" + "0000000000000000000000000000000000000000000000000000000000000000")
	requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", other), http.StatusConflict, "conflict")
	e.approveOK(t, a)
	b := e.beginOK(t, a.ID, "b2")
	require.Equal(t, a.ActionDigest, b.ActionDigest)
	res := e.attemptPost(t, "ada", b.Attempt.ID, "complete",
		tokenBody(b.AttemptToken, `"status":"succeeded","effect":"happened","output":{"payment_id":"pay_9"}`))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
}

// TestStaleApprovalRefusedWhenApprovedAgain: approving an action whose
// approval went stale, before its next begin asked again, is refused
// clearly: nothing is pending, and the answer says why.
func TestStaleApprovalRefusedWhenApprovedAgain(t *testing.T) {
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "s2")
	a := e.approvedWrite(t, run, "pay-1", toolQuery, `{"to":"acct_1","cents":500}`)
	e.Clock.Advance(approval.DefaultExecuteWithin)
	p := requireProblem(t, e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest)),
		http.StatusConflict, "conflict")
	require.Contains(t, p.Detail, "passed its execute_by")
	require.Equal(t, ledger.ActionApproved, e.actionOK(t, a.ID).State, "nothing changed")
}
