package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
)

// Problem codes of the API: the codes of ledger.ErrorCode (invalid,
// not_found, conflict, forbidden, approval_required, budget_exceeded,
// unsupported_version, internal) and these, which only the server raises.
// Clients branch on Problem.Code, never on Detail.
const (
	CodeUnauthorized          = "unauthorized"            // 401: no, a malformed or an unknown bearer token
	CodePayloadTooLarge       = "payload_too_large"       // 413: the body exceeds Config.MaxBodyBytes
	CodeUnsupportedMediaType  = "unsupported_media_type"  // 415: a body that is not application/json
	CodeIdempotencyKeyInvalid = "idempotency_key_invalid" // 400: Idempotency-Key missing, repeated, too long or malformed
	CodeIdempotencyKeyReused  = "idempotency_key_reused"  // 422: the key was used with another body
	CodeRequestInProgress     = "request_in_progress"     // 409 + Retry-After: the same key is still being processed
	CodeInvalidJSON           = "invalid_json"            // 400: malformed JSON, a duplicate key, nesting deeper than 32
	CodeSchemaViolation       = "schema_violation"        // 400: the body breaks its schema; Problem.Errors says where
	CodeNotImplemented        = "not_implemented"         // 501: the route exists, the feature does not yet
	CodeMethodNotAllowed      = "method_not_allowed"      // 405: the path exists, not with this method
	CodeRouteNotFound         = "route_not_found"         // 404: no such path
	CodeNotReady              = "not_ready"               // 503: the store is unreachable, its schema is not current or its writes fail
	CodeRateLimited           = "rate_limited"            // 429 + Retry-After: over the principal's (or a bad-token client address's) rate limit
	// CodeTooManyPendingApprovals is 429 + Retry-After: the tenant's pending
	// approvals and live runs reached Config.MaxPendingApprovals.
	CodeTooManyPendingApprovals = "too_many_pending_approvals"
	// CodeTooManyStreams is 429 + Retry-After: the principal holds
	// Config.MaxStreams event streams open already.
	CodeTooManyStreams = "too_many_streams"
	// CodeTooManyLongPolls is 429 + Retry-After: the principal holds
	// Config.MaxLongPolls long-polls waiting already.
	CodeTooManyLongPolls = "too_many_long_polls"
	// CodeAgentNotBound is 403: a token with the role agent submitted a run
	// of an agent it is not bound to.
	CodeAgentNotBound = "agent_not_bound"
)

// problemTypeBase prefixes every problem's code to make its type URI.
const problemTypeBase = "https://actionledger.dev/problems/"

// problemSpec is the status and title of one code.
type problemSpec struct {
	status int
	title  string
}

// problems is the one code→status table of the API. A code missing here is
// a bug and comes out as internal.
var problems = map[string]problemSpec{
	string(ledger.CodeInvalid):            {http.StatusBadRequest, "Invalid request"},
	string(ledger.CodeNotFound):           {http.StatusNotFound, "Not found"},
	string(ledger.CodeConflict):           {http.StatusConflict, "Conflict"},
	string(ledger.CodeForbidden):          {http.StatusForbidden, "Forbidden"},
	string(ledger.CodeApprovalRequired):   {http.StatusConflict, "Approval required"},
	string(ledger.CodeBudgetExceeded):     {http.StatusConflict, "Budget exceeded"},
	string(ledger.CodeUnsupportedVersion): {http.StatusInternalServerError, "Unsupported database version"},
	string(ledger.CodeInternal):           {http.StatusInternalServerError, "Internal error"},
	CodeUnauthorized:                      {http.StatusUnauthorized, "Unauthorized"},
	CodePayloadTooLarge:                   {http.StatusRequestEntityTooLarge, "Payload too large"},
	CodeUnsupportedMediaType:              {http.StatusUnsupportedMediaType, "Unsupported media type"},
	CodeIdempotencyKeyInvalid:             {http.StatusBadRequest, "Invalid Idempotency-Key"},
	CodeIdempotencyKeyReused:              {http.StatusUnprocessableEntity, "Idempotency-Key reused"},
	CodeRequestInProgress:                 {http.StatusConflict, "Request in progress"},
	CodeInvalidJSON:                       {http.StatusBadRequest, "Invalid JSON"},
	CodeSchemaViolation:                   {http.StatusBadRequest, "Schema violation"},
	CodeNotImplemented:                    {http.StatusNotImplemented, "Not implemented"},
	CodeMethodNotAllowed:                  {http.StatusMethodNotAllowed, "Method not allowed"},
	CodeRouteNotFound:                     {http.StatusNotFound, "Route not found"},
	CodeNotReady:                          {http.StatusServiceUnavailable, "Not ready"},
	CodeRateLimited:                       {http.StatusTooManyRequests, "Too many requests"},
	CodeTooManyPendingApprovals:           {http.StatusTooManyRequests, "Too many pending approvals"},
	CodeTooManyStreams:                    {http.StatusTooManyRequests, "Too many event streams"},
	CodeTooManyLongPolls:                  {http.StatusTooManyRequests, "Too many long-polls"},
	CodeAgentNotBound:                     {http.StatusForbidden, "Agent not bound"},
	// The agent protocol's codes (engine.ProtocolError, protocol_errors.go).
	engine.CodeStepKeyReused:   {http.StatusUnprocessableEntity, "Step key reused"},
	engine.CodeInvalidArgs:     {http.StatusUnprocessableEntity, "Invalid arguments"},
	engine.CodeUnknownTool:     {http.StatusUnprocessableEntity, "Unknown tool"},
	engine.CodeToolNotAllowed:  {http.StatusUnprocessableEntity, "Tool not allowed"},
	engine.CodeOutcomeInvalid:  {http.StatusUnprocessableEntity, "Outcome not allowed"},
	engine.CodeFinishInvalid:   {http.StatusUnprocessableEntity, "Invalid finish"},
	engine.CodeActionInDoubt:   {http.StatusConflict, "Action in doubt"},
	engine.CodeRunStopped:      {http.StatusConflict, "Run stopped"},
	engine.CodeRunCancelled:    {http.StatusConflict, "Run cancelled"},
	engine.CodeNotApproved:     {http.StatusConflict, "Not approved"},
	engine.CodeApprovalStale:   {http.StatusConflict, "Approval stale"},
	engine.CodeAttemptOpen:     {http.StatusConflict, "Attempt open"},
	engine.CodeAttemptClosed:   {http.StatusConflict, "Attempt closed"},
	engine.CodeOutcomeConflict: {http.StatusConflict, "Outcome conflict"},
	engine.CodeStaleDecision:   {http.StatusConflict, "Stale decision"},
	engine.CodeNotClientDriven: {http.StatusConflict, "Not client-driven"},
	engine.CodeCannotSupersede: {http.StatusConflict, "Cannot supersede"},
	engine.CodeBadToken:        {http.StatusForbidden, "Bad attempt token"},
}

// StatusOf returns the HTTP status the API answers with for a problem code:
// the one table, exported so that clients and tests need not copy it. An
// unknown code is 500.
func StatusOf(code string) int {
	if p, ok := problems[code]; ok {
		return p.status
	}
	return http.StatusInternalServerError
}

// apiError is an error a handler returns to be answered as a problem. Err,
// if set, is the cause; it is logged, and sent only as part of Detail where
// the handler put it there.
type apiError struct {
	code   string
	detail string
	fields []FieldError
	header map[string]string
	err    error
	// ext holds the problem's extension members (the agent protocol's
	// action, recorded and stop_reason), copied into the Problem.
	ext Problem
}

func (e *apiError) Error() string {
	if e.err != nil {
		return e.code + ": " + e.detail + ": " + e.err.Error()
	}
	return e.code + ": " + e.detail
}

func (e *apiError) Unwrap() error { return e.err }

// problemf returns an apiError with a formatted detail.
func problemf(code, format string, args ...any) *apiError {
	return &apiError{code: code, detail: fmt.Sprintf(format, args...)}
}

// notFound is the one answer for an unknown object and an object the caller
// may not see, so that ids reveal nothing.
func notFound(kind, id string) *apiError {
	return problemf(string(ledger.CodeNotFound), "%s %s not found", kind, id)
}

func forbidden(format string, args ...any) *apiError {
	return problemf(string(ledger.CodeForbidden), format, args...)
}

// toProblem turns any error a handler or Echo returned into the problem to
// send. Causes of 5xx answers are logged here and replaced by a generic
// detail.
func (s *Server) toProblem(ctx context.Context, err error) (Problem, map[string]string) {
	var (
		code   string
		detail string
		fields []FieldError
		header map[string]string
		ext    Problem
	)
	var (
		ae  *apiError
		he  *echo.HTTPError
		ve  *contracts.ValidationError
		mbe *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ae):
		code, detail, fields, header, ext = ae.code, ae.detail, ae.fields, ae.header, ae.ext
	case errors.As(err, &ve):
		code, detail, fields = CodeSchemaViolation, "the body does not match its schema", fieldErrors(ve)
	case errors.As(err, &mbe):
		code, detail = CodePayloadTooLarge, fmt.Sprintf("the body is larger than %d bytes", mbe.Limit)
	case errors.As(err, &he):
		code, detail = echoCode(he.Code), http.StatusText(he.Code)
	default:
		var le *ledger.Error
		if errors.As(err, &le) {
			code, detail = string(le.Code), err.Error()
		} else {
			code = string(ledger.CodeInternal)
		}
	}
	spec, ok := problems[code]
	if !ok {
		s.log.ErrorContext(ctx, "problem code missing from the table", "code", code, "err", err)
		code, spec = string(ledger.CodeInternal), problems[string(ledger.CodeInternal)]
	}
	if spec.status >= 500 && code != CodeNotImplemented && code != CodeNotReady {
		s.log.ErrorContext(ctx, "request failed", "code", code, "err", err)
		detail = "internal error"
	}
	return Problem{
		Type:   problemTypeBase + code,
		Title:  spec.title,
		Status: spec.status,
		Detail: detail,
		Code:   code,
		Errors: fields,
		// Extension members of the agent protocol's problems.
		Action: ext.Action, Recorded: ext.Recorded, StopReason: ext.StopReason,
	}, header
}

// echoCode names the problem of an error Echo itself raised (routing, its
// own limits).
func echoCode(status int) string {
	switch status {
	case http.StatusNotFound:
		return CodeRouteNotFound
	case http.StatusMethodNotAllowed:
		return CodeMethodNotAllowed
	case http.StatusRequestEntityTooLarge:
		return CodePayloadTooLarge
	case http.StatusUnsupportedMediaType:
		return CodeUnsupportedMediaType
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusBadRequest:
		return string(ledger.CodeInvalid)
	default:
		return string(ledger.CodeInternal)
	}
}

func fieldErrors(ve *contracts.ValidationError) []FieldError {
	out := make([]FieldError, len(ve.Issues))
	for i, is := range ve.Issues {
		out[i] = FieldError{Location: is.Location, Message: is.Message}
	}
	return out
}

// handleError is the Echo HTTPErrorHandler: every error, from a handler,
// a middleware or Echo's router, leaves as application/problem+json.
func (s *Server) handleError(err error, c echo.Context) {
	ctx := c.Request().Context()
	if c.Response().Committed {
		s.log.ErrorContext(ctx, "error after the response was sent", "err", err)
		return
	}
	p, header := s.toProblem(ctx, err)
	h := c.Response().Header()
	for k, v := range header {
		h.Set(k, v)
	}
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="ledger"`)
	}
	if id, ok := requestIDFrom(ctx); ok {
		p.Instance = ProblemInstancePrefix + id
	}
	// A HEAD request gets the problem's headers; observe drops its body.
	if werr := writeJSON(c, p.Status, "application/problem+json", p); werr != nil {
		s.log.ErrorContext(ctx, "write problem", "err", werr)
	}
}

// retryAfter is the header of request_in_progress.
func retryAfter(seconds int) map[string]string {
	return map[string]string{"Retry-After": strconv.Itoa(seconds)}
}

// Codes returns every problem code the API answers with, sorted: the
// document's Problem.code lists them.
func Codes() []string { return slices.Sorted(maps.Keys(problems)) }
