package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// fuzzMaxBody is the body limit of the request fuzz targets: small, so
// that the fuzzer reaches it.
const fuzzMaxBody = 2048

// bodyKind is which endpoint's body a request fuzz input is.
type bodyKind int

const (
	bodySubmit   bodyKind = iota // POST /v1/runs
	bodyDecision                 // POST /v1/actions/{id}/approve and deny
	bodyResolve                  // POST /v1/actions/{id}/resolve
	bodyCancel                   // POST /v1/runs/{id}/cancel (body optional)
	bodyKinds
)

// decodeRequest reads and decodes a body as the handler of kind does
// (submitRun, decide, resolve, cancelRun: readBody, then the schema or
// decodeStrict with the handler's required field), up to the first thing
// that needs the store.
func decodeRequest(s *Server, c echo.Context, kind bodyKind) (any, error) {
	switch kind {
	case bodySubmit:
		body, err := s.readBody(c, false)
		if err != nil {
			return nil, err
		}
		if err := contracts.Validate(contracts.SchemaRunSubmission, body); err != nil {
			return nil, submissionError(err)
		}
		var req SubmitRequest
		return &req, decodeStrict(body, &req)
	case bodyDecision:
		body, err := s.readBody(c, false)
		if err != nil {
			return nil, err
		}
		var req DecisionRequest
		return &req, decodeStrict(body, &req, "action_digest")
	case bodyResolve:
		body, err := s.readBody(c, false)
		if err != nil {
			return nil, err
		}
		var req ResolveRequest
		return &req, decodeStrict(body, &req, "outcome")
	default:
		body, err := s.readBody(c, true)
		if err != nil || body == nil {
			return &CancelRequest{}, err
		}
		var req CancelRequest
		return &req, decodeStrict(body, &req)
	}
}

// newFuzzContext is a POST with body and Content-Type ct (none if empty);
// chunked sends it with an unknown length, as a chunked request arrives.
func newFuzzContext(ct string, body []byte, chunked bool) echo.Context {
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	if ct != "" {
		req.Header.Set(echo.HeaderContentType, ct)
	}
	if chunked {
		req.ContentLength = -1
	}
	return echo.New().NewContext(req, httptest.NewRecorder())
}

func fuzzServer() *Server {
	return &Server{maxBody: fuzzMaxBody, log: slog.New(slog.DiscardHandler)}
}

// requireClientError checks that err is answered as a client's mistake: a
// 4xx problem with a code of the table and a detail, never a 5xx.
func requireClientError(t *testing.T, s *Server, err error) Problem {
	t.Helper()
	p, _ := s.toProblem(context.Background(), err)
	require.True(t, p.Status >= 400 && p.Status < 500, "%v is answered %d %s", err, p.Status, p.Code)
	_, known := problems[p.Code]
	require.True(t, known, "code %q", p.Code)
	require.NotEmpty(t, p.Detail)
	for _, fe := range p.Errors {
		require.NotEmpty(t, fe.Message, "field error at %q without a message", fe.Location)
	}
	return p
}

// FuzzRequestBody: every request body the API decodes. A refusal is a 4xx
// problem with a code and a detail; a body over the limit is never
// accepted; an accepted body is application/json, passes ledger.CheckJSON
// (no duplicate key, depth 32 at most) and round-trips (decode, encode,
// decode gives the same request).
func FuzzRequestBody(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("..", "contracts", "testdata", "run_submission*.json"))
	require.NoError(f, err)
	for _, name := range files {
		b, err := os.ReadFile(name)
		require.NoError(f, err)
		f.Add(uint8(bodySubmit), "application/json", b)
	}
	digest := `"sha256:` + strings.Repeat("0", 64) + `"`
	for _, s := range []struct {
		kind bodyKind
		ct   string
		body string
	}{
		{bodySubmit, "application/json; charset=UTF-8", `{"agent":"practice-cards","input":{"title":"t","markdown":"m"},"budgets":{"max_execution_ms":1000,"deadline_ms":2000}}`},
		{bodySubmit, "application/json", `{"agent":"practice-cards","agent":"x","input":{}}`},
		{bodySubmit, "application/json", `{"agent":"practice-cards","input":{},"state":"completed"}`},
		{bodySubmit, "application/json", `{"agent":"practice-cards","input":{},"budgets":{"max_steps":5.0}}`},
		{bodySubmit, "application/json", `{"schema_version":"2.0","agent":"practice-cards","input":{}}`},
		{bodySubmit, "text/plain", `{}`},
		{bodySubmit, "application/json", ` `},
		{bodySubmit, "application/json", `{"agent":"practice-cards","input":{}} {}`},
		{bodyDecision, "application/json", `{"action_digest":` + digest + `,"reason":"ok"}`},
		{bodyDecision, "application/json", `{"reason":"ok"}`},
		{bodyDecision, "application/json", `{"action_digest":5}`},
		{bodyDecision, "application/json", `{"action_digest":` + digest + `,"extra":1}`},
		{bodyResolve, "application/json", `{"outcome":"happened","note":"checked"}`},
		{bodyResolve, "application/json", `{"note":"n"}`},
		{bodyResolve, "application/json", `{"outcome":"happened","Outcome":"abandon"}`},
		{bodyCancel, "", ``},
		{bodyCancel, "application/json", `{"reason":"` + strings.Repeat("é", 1001) + `"}`},
		{bodyCancel, "application/json", `{"reason":"stop"}`},
		{bodyCancel, "application/json", `null`},
	} {
		f.Add(uint8(s.kind), s.ct, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, which uint8, ct string, body []byte) {
		kind, chunked := bodyKind(which%uint8(bodyKinds)), which&0x80 != 0
		s := fuzzServer()
		req, err := decodeRequest(s, newFuzzContext(ct, body, chunked), kind)
		if err != nil {
			p := requireClientError(t, s, err)
			if len(body) > fuzzMaxBody && jsonMediaType(ct) {
				require.Equal(t, CodePayloadTooLarge, p.Code)
			}
			return
		}
		if kind == bodyCancel && len(body) == 0 {
			return // no body: nothing decoded
		}
		require.LessOrEqual(t, len(body), fuzzMaxBody, "a body over the limit was accepted")
		require.True(t, jsonMediaType(ct), "accepted a body sent as %q", ct)
		require.NoError(t, ledger.CheckJSON(body))
		if sub, ok := req.(*SubmitRequest); ok {
			l := budgetLimits(sub.Budgets)
			for _, v := range []int64{l.MaxAttemptsPerAction, l.MaxAttemptsPerRun, int64(l.MaxExecution), l.MaxSteps, l.MaxTokens, int64(l.DeadlineAfter)} {
				require.GreaterOrEqual(t, v, int64(0), "budgets %+v", l)
			}
		}
		again, err := json.Marshal(req)
		require.NoError(t, err)
		if len(again) > fuzzMaxBody {
			return // the encoder escapes more than the client did
		}
		back, err := decodeRequest(s, newFuzzContext("application/json", again, false), kind)
		require.NoError(t, err, "%s decoded, encoded as %s and refused", body, again)
		if sub, ok := req.(*SubmitRequest); ok {
			b := back.(*SubmitRequest)
			require.True(t, sameJSON(t, sub.Input, b.Input), "input %s came back as %s", sub.Input, b.Input)
			sub.Input, b.Input = nil, nil
		}
		require.Equal(t, req, back)
	})
}

// sameJSON reports whether two raw documents hold the same value, however
// each is spelled (encoding/json writes & as \u0026, for one).
func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	decode := func(raw json.RawMessage) any {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		require.NoError(t, dec.Decode(&v))
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}

// printableASCII is the reference for an Idempotency-Key: 1 to 255 bytes,
// each a printable ASCII character (space to tilde).
func printableASCII(k string) bool {
	if len(k) == 0 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// FuzzIdempotencyKey: the Idempotency-Key header parser takes exactly one
// header of 1–255 printable ASCII characters, agrees with the ledger's own
// check, and refuses everything else with idempotency_key_invalid (400).
func FuzzIdempotencyKey(f *testing.F) {
	for _, k := range []string{"k-1", " ", "~", "", strings.Repeat("x", 255), strings.Repeat("x", 256), "é", "a\tb", "a\x7f", "\x00"} {
		f.Add(k, "", uint8(1))
	}
	f.Add("a", "a", uint8(2))
	f.Add("", "", uint8(0))
	f.Fuzz(func(t *testing.T, first, second string, n uint8) {
		r := httptest.NewRequest(http.MethodPost, "/v1/runs", nil)
		vals := []string{first, second}[:n%3]
		if n%3 == 0 {
			vals = nil
		}
		if vals != nil {
			r.Header[HeaderIdempotencyKey] = vals
		}
		require.Equal(t, printableASCII(first), ledger.ValidIdempotencyKey(first), "the ledger's check of %q", first)
		key, err := idempotencyKey(r)
		want := len(vals) == 1 && printableASCII(first)
		if !want {
			require.Error(t, err, "accepted %q", vals)
			p := requireClientError(t, fuzzServer(), err)
			require.Equal(t, CodeIdempotencyKeyInvalid, p.Code)
			require.Equal(t, http.StatusBadRequest, p.Status)
			return
		}
		require.NoError(t, err)
		require.Equal(t, first, key)
	})
}
