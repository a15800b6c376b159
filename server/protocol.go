package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
)

// The agent protocol's routes (docs/agent-protocol.md): a client-driven
// run's agent proposes each tool call, begins, heartbeats and completes
// its attempts, posts what its tool said, asks what to do next and
// finishes its run. Each handler checks the principal, the headers and the
// body the way the other routes do (request.go), then makes one call to
// the engine, which judges the step and records it; its ProtocolError
// codes become problems (protocol_errors.go).

// MaxAbandonReasonLength bounds an abandon's reason, in characters.
const MaxAbandonReasonLength = 1000

// caller is who makes a protocol call, and which runs it may drive: a
// principal with the role agent bound to the run's agent, or an admin, in
// the run's tenant (mayDrive). Any other run is not found.
func (s *Server) caller(c echo.Context) (engine.Caller, error) {
	id, err := needRole(c, RoleAgent, RoleAdmin)
	if err != nil {
		return engine.Caller{}, err
	}
	return engine.Caller{Tenant: id.Tenant, Principal: id.Principal,
		MayDrive: func(r *ledger.Run) bool { return r != nil && s.mayDrive(id, r) }}, nil
}

// pathID reads an id of the path; one that cannot exist is the same 404 as
// an unknown one.
func pathID(c echo.Context, param, kind string) (string, error) {
	v := c.Param(param)
	if v == "" || len(v) > maxIDLength || !utf8.ValidString(v) {
		return "", notFound(kind, v)
	}
	return v, nil
}

// drivableRun loads a run the caller may drive; any other is the same 404
// as an unknown id.
func (s *Server) drivableRun(ctx context.Context, caller engine.Caller, runID string) (*ledger.Run, error) {
	r, err := s.store.FindRunByID(ctx, ledger.RunID(runID))
	switch {
	case ledger.Code(err) == ledger.CodeNotFound:
		return nil, notFound("run", runID)
	case err != nil:
		return nil, err
	case r.Tenant != caller.Tenant || !caller.MayDrive(r):
		return nil, notFound("run", runID)
	}
	return r, nil
}

// proposeAction is POST /v1/runs/{run_id}/actions. The checks run in this
// order: role (403), Idempotency-Key, the step key (400), media type, size
// and JSON (415, 413, 400), the body's fields (400), then the engine's
// judgement of the proposal (404, 409, 422). A replay of the same step key
// and body answers 201 with the same action and Idempotent-Replayed: true.
func (s *Server) proposeAction(c echo.Context) error {
	caller, err := s.caller(c)
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
	var req ProposeRequest
	if err := decodeStrict(body, &req, "tool", "arguments"); err != nil {
		return err
	}
	if err := checkProposal(req); err != nil {
		return err
	}
	runID, err := pathID(c, "run_id", "run")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	res, err := s.engine.Propose(ctx, engine.ProposeParams{Caller: caller, RunID: ledger.RunID(runID), StepKey: key,
		Tool: req.Tool, Arguments: req.Arguments, Usage: engineUsage(req.Usage), Supersedes: req.Supersedes,
		MaxPendingApprovals: s.maxPending})
	if err != nil {
		return s.protocolFailure(ctx, err, "run", runID)
	}
	v, err := s.loadAction(ctx, res.Action)
	if err != nil {
		return err
	}
	h := c.Response().Header()
	h.Set(echo.HeaderLocation, "/v1/actions/"+string(res.Action.ID))
	if res.Replayed {
		h.Set(HeaderIdempotentReplayed, "true")
	}
	return sendJSON(c, http.StatusCreated, v)
}

// checkProposal refuses what the body's schema refuses and strict decoding
// lets through: arguments that are not an object, a tool without a name,
// negative token counts.
func checkProposal(req ProposeRequest) error {
	if req.Tool == "" {
		return schemaViolation("/tool", "must not be empty")
	}
	if a := bytes.TrimSpace(req.Arguments); len(a) == 0 || a[0] != '{' {
		return schemaViolation("/arguments", "expected object")
	}
	return checkUsage("/usage", req.Usage)
}

// checkUsage refuses negative token counts.
func checkUsage(at string, u *Usage) error {
	switch {
	case u == nil:
		return nil
	case u.InputTokens < 0:
		return schemaViolation(at+"/input_tokens", "must not be negative")
	case u.OutputTokens < 0:
		return schemaViolation(at+"/output_tokens", "must not be negative")
	}
	return nil
}

func engineUsage(u *Usage) *engine.Usage {
	if u == nil {
		return nil
	}
	return &engine.Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens}
}

// schemaViolation is a 400 schema_violation at one location of the body.
func schemaViolation(location, msg string) error {
	return &apiError{code: CodeSchemaViolation, detail: "the body does not match its schema",
		fields: []FieldError{{Location: location, Message: msg}}}
}

// beginAttempt is POST /v1/actions/{action_id}/attempts, with an
// Idempotency-Key and a body of {} or none: 201 with the attempt, durable
// before the answer, its token, the arguments to execute and the lease. A
// replay of the key answers the same attempt and token, with
// Idempotent-Replayed: true.
func (s *Server) beginAttempt(c echo.Context) error {
	caller, err := s.caller(c)
	if err != nil {
		return err
	}
	key, err := idempotencyKey(c.Request())
	if err != nil {
		return err
	}
	body, err := s.readBody(c, true)
	if err != nil {
		return err
	}
	if body != nil {
		if err := decodeStrict(body, &BeginRequest{}); err != nil {
			return err
		}
	}
	actionID, err := pathID(c, "action_id", "action")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	res, err := s.engine.Begin(ctx, engine.BeginParams{Caller: caller, ActionID: ledger.ActionID(actionID), Key: key})
	if err != nil {
		return s.protocolFailure(ctx, err, "action", actionID)
	}
	a := res.Action
	if a == nil {
		if a, err = s.store.FindActionByID(ctx, ledger.ActionID(actionID)); err != nil {
			return err
		}
	}
	if res.Replayed {
		c.Response().Header().Set(HeaderIdempotentReplayed, "true")
	}
	// The arguments as recorded, not redacted: they are what the agent
	// proposed and a person approved, and what its tool must execute.
	return sendJSON(c, http.StatusCreated, BeginResponse{Attempt: attemptView(res.Attempt), AttemptToken: res.Token,
		DedupKey: a.DedupKey, Arguments: a.Arguments, ActionDigest: a.ActionDigest,
		LeaseRemainingS: seconds(res.LeaseRemaining)})
}

// seconds is a lease left as the wire gives it: seconds, to the
// millisecond, never negative.
func seconds(d time.Duration) float64 {
	return math.Round(max(d, 0).Seconds()*1000) / 1000
}

// attemptRequest is the common start of the attempt routes: the caller, a
// strict JSON body (optional with allowEmpty) with its required fields,
// and the attempt id of the path.
func (s *Server) attemptRequest(c echo.Context, req any, allowEmpty bool, required ...string) (engine.Caller, string, error) {
	caller, err := s.caller(c)
	if err != nil {
		return engine.Caller{}, "", err
	}
	body, err := s.readBody(c, allowEmpty)
	if err != nil {
		return engine.Caller{}, "", err
	}
	if body != nil {
		if err := decodeStrict(body, req, required...); err != nil {
			return engine.Caller{}, "", err
		}
	}
	id, err := pathID(c, "attempt_id", "attempt")
	if err != nil {
		return engine.Caller{}, "", err
	}
	return caller, id, nil
}

// heartbeatAttempt is POST /v1/attempts/{attempt_id}/heartbeat: the lease
// renewed, and whether the run's cancel was accepted.
func (s *Server) heartbeatAttempt(c echo.Context) error {
	var req HeartbeatRequest
	caller, id, err := s.attemptRequest(c, &req, false, "attempt_token")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	res, err := s.engine.Heartbeat(ctx, engine.HeartbeatParams{Caller: caller, AttemptID: ledger.AttemptID(id),
		Token: req.AttemptToken, Progress: req.Progress})
	if err != nil {
		return s.protocolFailure(ctx, err, "attempt", id)
	}
	return sendJSON(c, http.StatusOK, HeartbeatResponse{LeaseRemainingS: seconds(res.LeaseRemaining),
		CancelRequested: res.CancelRequested})
}

// completeAttempt is POST /v1/attempts/{attempt_id}/complete: the outcome
// recorded, answered with the attempt and its action.
func (s *Server) completeAttempt(c echo.Context) error {
	var req CompleteRequest
	caller, id, err := s.attemptRequest(c, &req, false, "attempt_token", "status")
	if err != nil {
		return err
	}
	if err := checkAttemptError("/error", req.Error); err != nil {
		return err
	}
	ctx := c.Request().Context()
	res, err := s.engine.Complete(ctx, engine.CompleteParams{Caller: caller, AttemptID: ledger.AttemptID(id),
		Token: req.AttemptToken, Outcome: engine.Outcome{Status: req.Status, Effect: req.Effect, Output: req.Output, Error: req.Error}})
	if err != nil {
		return s.protocolFailure(ctx, err, "attempt", id)
	}
	return s.sendCompleted(c, res)
}

// checkAttemptError refuses an error without its code.
func checkAttemptError(at string, e *ledger.AttemptError) error {
	if e != nil && e.Code == "" {
		return schemaViolation(at+"/code", "required, and not empty")
	}
	return nil
}

// sendCompleted answers a complete or an abandon: the attempt and its
// action as they stand.
func (s *Server) sendCompleted(c echo.Context, res engine.CompleteResult) error {
	v, err := s.loadAction(c.Request().Context(), res.Action)
	if err != nil {
		return err
	}
	return sendJSON(c, http.StatusOK, CompleteResponse{Attempt: attemptView(res.Attempt), Action: v})
}

// abandonAttempt is POST /v1/attempts/{attempt_id}/abandon with an
// optional {"reason"}: the attempt closed as uncertain, its effect
// unknown, for recovery to decide.
func (s *Server) abandonAttempt(c echo.Context) error {
	var req AbandonRequest
	caller, id, err := s.attemptRequest(c, &req, true)
	if err != nil {
		return err
	}
	if utf8.RuneCountInString(req.Reason) > MaxAbandonReasonLength {
		return schemaViolation("/reason", "longer than "+strconv.Itoa(MaxAbandonReasonLength)+" characters")
	}
	ctx := c.Request().Context()
	res, err := s.engine.Abandon(ctx, engine.AbandonParams{Caller: caller, AttemptID: ledger.AttemptID(id), Reason: req.Reason})
	if err != nil {
		return s.protocolFailure(ctx, err, "attempt", id)
	}
	return s.sendCompleted(c, res)
}

// postObservation is POST /v1/attempts/{attempt_id}/observations: what the
// agent's tool said about the dedup key, in answer to a query or cancel
// directive; 201 with the observation and the directives now.
func (s *Server) postObservation(c echo.Context) error {
	var req ObservationRequest
	caller, id, err := s.attemptRequest(c, &req, false, "decision_id", "kind")
	if err != nil {
		return err
	}
	if err := checkObservation(req); err != nil {
		return err
	}
	p := engine.ObserveParams{Caller: caller, AttemptID: ledger.AttemptID(id), DecisionID: req.DecisionID,
		Kind: engine.ObservationKind(req.Kind), Effect: req.Effect, Detail: req.Detail, Error: req.Error}
	if req.Confirmed != nil {
		p.Confirmed = *req.Confirmed
	}
	ctx := c.Request().Context()
	res, err := s.engine.Observe(ctx, p)
	if err != nil {
		return s.protocolFailure(ctx, err, "attempt", id)
	}
	obs, err := s.observationView(res.Observation)
	if err != nil {
		return err
	}
	return sendJSON(c, http.StatusCreated, ObservationResponse{Observation: obs, Next: directiveViews(res.Next)})
}

// checkObservation holds an observation to its schema: a known kind and
// effect; a query carries its effect or an error, a cancel its
// confirmation or an error, and neither carries the other's answer.
func checkObservation(req ObservationRequest) error {
	if req.DecisionID == "" {
		return schemaViolation("/decision_id", "must not be empty")
	}
	switch req.Effect {
	case "", ledger.EffectHappened, ledger.EffectNotHappened, ledger.EffectUnknown:
	default:
		return schemaViolation("/effect", "must be happened, not_happened or unknown")
	}
	if err := checkAttemptError("/error", req.Error); err != nil {
		return err
	}
	switch engine.ObservationKind(req.Kind) {
	case engine.ObserveQuery:
		if req.Confirmed != nil {
			return schemaViolation("/confirmed", "a query's answer is its effect")
		}
		if req.Effect == "" && req.Error == nil {
			return schemaViolation("/effect", "a query carries its effect, or the error the tool answered")
		}
	case engine.ObserveCancel:
		if req.Effect != "" {
			return schemaViolation("/effect", "a cancel's answer is confirmed")
		}
		if req.Confirmed == nil && req.Error == nil {
			return schemaViolation("/confirmed", "a cancel carries confirmed, or the error the tool answered")
		}
	default:
		return schemaViolation("/kind", "must be query or cancel")
	}
	return nil
}

// observationView shows an observation, its detail through the Redactor
// as event data is.
func (s *Server) observationView(o *ledger.Observation) (Observation, error) {
	if o == nil {
		return Observation{}, errors.New("observe: the engine answered no observation")
	}
	v := Observation{ID: o.ID, RunID: o.RunID, ActionID: o.ActionID, AttemptID: o.AttemptID, Source: o.Source,
		Effect: o.Effect, ObservedAt: o.ObservedAt}
	if len(o.Detail) > 0 {
		d, err := s.redactor.RedactEventData(&ledger.Event{RunID: o.RunID, Data: o.Detail})
		if err != nil {
			return Observation{}, err
		}
		v.Detail = d
	}
	return v, nil
}

// directiveViews shows directives; nil becomes an empty list.
func directiveViews(ds []engine.Directive) []Directive {
	out := make([]Directive, 0, len(ds))
	for _, d := range ds {
		v := Directive{Directive: string(d.Kind), DecisionID: d.DecisionID, ActionID: d.ActionID, AttemptID: d.AttemptID,
			Tool: d.Tool, DedupKey: d.DedupKey, StopReason: d.StopReason, Rationale: d.Rationale}
		if d.Kind == engine.DirectiveInFlight {
			left := seconds(d.LeaseRemaining)
			v.LeaseRemainingS = &left
		}
		out = append(out, v)
	}
	return out
}

// nextDirectives is GET /v1/runs/{run_id}/next: what the run's agent must
// do now, one directive per non-terminal action.
func (s *Server) nextDirectives(c echo.Context) error {
	caller, err := s.caller(c)
	if err != nil {
		return err
	}
	runID, err := pathID(c, "run_id", "run")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	res, err := s.engine.Next(ctx, caller, ledger.RunID(runID))
	if err != nil {
		return s.protocolFailure(ctx, err, "run", runID)
	}
	out := NextResponse{RunID: ledger.RunID(runID), Directives: directiveViews(res.Directives)}
	if res.Run != nil {
		out.RunID, out.RunState, out.StopReason = res.Run.ID, res.Run.State, res.Run.StopReason
	}
	return sendJSON(c, http.StatusOK, out)
}

// finishRun is POST /v1/runs/{run_id}/finish: the agent's loop is done;
// 200 with the run, ended (and the same for a replay).
func (s *Server) finishRun(c echo.Context) error {
	caller, err := s.caller(c)
	if err != nil {
		return err
	}
	body, err := s.readBody(c, false)
	if err != nil {
		return err
	}
	var req FinishRequest
	if err := decodeStrict(body, &req, "outcome"); err != nil {
		return err
	}
	if req.Outcome != "completed" && req.Outcome != "failed" {
		return schemaViolation("/outcome", "must be completed or failed")
	}
	if err := checkUsage("/usage", req.Usage); err != nil {
		return err
	}
	runID, err := pathID(c, "run_id", "run")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	run, err := s.engine.FinishRun(ctx, engine.FinishParams{Caller: caller, RunID: ledger.RunID(runID), Outcome: req.Outcome,
		StopReason: req.StopReason, Output: req.Output, Usage: engineUsage(req.Usage)})
	if err != nil {
		return s.protocolFailure(ctx, err, "run", runID)
	}
	v, err := s.loadRunView(ctx, run)
	if err != nil {
		return err
	}
	return sendJSON(c, http.StatusOK, v)
}

// protocolFailure turns an error of an engine protocol step into its
// answer: a *engine.ProtocolError becomes the problem of its code with
// its extension members (the recorded action, the recorded outcome, the
// stop reason, the arguments' failures under /arguments); not_found
// becomes the one 404 of the path's object, whatever the engine could not
// find or would not show.
func (s *Server) protocolFailure(ctx context.Context, err error, kind, id string) error {
	var pe *engine.ProtocolError
	if !errors.As(err, &pe) {
		if ledger.Code(err) == ledger.CodeNotFound {
			return notFound(kind, id)
		}
		return err
	}
	ae := &apiError{code: pe.Code, detail: pe.Message, err: err}
	if pe.Code == engine.CodePendingCap {
		ae.header = retryAfter(PendingApprovalsRetryAfter)
	}
	ae.ext.StopReason = pe.StopReason
	for _, is := range pe.Issues {
		ae.fields = append(ae.fields, FieldError{Location: "/arguments" + is.Location, Message: is.Message})
	}
	if pe.Action != nil {
		v, verr := s.loadAction(ctx, pe.Action)
		if verr != nil {
			return verr
		}
		ae.ext.Action = &v
	}
	if r := pe.Recorded; r != nil {
		ae.ext.Recorded = &Outcome{Status: r.Status, Effect: r.Effect, Output: r.Output, Error: r.Error}
	}
	return ae
}

// encodeLine is v as one line of JSON, HTML characters not escaped (as
// writeJSON sends it).
func encodeLine(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
