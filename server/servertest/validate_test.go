package servertest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/server/servertest"
)

// document is a small OpenAPI 3.1 document in the shape of the server's.
const document = `{
  "openapi": "3.1.0",
  "info": {"title": "t", "version": "1"},
  "servers": [{"url": "/"}],
  "paths": {
    "/v1/openapi.json": {"get": {"operationId": "doc", "responses": {"200": {"description": "this",
      "content": {"application/json": {"schema": {"type": "object"}}}}}}},
    "/things/{id}": {
      "get": {
        "operationId": "getThing",
        "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
        "responses": {
          "200": {"description": "a thing",
            "headers": {"X-Count": {"schema": {"type": "integer"}}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}},
          "204": {"description": "nothing"},
          "404": {"$ref": "#/components/responses/Default"},
          "default": {"$ref": "#/components/responses/Default"}
        }
      },
      "head": {
        "operationId": "headThing",
        "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
        "responses": {"200": {"description": "a thing"}, "default": {"$ref": "#/components/responses/Default"}}
      }
    }
  },
  "components": {
    "responses": {
      "Default": {"description": "a problem",
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}
    },
    "schemas": {
      "Thing": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}},
        "additionalProperties": false},
      "Problem": {"type": "object", "required": ["code", "status"],
        "properties": {"code": {"type": "string"}, "status": {"type": "integer"}}}
    }
  }
}`

// answer is what the fake server sends for one request.
type answer struct {
	status      int
	contentType string
	header      map[string]string
	body        string
}

// fake serves the document and, for anything else, the answer set for the
// test case.
func fake(a answer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == servertest.DocumentPath {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(document))
			return
		}
		if a.contentType != "" {
			w.Header().Set("Content-Type", a.contentType)
		}
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(a.status)
		if r.Method != http.MethodHead {
			_, _ = w.Write([]byte(a.body))
		}
	})
}

func TestCheck(t *testing.T) {
	ctx := context.Background()
	good := answer{status: 200, contentType: "application/json", body: `{"id":"t1"}`}
	problem := answer{status: 404, contentType: "application/problem+json", body: `{"code":"route_not_found","status":404}`}
	for _, tc := range []struct {
		name         string
		method, path string
		answer       answer
		wantErr      string // "" means the answer is described
	}{
		{"OK", http.MethodGet, "/things/t1", good, ""},
		{"OKNoContent", http.MethodGet, "/things/t1", answer{status: 204}, ""},
		{"OKHeader", http.MethodGet, "/things/t1", answer{status: 200, contentType: "application/json",
			header: map[string]string{"X-Count": "3"}, body: `{"id":"t1"}`}, ""},
		{"OKProblem", http.MethodGet, "/things/t1", problem, ""},
		{"OKRouterNotFound", http.MethodGet, "/nowhere", problem, ""},
		{"OKRouterMethodNotAllowed", http.MethodPost, "/things/t1",
			answer{status: 405, contentType: "application/problem+json", body: `{"code":"method_not_allowed","status":405}`}, ""},
		{"OKHead", http.MethodHead, "/things/t1", answer{status: 200, contentType: "application/json"}, ""},
		{"ErrWrongBody", http.MethodGet, "/things/t1",
			answer{status: 200, contentType: "application/json", body: `{"id":7}`}, "doesn't match schema"},
		{"ErrUnknownField", http.MethodGet, "/things/t1",
			answer{status: 200, contentType: "application/json", body: `{"id":"t1","extra":true}`}, "doesn't match schema"},
		{"ErrMissingField", http.MethodGet, "/things/t1",
			answer{status: 200, contentType: "application/json", body: `{}`}, "doesn't match schema"},
		{"ErrNotJSON", http.MethodGet, "/things/t1",
			answer{status: 200, contentType: "application/json", body: `{"id":`}, "decode"},
		{"ErrWrongMediaType", http.MethodGet, "/things/t1",
			answer{status: 200, contentType: "text/plain", body: `{"id":"t1"}`}, "Content-Type"},
		{"ErrProblemAsJSON", http.MethodGet, "/things/t1",
			answer{status: 404, contentType: "application/json", body: `{"code":"x","status":404}`}, "Content-Type"},
		{"ErrStatusNotListed", http.MethodGet, "/things/t1",
			answer{status: 409, contentType: "application/problem+json", body: `{"code":"conflict","status":409}`}, "does not list status 409"},
		{"ErrBadHeader", http.MethodGet, "/things/t1", answer{status: 200, contentType: "application/json",
			header: map[string]string{"X-Count": "many"}, body: `{"id":"t1"}`}, `header "X-Count"`},
		{"ErrBodyWithoutContent", http.MethodGet, "/things/t1", answer{status: 204, body: "surprise"}, "no content"},
		{"ErrUnroutedNot404", http.MethodGet, "/nowhere",
			answer{status: 200, contentType: "application/json", body: `{}`}, "router's 404 or 405"},
		{"ErrUnroutedNotProblem", http.MethodGet, "/nowhere",
			answer{status: 404, contentType: "text/plain", body: "404 page not found"}, "Content-Type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fake(tc.answer)
			v, err := servertest.Fetch(ctx, h)
			require.NoError(t, err)
			req := httptest.NewRequest(tc.method, tc.path, nil)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			err = v.Check(req, rec.Code, rec.Header(), rec.Body.Bytes())
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			var me *servertest.MismatchError
			require.ErrorAs(t, err, &me)
			require.Equal(t, tc.answer.status, me.Status)
			require.Contains(t, err.Error(), tc.wantErr)
		})
	}

	t.Run("ErrHeadWithBody", func(t *testing.T) {
		v, err := servertest.Fetch(ctx, fake(good))
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodHead, "/things/t1", nil)
		err = v.Check(req, 200, http.Header{"Content-Type": {"application/json"}}, []byte(`{"id":"t1"}`))
		require.ErrorContains(t, err, "a HEAD answer has a body")
	})

	t.Run("ErrInvalidDocument", func(t *testing.T) {
		_, err := servertest.NewValidator(ctx, []byte(`{"openapi":"3.1.0","info":{"title":"t"},"paths":{}}`))
		require.ErrorContains(t, err, "not valid OpenAPI")
	})

	t.Run("ErrBadExample", func(t *testing.T) {
		doc := strings.Replace(document, `{"$ref": "#/components/schemas/Thing"}}`,
			`{"$ref": "#/components/schemas/Thing"}, "example": {"id": 7}}`, 1)
		require.NotEqual(t, document, doc)
		_, err := servertest.NewValidator(ctx, []byte(doc))
		require.ErrorContains(t, err, "not valid OpenAPI", "examples are checked against their schemas")
	})

	t.Run("CheckSchema", func(t *testing.T) {
		v, err := servertest.NewValidator(ctx, []byte(document))
		require.NoError(t, err)
		require.NoError(t, v.CheckSchema("Thing", []byte(`{"id":"t1"}`)))
		require.Error(t, v.CheckSchema("Thing", []byte(`{"id":"t1","x":1}`)))
		require.Error(t, v.CheckSchema("Nothing", []byte(`{}`)))
	})

	t.Run("ErrNoDefaultResponse", func(t *testing.T) {
		doc := strings.Replace(document, `"Default": {`, `"Other": {`, 1)
		doc = strings.ReplaceAll(doc, "#/components/responses/Default", "#/components/responses/Other")
		_, err := servertest.NewValidator(ctx, []byte(doc))
		require.ErrorContains(t, err, "no components.responses.Default")
	})
}

// failRecorder is a testing.TB that keeps what Errorf said.
type failRecorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (f *failRecorder) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, format)
	_ = args
}

// TestHandler: the wrapper passes every answer on unchanged, and fails the
// test on one the document does not describe.
func TestHandler(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		ts := servertest.NewServer(t, fake(answer{status: 200, contentType: "application/json",
			header: map[string]string{"X-Count": "3"}, body: `{"id":"t1"}`}))
		res, err := ts.Client().Get(ts.URL + "/things/t1")
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, 200, res.StatusCode)
		require.Equal(t, "3", res.Header.Get("X-Count"))
	})
	t.Run("ErrMismatchFailsTheTest", func(t *testing.T) {
		h := fake(answer{status: 200, contentType: "application/json", body: `{"id":7}`})
		v, err := servertest.Fetch(context.Background(), h)
		require.NoError(t, err)
		tb := &failRecorder{TB: t}
		rec := httptest.NewRecorder()
		v.Handler(tb, h).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/things/t1", nil))
		require.Equal(t, 200, rec.Code, "the answer still reaches the client")
		require.JSONEq(t, `{"id":7}`, rec.Body.String())
		require.Len(t, tb.errs, 1, "and the test fails")
	})
}

// TestProxy: a server elsewhere is checked through the proxy, against the
// document it serves itself.
func TestProxy(t *testing.T) {
	upstream := httptest.NewServer(fake(answer{status: 200, contentType: "application/json", body: `{"id":"t1"}`}))
	t.Cleanup(upstream.Close)
	ts := servertest.NewProxy(t, upstream.URL)
	res, err := ts.Client().Get(ts.URL + "/things/t1")
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, 200, res.StatusCode)
}

// contractDocument refers to the Action component, loosely described as
// the generated one may be, directly, in an array, in a map and in a
// oneOf branch.
const contractDocument = `{
  "openapi": "3.1.0",
  "info": {"title": "t", "version": "1"},
  "servers": [{"url": "/"}],
  "paths": {
    "/v1/openapi.json": {"get": {"operationId": "doc", "responses": {"200": {"description": "this",
      "content": {"application/json": {"schema": {"type": "object"}}}}}}},
    "/one": {"get": {"operationId": "one", "responses": {"200": {"description": "an action",
      "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Action"}}}}}}},
    "/list": {"get": {"operationId": "list", "responses": {"200": {"description": "actions",
      "content": {"application/json": {"schema": {"$ref": "#/components/schemas/List"}}}}}}}
  },
  "components": {
    "responses": {"Default": {"description": "a problem",
      "content": {"application/problem+json": {"schema": {"type": "object"}}}}},
    "schemas": {
      "Action": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
      "Thing": {"type": "object", "required": ["thing"], "properties": {"thing": {"type": "string"}}},
      "List": {"type": "object", "properties": {
        "actions": {"type": "array", "items": {"$ref": "#/components/schemas/Action"}},
        "by_id": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Action"}},
        "either": {"oneOf": [{"$ref": "#/components/schemas/Thing"}, {"$ref": "#/components/schemas/Action"}]}}}
    }
  }
}`

// TestCheckContracts: a value where the document refers to a component a
// contract describes (an Action) must satisfy the contract as well, wherever
// it sits in the body; values elsewhere are not held to it.
func TestCheckContracts(t *testing.T) {
	ctx := context.Background()
	v, err := servertest.NewValidator(ctx, []byte(contractDocument))
	require.NoError(t, err)
	valid, err := os.ReadFile("../../contracts/testdata/action.valid.json")
	require.NoError(t, err)
	// broken passes the loose component, not the contract (an unknown field).
	broken := strings.Replace(string(valid), `"seq": 2,`, `"seq": 2, "colour": "blue",`, 1)
	require.NotEqual(t, string(valid), broken)
	for _, tc := range []struct {
		name, path, body string
		wantErr          string // "" means the answer is described
	}{
		{"OK", "/one", string(valid), ""},
		{"OKInArray", "/list", `{"actions": [` + string(valid) + `]}`, ""},
		{"OKOtherBranch", "/list", `{"either": {"thing": "t", "colour": "blue"}}`, ""},
		{"ErrDirect", "/one", broken, `value at "" (components.schemas.Action) breaks the action contract`},
		{"ErrInArray", "/list", `{"actions": [` + string(valid) + `, ` + broken + `]}`, `value at "/actions/1"`},
		{"ErrInMap", "/list", `{"by_id": {"a/b": ` + broken + `}}`, `value at "/by_id/a~1b"`},
		{"ErrInBranch", "/list", `{"either": ` + broken + `}`, `value at "/either"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			err := v.Check(req, 200, http.Header{"Content-Type": {"application/json"}}, []byte(tc.body))
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			var me *servertest.MismatchError
			require.ErrorAs(t, err, &me)
			require.Contains(t, err.Error(), tc.wantErr)
			require.Contains(t, err.Error(), "/colour")
		})
	}
}
