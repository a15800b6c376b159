package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/server/servertest"
)

func TestHealth(t *testing.T) {
	t.Parallel()
	t.Run("Healthz", func(t *testing.T) {
		e := newEnv(t, options{})
		res := e.get(t, "", "/healthz")
		require.Equal(t, http.StatusOK, res.Status)
		require.JSONEq(t, `{"status":"ok"}`, string(res.Body))
	})
	t.Run("Readyz", func(t *testing.T) {
		e := newEnv(t, options{})
		res := e.get(t, "", "/readyz")
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		require.JSONEq(t, `{"status":"ready","leases":{"held":0}}`, string(res.Body), "no claim made yet")
		_, err := e.engine.AdvanceRunnable(t.Context())
		require.NoError(t, err)
		var st server.Status
		require.NoError(t, json.Unmarshal(e.get(t, "", "/readyz").Body, &st))
		require.NotNil(t, st.Leases)
		require.NotNil(t, st.Leases.LastClaim, "the claim is reported")
	})
	t.Run("ErrLeaseLoop", func(t *testing.T) {
		full := &failingClaims{}
		e := newEnv(t, options{engineStore: func(s ledger.Store) ledger.Store { full.Store = s; return full }})
		full.fail.Store(true)
		_, err := e.engine.AdvanceRunnable(t.Context())
		require.Error(t, err)
		p := requireProblem(t, e.get(t, "", "/readyz"), http.StatusServiceUnavailable, server.CodeNotReady)
		require.NotContains(t, p.Detail, "disk", "causes go to the log")
		full.fail.Store(false)
		_, err = e.engine.AdvanceRunnable(t.Context())
		require.NoError(t, err)
		res := e.get(t, "", "/readyz")
		require.Equal(t, http.StatusOK, res.Status, "ready again once a claim succeeds: %s", res.Body)
	})
	t.Run("ErrNotReady", func(t *testing.T) {
		e := newEnv(t, options{config: func(c *server.Config) {
			c.ReadyFunc = func(context.Context) error { return errors.New("disk /secret/path gone") }
		}})
		p := requireProblem(t, e.get(t, "", "/readyz"), http.StatusServiceUnavailable, server.CodeNotReady)
		require.NotContains(t, p.Detail, "/secret/path", "causes go to the log")
	})
	t.Run("ErrStoreClosed", func(t *testing.T) {
		e := newEnv(t, options{})
		require.NoError(t, e.Store.Close())
		requireProblem(t, e.get(t, "", "/readyz"), http.StatusServiceUnavailable, server.CodeNotReady)
		// Every other failing read is a 500 whose detail says nothing.
		p := requireProblem(t, e.get(t, "bob", "/v1/runs"), http.StatusInternalServerError, "internal")
		require.Equal(t, "internal error", p.Detail)
	})
}

// failingClaims fails the engine's claims of runs while fail is set, with
// a code the store's health does not count as a failure, so that only the
// lease loop can say not ready.
type failingClaims struct {
	ledger.Store
	fail atomic.Bool
}

func (s *failingClaims) ClaimRuns(ctx context.Context, p ledger.ClaimRunsParams) ([]ledger.RunLease, error) {
	if s.fail.Load() {
		return nil, ledger.Errorf(ledger.CodeConflict, "claim runs: disk on fire")
	}
	return s.Store.ClaimRuns(ctx, p)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := newEnv(t, options{config: func(c *server.Config) { c.Registry = reg }})
	_, a := e.awaiting(t, "alice", "k1")
	e.get(t, "bob", "/v1/actions/"+string(a.ID))
	e.get(t, "", "/nowhere/"+strings.Repeat("x", 10))
	e.srv.RecoveryDecisions().WithLabelValues("review").Inc()

	res := e.get(t, "", "/metrics")
	require.Equal(t, http.StatusOK, res.Status)
	body := string(res.Body)
	for _, want := range []string{
		`ledger_http_requests_total{code="201",method="POST",route="/v1/runs"} 1`,
		`ledger_http_requests_total{code="200",method="GET",route="/v1/actions/:action_id"} 1`,
		`ledger_http_requests_total{code="404",method="GET",route="unmatched"} 1`,
		`ledger_http_request_duration_seconds_bucket{method="POST",route="/v1/runs",le="+Inf"} 1`,
		`ledger_runs{state="awaiting_approval"} 1`,
		`ledger_runs{state="completed"} 0`,
		`ledger_approvals_waiting 1`,
		`ledger_attempts{effect="unknown",status="started"} 0`,
		`ledger_recovery_decisions_total{decision="review"} 1`,
	} {
		require.Contains(t, body, want)
	}
	require.NotContains(t, body, "nowhere", "raw paths never become labels")
	require.NotContains(t, body, e.tokens["bob"])

	// A second server on the same registry is a wiring error, not a panic.
	_, err := server.New(server.Config{Store: e.Store, Engine: e.engine, Approvals: e.approvals, Registry: reg})
	require.Error(t, err)
}

func TestUnknownRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	t.Run("NotFound", func(t *testing.T) {
		for _, p := range []string{"/", "/v1", "/v2/runs", "/v1/runs/x/y/z", "/v1/nope"} {
			requireProblem(t, e.get(t, "", p), http.StatusNotFound, server.CodeRouteNotFound)
		}
	})
	t.Run("MethodNotAllowed", func(t *testing.T) {
		for _, tc := range []struct{ method, path string }{
			{http.MethodDelete, "/v1/runs"},
			{http.MethodPut, "/v1/runs/run_x"},
			{http.MethodGet, "/v1/runs/run_x/cancel"},
			{http.MethodPost, "/healthz"},
		} {
			res := e.send(t, request{principal: "bob", method: tc.method, path: tc.path})
			requireProblem(t, res, http.StatusMethodNotAllowed, server.CodeMethodNotAllowed)
			require.NotEmpty(t, res.Header.Get("Allow"))
		}
	})
}

func TestProblemTable(t *testing.T) {
	t.Parallel()
	for code, status := range map[string]int{
		"invalid": 400, "not_found": 404, "conflict": 409, "forbidden": 403, "approval_required": 409,
		"budget_exceeded": 409, "unsupported_version": 500, "internal": 500,
		server.CodeUnauthorized: 401, server.CodePayloadTooLarge: 413, server.CodeUnsupportedMediaType: 415,
		server.CodeIdempotencyKeyInvalid: 400, server.CodeIdempotencyKeyReused: 422, server.CodeRequestInProgress: 409,
		server.CodeInvalidJSON: 400, server.CodeSchemaViolation: 400, server.CodeNotImplemented: 501,
		server.CodeMethodNotAllowed: 405, server.CodeRouteNotFound: 404, server.CodeNotReady: 503,
		server.CodeRateLimited: 429,
		"no_such_code":         500,
	} {
		require.Equal(t, status, server.StatusOf(code), code)
	}
}

// TestOpenAPI holds the document and the router equal: every served route
// is documented and every documented operation is served.
func TestOpenAPI(t *testing.T) {
	t.Parallel()
	// With an MCP gateway, so that /mcp is served too (its upstream is
	// never reached: the lock file confirms no tool).
	gw, err := mcpgw.New(mcpgw.Options{Dir: t.TempDir(), Config: &contracts.ConfigMCP{Upstreams: []contracts.ConfigUpstream{{
		Name: "nowhere", URL: "http://127.0.0.1:1/mcp"}}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = gw.Close() })
	e := newEnv(t, options{config: func(c *server.Config) { c.MCP, c.MCPAgent = gw, contracts.DefaultMCPAgent }})
	res := e.get(t, "", "/v1/openapi.json")
	require.Equal(t, http.StatusOK, res.Status)
	require.Equal(t, "application/json", res.Header.Get("Content-Type"))
	var doc struct {
		OpenAPI    string                               `json:"openapi"`
		Paths      map[string]map[string]map[string]any `json:"paths"`
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(res.Body, &doc))
	require.Equal(t, "3.1.0", doc.OpenAPI)

	var documented []string
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if method == "parameters" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+path)
			require.NotEmpty(t, op["operationId"], path)
			require.NotEmpty(t, op["responses"], path)
		}
	}
	var served []string
	for _, r := range e.srv.RouteTable() {
		served = append(served, r[0]+" "+r[1])
	}
	slices.Sort(documented)
	slices.Sort(served)
	require.Equal(t, served, documented)
	require.Len(t, served, 45, "30 operations (four of the MCP gateway) and a HEAD for each of the 15 GETs but /mcp's")

	// The submission schema is the contracts' own.
	var sub, want map[string]any
	require.NoError(t, json.Unmarshal(doc.Components.Schemas["RunSubmission"], &sub))
	require.NoError(t, json.Unmarshal(contracts.SchemaJSON(contracts.SchemaRunSubmission), &want))
	delete(want, "$id")
	delete(want, "$schema")
	require.Equal(t, want, sub)

	// Every $ref points at something in the document.
	var walk func(v any)
	var whole map[string]any
	require.NoError(t, json.Unmarshal(res.Body, &whole))
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				parts := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
				var node any = whole
				for _, p := range parts {
					m, ok := node.(map[string]any)
					require.True(t, ok, ref)
					node, ok = m[p]
					require.True(t, ok, "dangling %s", ref)
				}
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(whole)
}

func TestKeyedRedactor(t *testing.T) {
	t.Parallel()
	r, err := redact.NewRedactor([]byte("server-test-key-0123456789abcdef"))
	require.NoError(t, err)
	desc := contracts.ToolDescriptor{Name: "t", SecretPaths: []string{"/a/b"}}
	kr := server.KeyedRedactor{Redactor: r, Tools: func(name string) (contracts.ToolDescriptor, bool) { return desc, name == "t" }}
	doc := json.RawMessage(`{"a":{"b":"secret","c":"Bearer abcdefghijklmnop"},"d":"plain"}`)
	got, err := kr.RedactArguments("t", doc)
	require.NoError(t, err)
	require.JSONEq(t, `{"a":{"b":"`+r.Marker("secret")+`","c":"Bearer `+r.Marker("abcdefghijklmnop")+`"},"d":"plain"}`, string(got))

	t.Run("UnknownToolIsRedactedWhole", func(t *testing.T) {
		got, err := kr.RedactArguments("gone.tool", doc)
		require.NoError(t, err)
		require.Regexp(t, `^"\[redacted:[0-9a-f]{8}\]"$`, string(got))
	})
	t.Run("MalformedArgumentsFail", func(t *testing.T) {
		_, err := kr.RedactArguments("t", json.RawMessage(`{"a":`))
		require.ErrorIs(t, err, redact.ErrRedaction)
	})
}

// TestOpenAPIDocument checks what the served document promises clients:
// it is valid OpenAPI (examples included), names its license and contact,
// has a relative server, tags every operation, gives every operation the
// default problem answer and every authenticated one the 429, has
// examples for the bodies that matter, references the evidence report's
// schema, and leaves the submitted input open to any object.
func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	res := e.get(t, "", "/v1/openapi.json")
	require.Equal(t, http.StatusOK, res.Status)
	v, err := servertest.NewValidator(context.Background(), res.Body) // loads and validates it
	require.NoError(t, err)

	var doc struct {
		OpenAPI string `json:"openapi"`
		Info    struct {
			License struct{ Name string }      `json:"license"`
			Contact struct{ Name, URL string } `json:"contact"`
		} `json:"info"`
		Servers []struct{ URL string }  `json:"servers"`
		Tags    []struct{ Name string } `json:"tags"`
		Paths   map[string]map[string]struct {
			OperationID string   `json:"operationId"`
			Tags        []string `json:"tags"`
			Security    *[]any   `json:"security"`
			RequestBody *struct {
				Content map[string]struct {
					Examples map[string]any `json:"examples"`
				} `json:"content"`
			} `json:"requestBody"`
			Responses map[string]struct {
				Ref     string `json:"$ref"`
				Content map[string]struct {
					Schema   map[string]any `json:"schema"`
					Examples map[string]any `json:"examples"`
				} `json:"content"`
				Headers map[string]any `json:"headers"`
			} `json:"responses"`
		} `json:"paths"`
		Components struct {
			Schemas   map[string]json.RawMessage `json:"schemas"`
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(res.Body, &doc))
	require.Equal(t, "3.1.0", doc.OpenAPI)
	require.NotEmpty(t, doc.Info.License.Name)
	require.NotEmpty(t, doc.Info.Contact.Name)
	require.NotEmpty(t, doc.Info.Contact.URL)
	require.Equal(t, "/", doc.Servers[0].URL, "relative: the document is right on any address")
	require.NotContains(t, string(res.Body), "DESIGN.md")

	var tags []string
	for _, tg := range doc.Tags {
		tags = append(tags, tg.Name)
	}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			name := strings.ToUpper(method) + " " + path
			require.Len(t, op.Tags, 1, name)
			require.Contains(t, tags, op.Tags[0], name)
			authenticated := op.Security == nil // the document's bearer security applies
			require.Equal(t, authenticated, strings.HasPrefix(path, "/v1/") && path != "/v1/openapi.json" || path == "/mcp", name)
			if method == "head" { // the GET's answers without content, resolved
				require.Contains(t, op.Responses, "default", name)
				if authenticated {
					require.Contains(t, op.Responses["429"].Headers, "Retry-After", name)
				}
			} else {
				require.Equal(t, "#/components/responses/Default", op.Responses["default"].Ref, name)
				if authenticated {
					require.Equal(t, "#/components/responses/TooManyRequests", op.Responses["429"].Ref, name)
				}
			}
			for status, r := range op.Responses {
				if r.Ref == "" {
					require.Contains(t, r.Headers, server.HeaderRequestID, "%s %s", name, status)
				}
			}
			if method == "head" {
				continue
			}
			if op.RequestBody != nil {
				require.NotEmpty(t, op.RequestBody.Content["application/json"].Examples, name)
			}
			for status, r := range op.Responses {
				if js, ok := r.Content["application/json"]; ok && status[0] == '2' && path != "/metrics" &&
					path != "/v1/openapi.json" && !strings.HasSuffix(path, "/evidence") {
					require.NotEmpty(t, js.Examples, "%s %s", name, status)
				}
			}
		}
	}
	ev := doc.Paths["/v1/runs/{run_id}/evidence"]["get"].Responses["200"].Content
	require.Equal(t, "#/components/schemas/EvidenceReport", ev["application/json"].Schema["$ref"])
	require.Contains(t, ev, "text/markdown")
	require.Contains(t, ev, "text/html")
	require.Contains(t, doc.Components.Schemas, "EvidenceReport.action", "the report's $defs are components")

	t.Run("InputOpenToAnyObject", func(t *testing.T) {
		for _, input := range []string{`{}`, `{"title":"t","markdown":"m"}`,
			`{"anything":{"nested":[1,"x",null,{"deep":true}]},"n":3.5}`} {
			require.NoError(t, v.CheckSchema("RunSubmission", []byte(`{"agent":"practice-cards","input":`+input+`}`)), input)
		}
		for _, input := range []string{`"text"`, `[1]`, `null`, `3`} {
			require.Error(t, v.CheckSchema("RunSubmission", []byte(`{"agent":"practice-cards","input":`+input+`}`)), input)
		}
		require.Error(t, v.CheckSchema("RunSubmission", []byte(`{"agent":"practice-cards","input":{},"state":"completed"}`)),
			"server-owned fields stay refused")
	})
}
