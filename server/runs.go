package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
)

// HeaderIdempotencyKey names a submission (with the tenant) so a retry
// resolves to the same run.
const HeaderIdempotencyKey = "Idempotency-Key"

// HeaderIdempotentReplayed is "true" on the answer to a replayed submit.
const HeaderIdempotentReplayed = "Idempotent-Replayed"

// Run list pages.
const (
	DefaultPageSize = 50
	MaxPageSize     = 200
)

// MaxCancelReasonLength bounds a cancel's reason, in characters.
const MaxCancelReasonLength = 1000

// submitRun is POST /v1/runs. The checks run in this order: role (403),
// Idempotency-Key (400), media type, size and JSON (415, 413, 400), the
// run_submission schema (400), the agent (400 if the tenant may not use it,
// 403 agent_not_bound for an agent token not bound to it), then the key's in-flight
// mark (409) and the store (422 for a key reused with another body, 429
// for the pending-approvals cap).
//
// The answer is built only from facts fixed at acceptance, so a replay
// (same tenant, principal, key and request digest) gets the first answer
// byte for byte, with Idempotent-Replayed: true. The request identity is
// (tenant, principal, key): another principal's key is another identity,
// so reusing it makes a new run and reveals nothing of the other's.
//
// With Config.MaxPendingApprovals set, a new run of a tenant whose pending
// approvals and live runs (queued, running) have reached the cap is
// refused with 429 too_many_pending_approvals and Retry-After; a replay is
// still answered.
func (s *Server) submitRun(c echo.Context) error {
	id, err := needRole(c, RoleSubmitter, RoleAgent)
	if err != nil {
		return err
	}
	key, err := idempotencyKey(c.Request())
	if err != nil {
		return err
	}
	body, err := s.readBody(c, false)
	if err != nil {
		return err
	}
	if err := contracts.Validate(contracts.SchemaRunSubmission, body); err != nil {
		return submissionError(err)
	}
	var req SubmitRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	if err := s.submittableAgent(id, req.Agent); err != nil {
		return err
	}
	release, ok := s.markInFlight(id.Tenant, id.Principal, key)
	if !ok {
		s.metrics.conflicts.WithLabelValues("in_progress").Inc()
		return &apiError{code: CodeRequestInProgress, detail: "a request with this Idempotency-Key is still being processed",
			header: retryAfter(1)}
	}
	defer release()
	if s.beforeSubmit != nil {
		s.beforeSubmit()
	}
	res, err := s.store.SubmitRun(c.Request().Context(), ledger.SubmitRunParams{
		Tenant: id.Tenant, IdempotencyKey: key, Principal: id.Principal, Agent: req.Agent, Input: req.Input,
		Budgets: budgetLimits(req.Budgets), MaxPendingApprovals: s.maxPending, Start: s.engine.ClientDriven(req.Agent),
	})
	switch {
	case errors.Is(err, ledger.ErrKeyReused):
		s.metrics.conflicts.WithLabelValues("reused").Inc()
		return &apiError{code: CodeIdempotencyKeyReused, detail: "this Idempotency-Key was already used with a different body", err: err}
	case ledger.Code(err) == ledger.CodeBudgetExceeded:
		return &apiError{code: CodeTooManyPendingApprovals, err: err, header: retryAfter(PendingApprovalsRetryAfter),
			detail: "the tenant has " + strconv.Itoa(s.maxPending) + " approvals pending or runs that may ask for one, its cap: decide some, then submit again"}
	case err != nil:
		return err
	}
	h := c.Response().Header()
	h.Set(echo.HeaderLocation, runPath(res.Run.ID))
	if res.Replayed {
		s.metrics.replays.Inc()
		h.Set(HeaderIdempotentReplayed, "true")
	} else {
		s.engine.Notify()
	}
	return sendJSON(c, http.StatusCreated, submitResponse(res.Run, s.engine.ClientDriven(res.Run.Agent)))
}

// idempotencyKey reads the one Idempotency-Key header.
func idempotencyKey(r *http.Request) (string, error) {
	vals := r.Header.Values(HeaderIdempotencyKey)
	switch {
	case len(vals) == 0:
		return "", problemf(CodeIdempotencyKeyInvalid, "the Idempotency-Key header is required")
	case len(vals) > 1:
		return "", problemf(CodeIdempotencyKeyInvalid, "send exactly one Idempotency-Key header")
	case len(vals[0]) > 255:
		return "", problemf(CodeIdempotencyKeyInvalid, "the Idempotency-Key is longer than 255 characters")
	case !ledger.ValidIdempotencyKey(vals[0]):
		return "", problemf(CodeIdempotencyKeyInvalid, "the Idempotency-Key must be 1 to 255 printable ASCII characters")
	}
	return vals[0], nil
}

// submissionError answers a body that failed the run_submission schema. A
// schema_version of another major version is a schema violation at
// /schema_version too.
func submissionError(err error) error {
	var verr *contracts.VersionError
	if errors.As(err, &verr) {
		return &apiError{code: CodeSchemaViolation, detail: "the body does not match its schema", err: err,
			fields: []FieldError{{Location: "/schema_version", Message: verr.Error()}}}
	}
	var ve *contracts.ValidationError
	if errors.As(err, &ve) {
		return &apiError{code: CodeSchemaViolation, detail: "the body does not match its schema", fields: fieldErrors(ve)}
	}
	return err
}

// budgetLimits maps the submitted budgets to the ledger's. Every value is
// relative (deadline_ms is DeadlineAfter, fixed by the store at submit
// time), so the request digest of a replay is the digest of the first
// request.
func budgetLimits(b *SubmitBudgets) ledger.BudgetLimits {
	if b == nil {
		return ledger.BudgetLimits{}
	}
	sb := contracts.Budgets{MaxExecutionMS: b.MaxExecutionMS, DeadlineMS: b.DeadlineMS}
	return ledger.BudgetLimits{
		MaxAttemptsPerAction: b.MaxAttemptsPerAction,
		MaxAttemptsPerRun:    b.MaxAttemptsPerRun,
		MaxExecution:         sb.MaxExecution(),
		MaxSteps:             b.MaxSteps,
		MaxTokens:            b.MaxTokens,
		DeadlineAfter:        sb.Deadline(),
	}
}

// markInFlight marks the request identity (tenant, principal, key) as
// being processed by this server, or reports that it already is. The
// ledger alone guarantees one run per identity across processes; the mark
// only lets a concurrent retry hear 409 with Retry-After instead of
// waiting on the store's write lock. It keys on the same identity as the
// ledger, so another principal's submit with the same key is not held up.
func (s *Server) markInFlight(tenant, principal, key string) (release func(), ok bool) {
	k := inflightKey{tenant: tenant, principal: principal, key: key}
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	if _, busy := s.inflight[k]; busy {
		return nil, false
	}
	s.inflight[k] = struct{}{}
	return func() {
		s.inflightMu.Lock()
		delete(s.inflight, k)
		s.inflightMu.Unlock()
	}, true
}

// cursorPattern is a run id as a cursor: the prefix and an alphanumeric
// rest. Cursors are opaque to clients; this only refuses garbage.
var cursorPattern = regexp.MustCompile(`^run_[0-9A-Za-z]{1,64}$`)

// pageLimit reads the limit of a list: 1 to MaxPageSize, DefaultPageSize
// when absent.
func pageLimit(c echo.Context) (int, error) {
	v := c.QueryParam("limit")
	if v == "" {
		return DefaultPageSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxPageSize {
		return 0, badQuery("limit", "limit must be an integer from 1 to "+strconv.Itoa(MaxPageSize))
	}
	return n, nil
}

// listRuns is GET /v1/runs?state=&cursor=&limit=: the tenant's runs in id
// (creation) order, a page at a time; a principal that is only a submitter
// sees the runs it submitted.
func (s *Server) listRuns(c echo.Context) error {
	id, err := needRole(c, Roles()...)
	if err != nil {
		return err
	}
	f := ledger.RunFilter{Tenant: &id.Tenant}
	if v := c.QueryParam("state"); v != "" {
		st := ledger.RunState(v)
		if !st.Valid() {
			return badQuery("state", "unknown run state "+strconv.Quote(v))
		}
		f.State = &st
	}
	if v := c.QueryParam("cursor"); v != "" {
		if !cursorPattern.MatchString(v) {
			return badQuery("cursor", "malformed cursor")
		}
		after := ledger.RunID(v)
		f.AfterID = &after
	}
	limit, err := pageLimit(c)
	if err != nil {
		return err
	}
	runs, err := s.findVisibleRuns(c.Request().Context(), id, f, limit+1)
	if err != nil {
		return err
	}
	out := RunList{Runs: make([]RunSummary, 0, min(len(runs), limit))}
	if len(runs) > limit {
		runs = runs[:limit]
		out.NextCursor = string(runs[limit-1].ID)
	}
	for _, r := range runs {
		out.Runs = append(out.Runs, runSummary(r))
	}
	return sendJSON(c, http.StatusOK, out)
}

// findVisibleRuns returns up to n runs matching f that id may see: the
// tenant's, for an agent principal those it drives or submitted, or for a
// submitter-only principal its own.
func (s *Server) findVisibleRuns(ctx context.Context, id Identity, f ledger.RunFilter, n int) ([]*ledger.Run, error) {
	if !id.readsTenant() && id.Has(RoleAgent) {
		return s.findDrivenRuns(ctx, id, f, n)
	}
	if !id.readsTenant() {
		f.SubmittedBy = &id.Principal
	}
	f.Limit = n
	return s.store.FindRuns(ctx, f)
}

func badQuery(param, msg string) error {
	return &apiError{code: string(ledger.CodeInvalid), detail: "invalid query parameter " + param,
		fields: []FieldError{{Location: param, Message: msg}}}
}

// maxIDLength bounds path ids; longer ones cannot exist.
const maxIDLength = 128

// visibleRun loads a run the identity may see (Identity.seesRun): its
// tenant's, and for a principal that does not read the whole tenant one it
// submitted or drives. Anything else is the same 404 as an unknown id.
func (s *Server) visibleRun(ctx context.Context, id Identity, runID string) (*ledger.Run, error) {
	if runID == "" || len(runID) > maxIDLength || !utf8.ValidString(runID) {
		return nil, notFound("run", runID)
	}
	r, err := s.store.FindRunByID(ctx, ledger.RunID(runID))
	switch {
	case ledger.Code(err) == ledger.CodeNotFound:
		return nil, notFound("run", runID)
	case err != nil:
		return nil, err
	case !id.seesRun(r):
		return nil, notFound("run", runID)
	}
	return r, nil
}

// getRun is GET /v1/runs/{run_id}.
func (s *Server) getRun(c echo.Context) error {
	id, err := needRole(c, Roles()...)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	r, err := s.visibleRun(ctx, id, c.Param("run_id"))
	if err != nil {
		return err
	}
	v, err := s.loadRunView(ctx, r)
	if err != nil {
		return err
	}
	return sendJSON(c, http.StatusOK, v)
}

// cancelRun is POST /v1/runs/{run_id}/cancel with an optional body
// {"reason": "…"}: a submitter cancels its own runs, an agent principal
// the runs it drives, an admin any of the tenant's. The decision is the store's one write (engine.Cancel): 202
// with the cancellation as it stands (accepted: no new attempt starts),
// and the same 202 with the same cancellation for every repeat, also once
// it is stopped or too_late and the run has ended; 409 only if the run
// ended without a cancellation, and then nothing is stored. The reason is
// redacted before it is stored.
func (s *Server) cancelRun(c echo.Context) error {
	id, err := needRole(c, RoleSubmitter, RoleAgent)
	if err != nil {
		return err
	}
	body, err := s.readBody(c, true)
	if err != nil {
		return err
	}
	var req CancelRequest
	if body != nil {
		if err := decodeStrict(body, &req); err != nil {
			return err
		}
	}
	if utf8.RuneCountInString(req.Reason) > MaxCancelReasonLength {
		return &apiError{code: CodeSchemaViolation, detail: "the body does not match its schema",
			fields: []FieldError{{Location: "/reason", Message: "longer than " + strconv.Itoa(MaxCancelReasonLength) + " characters"}}}
	}
	ctx := c.Request().Context()
	r, err := s.visibleRun(ctx, id, c.Param("run_id"))
	if err != nil {
		return err
	}
	if !s.mayCancel(id, r) {
		return forbidden("only the principal who submitted a run, one that drives its agent, or an admin, may cancel it")
	}
	res, err := s.engine.Cancel(ctx, engine.CancelParams{RunID: r.ID, Principal: id.Principal, Reason: req.Reason})
	if err != nil {
		return err
	}
	return sendJSON(c, http.StatusAccepted, cancellationView(res.Cancellation))
}

// timeline is GET /v1/runs/{run_id}/timeline: the run's events, their data
// through the Redactor, with the chain verified. Auditors and admins read
// any of the tenant's; a submitter its own runs'.
func (s *Server) timeline(c echo.Context) error {
	id, err := needRole(c, RoleSubmitter, RoleAuditor)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	r, err := s.visibleRun(ctx, id, c.Param("run_id"))
	if err != nil {
		return err
	}
	if !id.Has(RoleAuditor) && r.SubmittedBy != id.Principal {
		return forbidden("timelines of other principals' runs are for auditors")
	}
	chain, err := s.store.FindChain(ctx, r.ID)
	if err != nil {
		return err
	}
	out := Timeline{RunID: r.ID, Chain: chain.Report, Events: make([]TimelineEvent, 0, len(chain.Events))}
	for _, e := range chain.Events {
		data, err := s.redactor.RedactEventData(e)
		if err != nil {
			return err
		}
		out.Events = append(out.Events, TimelineEvent{Seq: e.Seq, Type: e.Type, EntityType: e.EntityType,
			EntityID: e.EntityID, FromState: e.FromState, ToState: e.ToState, Actor: e.Actor,
			Data: json.RawMessage(data), CreatedAt: e.CreatedAt, Hash: e.Hash})
	}
	return sendJSON(c, http.StatusOK, out)
}

// evidenceFormats are the formats of GET /v1/runs/{run_id}/evidence.
var evidenceFormats = map[string]bool{"json": true, "md": true, "html": true}

// evidence is GET /v1/runs/{run_id}/evidence?format=json|md|html, for
// auditors: the run's redacted evidence report (package evidence). If
// redaction fails, the answer is an error, never an unredacted report.
func (s *Server) evidence(c echo.Context) error {
	id, err := needRole(c, RoleAuditor)
	if err != nil {
		return err
	}
	r, err := s.visibleRun(c.Request().Context(), id, c.Param("run_id"))
	if err != nil {
		return err
	}
	format := c.QueryParam("format")
	if format == "" {
		format = "json"
	}
	if !evidenceFormats[format] {
		return badQuery("format", "format must be json, md or html")
	}
	rep, err := evidence.Build(c.Request().Context(), s.store, r.ID, evidence.Options{Redactor: s.redaction, Now: s.now,
		Tools: func(name string) ([]string, bool) {
			d, ok := s.engine.Tool(name)
			return d.SecretPaths, ok
		}})
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	contentType := "application/json"
	switch format {
	case "json":
		err = rep.JSON(&buf)
	case "md":
		contentType, err = "text/markdown; charset=utf-8", rep.Markdown(&buf)
	case "html":
		contentType, err = "text/html; charset=utf-8", rep.HTML(&buf)
	}
	if err != nil {
		return err
	}
	c.Response().Header().Set("X-Content-Type-Options", "nosniff")
	return c.Blob(http.StatusOK, contentType, buf.Bytes())
}
