package httpupstream

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// Paths of the routes.
const (
	PathCardsWrite  = "/" + simulator.CardsWriteTool
	PathCardsQuery  = PathCardsWrite + "/query"
	PathCardsCancel = PathCardsWrite + "/cancel"
	PathCardsCount  = "/" + simulator.CardsCountTool
)

// Error codes of the server's own, beside the simulator's (such as
// simulator.CodeFenced).
const (
	// CodeInvalidRequest: the body is not a request of the contract;
	// nothing was done (400, effect not_happened).
	CodeInvalidRequest = "invalid_request"
	// CodeUnauthorized: the bearer token is missing or wrong; nothing was
	// done (401, effect not_happened).
	CodeUnauthorized = "unauthorized"
	// CodeContextEnded: the request's context ended (the caller gave up
	// or went away) before the tool answered (504, effect unknown).
	CodeContextEnded = "context_ended"
	// CodeToolFailure: the tool failed otherwise, for instance its effect
	// store did (500, effect unknown).
	CodeToolFailure = "tool_failure"
	// CodeUnsupported: the tool's guarantees, as configured, do not allow
	// a query or a cancel (501).
	CodeUnsupported = "unsupported"
)

// MaxRequestBytes caps a request's body.
const MaxRequestBytes = 1 << 20

// Options configure the server.
type Options struct {
	// Token, if set, is the bearer token every request must carry.
	Token string
}

type server struct {
	write *simulator.Tool
	count *simulator.Tool
	opts  Options
}

// New returns the handler of the routes (doc.go) over the simulator's
// cards.write and cards.count, keeping their effects in store, configured
// and faulted as cfg says under the simulator's tool names. A cfg that
// fails Validate is an error.
func New(store *simulator.EffectStore, cfg simulator.Config, opts Options) (http.Handler, error) {
	if store == nil {
		return nil, errors.New("httpupstream: no effect store")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("httpupstream: %w", err)
	}
	s := &server{
		write: simulator.NewTool(simulator.CardsWriteDescriptor(), store, toolConfig(cfg, simulator.CardsWriteTool)),
		count: simulator.NewTool(simulator.CardsCountDescriptor(), store, toolConfig(cfg, simulator.CardsCountTool)),
		opts:  opts,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+PathCardsWrite, s.execute(s.write))
	mux.HandleFunc("POST "+PathCardsCount, s.execute(s.count))
	mux.HandleFunc("POST "+PathCardsQuery, s.query)
	mux.HandleFunc("POST "+PathCardsCancel, s.cancel)
	return s.authorize(mux), nil
}

// toolConfig is cfg's config of the simulator's tool name, with cfg's crash
// function where the tool sets none.
func toolConfig(cfg simulator.Config, name string) simulator.ToolConfig {
	tc := cfg.Tools[name]
	if tc.CrashFunc == nil {
		tc.CrashFunc = cfg.CrashFunc
	}
	return tc
}

// authorize refuses a request without the bearer token, if there is one.
func (s *server) authorize(next http.Handler) http.Handler {
	if s.opts.Token == "" {
		return next
	}
	want := []byte("Bearer " + s.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeJSON(w, http.StatusUnauthorized, callAnswer{Status: "failed", Effect: ledger.EffectNotHappened,
				Error: &answerError{Code: CodeUnauthorized, Message: "a bearer token is required"}})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// callRequest is a call as the executor sends it.
type callRequest struct {
	Tool         string          `json:"tool"`
	ToolVersion  string          `json:"tool_version"`
	Arguments    json.RawMessage `json:"arguments"`
	DedupKey     string          `json:"dedup_key"`
	FencingToken int64           `json:"fencing_token"`
	RunID        string          `json:"run_id"`
	ActionID     string          `json:"action_id"`
	AttemptID    string          `json:"attempt_id"`
	Attempt      int64           `json:"attempt"`
}

// callAnswer is the answer to a call.
type callAnswer struct {
	Status string            `json:"status"`
	Effect ledger.EffectFact `json:"effect"`
	Output json.RawMessage   `json:"output,omitempty"`
	Error  *answerError      `json:"error,omitempty"`
}

type answerError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// keyRequest is a query or a cancel.
type keyRequest struct {
	DedupKey string `json:"dedup_key"`
}

type queryAnswer struct {
	Effect ledger.EffectFact `json:"effect"`
	Output json.RawMessage   `json:"output,omitempty"`
}

type cancelAnswer struct {
	Confirmed bool            `json:"confirmed"`
	Detail    json.RawMessage `json:"detail,omitempty"`
}

// problem is the body of an answer to a query or cancel that has none.
type problem struct {
	Error answerError `json:"error"`
}

// execute serves a call of tool.
func (s *server) execute(tool *simulator.Tool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req callRequest
		if err := decode(w, r, &req); err != nil || req.DedupKey == "" || len(req.Arguments) == 0 {
			msg := "dedup_key and arguments are required"
			if err != nil {
				msg = err.Error()
			}
			writeJSON(w, http.StatusBadRequest, callAnswer{Status: "failed", Effect: ledger.EffectNotHappened,
				Error: &answerError{Code: CodeInvalidRequest, Message: msg}})
			return
		}
		run := req.RunID
		if run == "" {
			run, _, _ = strings.Cut(req.DedupKey, "/")
		}
		res, err := tool.Execute(r.Context(), engine.Call{RunID: ledger.RunID(run), ActionID: ledger.ActionID(req.ActionID),
			Attempt: req.Attempt, AttemptID: ledger.AttemptID(req.AttemptID), DedupKey: req.DedupKey,
			FencingToken: req.FencingToken, Arguments: req.Arguments})
		if err != nil {
			status, ans := failure(err)
			writeJSON(w, status, ans)
			return
		}
		writeJSON(w, http.StatusOK, callAnswer{Status: "succeeded", Effect: res.Effect, Output: res.Output})
	}
}

// failure is the status and answer of a call that failed.
func failure(err error) (int, callAnswer) {
	var te *engine.ToolError
	switch {
	case errors.As(err, &te):
		status := http.StatusUnprocessableEntity
		switch te.Code {
		case simulator.CodeFenced, simulator.CodeCancelled:
			status = http.StatusConflict
		case simulator.CodeInvalidArguments:
			status = http.StatusBadRequest
		}
		return status, callAnswer{Status: "failed", Effect: te.Effect, Error: &answerError{Code: te.Code, Message: te.Message}}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return http.StatusGatewayTimeout, callAnswer{Status: "failed", Effect: ledger.EffectUnknown,
			Error: &answerError{Code: CodeContextEnded, Message: err.Error()}}
	default:
		return http.StatusInternalServerError, callAnswer{Status: "failed", Effect: ledger.EffectUnknown,
			Error: &answerError{Code: CodeToolFailure, Message: err.Error()}}
	}
}

// query serves cards.write's Query.
func (s *server) query(w http.ResponseWriter, r *http.Request) {
	key, ok := dedupKey(w, r)
	if !ok {
		return
	}
	res, err := s.write.Query(r.Context(), key)
	if err != nil {
		probeFailure(w, err)
		return
	}
	writeJSON(w, http.StatusOK, queryAnswer{Effect: res.Effect, Output: res.Output})
}

// cancel serves cards.write's Cancel.
func (s *server) cancel(w http.ResponseWriter, r *http.Request) {
	key, ok := dedupKey(w, r)
	if !ok {
		return
	}
	res, err := s.write.Cancel(r.Context(), key)
	if err != nil {
		probeFailure(w, err)
		return
	}
	writeJSON(w, http.StatusOK, cancelAnswer{Confirmed: res.Confirmed, Detail: res.Detail})
}

// dedupKey reads a query's or a cancel's key, answering 400 if there is
// none.
func dedupKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	var req keyRequest
	if err := decode(w, r, &req); err != nil || req.DedupKey == "" {
		msg := "dedup_key is required"
		if err != nil {
			msg = err.Error()
		}
		writeJSON(w, http.StatusBadRequest, problem{Error: answerError{Code: CodeInvalidRequest, Message: msg}})
		return "", false
	}
	return req.DedupKey, true
}

// probeFailure answers a query or cancel that failed: with no answer, so
// the executor reports an error and recovery asks again or a person.
func probeFailure(w http.ResponseWriter, err error) {
	var te *engine.ToolError
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		writeJSON(w, http.StatusNotImplemented, problem{Error: answerError{Code: CodeUnsupported, Message: err.Error()}})
	case errors.As(err, &te):
		writeJSON(w, http.StatusServiceUnavailable, problem{Error: answerError{Code: te.Code, Message: te.Message}})
	default:
		writeJSON(w, http.StatusInternalServerError, problem{Error: answerError{Code: CodeToolFailure, Message: err.Error()}})
	}
}

// decode reads one JSON object of out's fields, and nothing else, from a
// body of at most MaxRequestBytes.
func decode(w http.ResponseWriter, r *http.Request, out any) error {
	d := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	d.DisallowUnknownFields()
	if err := d.Decode(out); err != nil {
		return fmt.Errorf("body: %w", err)
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return errors.New("body: data after the object")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}
