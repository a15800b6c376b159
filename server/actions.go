package server

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// visibleAction loads an action the identity may see: its tenant's, and
// for a principal that does not read the whole tenant one of a run it
// submitted or drives (Identity.seesRun). Anything else is the same 404 as
// an unknown id.
func (s *Server) visibleAction(ctx context.Context, id Identity, actionID string) (*ledger.Action, error) {
	if actionID == "" || len(actionID) > maxIDLength || !utf8.ValidString(actionID) {
		return nil, notFound("action", actionID)
	}
	a, err := s.store.FindActionByID(ctx, ledger.ActionID(actionID))
	switch {
	case ledger.Code(err) == ledger.CodeNotFound:
		return nil, notFound("action", actionID)
	case err != nil:
		return nil, err
	case a.Tenant != id.Tenant:
		return nil, notFound("action", actionID)
	}
	if !id.readsTenant() {
		r, err := s.store.FindRunByID(ctx, a.RunID)
		if err != nil {
			return nil, err
		}
		if !id.seesRun(r) {
			return nil, notFound("action", actionID)
		}
	}
	return a, nil
}

// getAction is GET /v1/actions/{action_id}?wait=&version=: the action
// with its digest, redacted arguments, attempts and approvals; with wait
// and version, once its version is not version or the wait ends.
func (s *Server) getAction(c echo.Context) error {
	id, err := needRole(c, Roles()...)
	if err != nil {
		return err
	}
	q, err := parseWait(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	a, err := s.visibleAction(ctx, id, c.Param("action_id"))
	if err != nil {
		return err
	}
	// A long-poll (protocol_wait.go): with wait and version, the answer
	// waits for another version.
	if a, err = s.waitAction(c, q, a); err != nil {
		return err
	}
	v, err := s.loadAction(ctx, a)
	if err != nil {
		return err
	}
	return sendJSON(c, http.StatusOK, v)
}

// approvalCursorPattern is an approval id as a cursor, as cursorPattern is
// for runs.
var approvalCursorPattern = regexp.MustCompile(`^apr_[0-9A-Za-z]{1,64}$`)

// listApprovals is GET /v1/approvals?state=&cursor=&limit=: the tenant's
// approvals in one state (pending if absent), oldest first, a page at a
// time as GET /v1/runs pages runs: limit 1 to MaxPageSize (DefaultPageSize
// if absent), next_cursor naming where the next page starts.
func (s *Server) listApprovals(c echo.Context) error {
	id, err := needRole(c, RoleApprover, RoleAuditor)
	if err != nil {
		return err
	}
	st := ledger.ApprovalPending
	if v := c.QueryParam("state"); v != "" {
		st = ledger.ApprovalState(v)
		if !st.Valid() {
			return badQuery("state", "unknown approval state "+strconv.Quote(v))
		}
	}
	f := ledger.ApprovalFilter{Tenant: &id.Tenant, State: &st}
	if v := c.QueryParam("cursor"); v != "" {
		if !approvalCursorPattern.MatchString(v) {
			return badQuery("cursor", "malformed cursor")
		}
		after := ledger.ApprovalID(v)
		f.AfterID = &after
	}
	limit, err := pageLimit(c)
	if err != nil {
		return err
	}
	f.Limit = limit + 1
	aprs, err := s.store.FindApprovals(c.Request().Context(), f)
	if err != nil {
		return err
	}
	out := ApprovalList{Approvals: make([]Approval, 0, min(len(aprs), limit))}
	if len(aprs) > limit {
		aprs = aprs[:limit]
		out.NextCursor = string(aprs[limit-1].ID)
	}
	for _, a := range aprs {
		out.Approvals = append(out.Approvals, approvalView(a))
	}
	return sendJSON(c, http.StatusOK, out)
}

// approve is POST /v1/actions/{action_id}/approve.
func (s *Server) approve(c echo.Context) error { return s.decide(c, ledger.DecisionGrant) }

// deny is POST /v1/actions/{action_id}/deny.
func (s *Server) deny(c echo.Context) error { return s.decide(c, ledger.DecisionDeny) }

// decide grants or denies an action's pending approval through the
// approval service, which checks the tenant (404), separation of duties
// (403) and, in the deciding transaction, that the approval is pending,
// bound to the digest sent and not expired (409, nothing changes).
func (s *Server) decide(c echo.Context, d ledger.ApprovalDecision) error {
	var req DecisionRequest
	id, actionID, err := s.approverActionRequest(c, &req, "action_digest")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	res, err := s.approvals.Decide(ctx, approval.DecideParams{Tenant: id.Tenant, Principal: id.Principal,
		ActionID: ledger.ActionID(actionID), ActionDigest: req.ActionDigest, Decision: d, Reason: req.Reason})
	if err != nil {
		return err
	}
	s.metrics.observeApproval(res.Approval)
	s.engine.Notify()
	av, err := s.loadAction(ctx, res.Action)
	if err != nil {
		return err
	}
	return sendJSON(c, http.StatusOK, DecisionResponse{Approval: approvalView(res.Approval), Action: av})
}

// approverActionRequest is the common start of approve, deny and resolve:
// the approver role, a strict JSON body with its required field, and the
// action id of the path.
func (s *Server) approverActionRequest(c echo.Context, req any, required string) (Identity, string, error) {
	id, err := needRole(c, RoleApprover)
	if err != nil {
		return Identity{}, "", err
	}
	body, err := s.readBody(c, false)
	if err != nil {
		return Identity{}, "", err
	}
	if err := decodeStrict(body, req, required); err != nil {
		return Identity{}, "", err
	}
	actionID := c.Param("action_id")
	if len(actionID) > maxIDLength {
		return Identity{}, "", notFound("action", actionID)
	}
	return id, actionID, nil
}

// resolve is POST /v1/actions/{action_id}/resolve: a person settles an
// action in review with happened, not_happened or abandon. 409 if the
// action is not in review; 404 for another tenant's.
func (s *Server) resolve(c echo.Context) error {
	var req ResolveRequest
	id, actionID, err := s.approverActionRequest(c, &req, "outcome")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	// The engine redacts the note before it is stored, and notifies its
	// pool.
	a, err := s.engine.Resolve(ctx, recovery.ResolveParams{Tenant: id.Tenant, Principal: id.Principal,
		ActionID: ledger.ActionID(actionID), Outcome: recovery.Outcome(req.Outcome), Note: req.Note})
	if err != nil {
		return err
	}
	v, err := s.loadAction(ctx, a)
	if err != nil {
		return err
	}
	return sendJSON(c, http.StatusOK, v)
}
