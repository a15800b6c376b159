package servertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// DocumentPath is where the server serves its OpenAPI document.
const DocumentPath = "/v1/openapi.json"

// DefaultResponse names the component response every operation's
// "default" refers to: what any answer the document does not list looks
// like, the router's 404 and 405 among them.
const DefaultResponse = "Default"

// registerDecoders teaches openapi3filter the text media types of the
// API (evidence in Markdown and HTML, a run's Server-Sent Events), read as
// plain strings.
var registerDecoders = sync.OnceFunc(func() {
	openapi3filter.RegisterBodyDecoder("text/markdown", openapi3filter.PlainBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.PlainBodyDecoder)
})

// Validator checks answers against one OpenAPI document. It is safe for
// concurrent use.
type Validator struct {
	doc      *openapi3.T
	router   routers.Router
	fallback *routers.Route // the default response alone, for requests no operation matches
}

// Fetch reads the document h serves at DocumentPath, in process, and
// builds a Validator on it (see NewValidator).
func Fetch(ctx context.Context, h http.Handler) (*Validator, error) {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, DocumentPath, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return nil, fmt.Errorf("servertest: GET %s answered %d: %s", DocumentPath, rec.Code, rec.Body.String())
	}
	return NewValidator(ctx, rec.Body.Bytes())
}

// validators holds the Validator of every document NewValidator was given
// in this process, by the document's SHA-256: loading and validating the
// server's document costs more than a second of CPU under -race, and every
// test env of a package serves the same one.
var validators sync.Map // [sha256.Size]byte → *validatorOnce

// validatorOnce is one document's Validator (or error), made once.
type validatorOnce struct {
	once sync.Once
	v    *Validator
	err  error
}

// NewValidator loads an OpenAPI document (JSON), validates it (examples
// included) and builds a router over its operations. The document must
// define components.responses.Default. The same document (byte for byte)
// is loaded once per process: later calls return the same Validator (or
// error), so its Document must not be changed.
func NewValidator(ctx context.Context, document []byte) (*Validator, error) {
	e, _ := validators.LoadOrStore(sha256.Sum256(document), &validatorOnce{})
	vo := e.(*validatorOnce)
	vo.once.Do(func() { vo.v, vo.err = newValidator(ctx, document) })
	return vo.v, vo.err
}

// newValidator is NewValidator without the cache.
func newValidator(ctx context.Context, document []byte) (*Validator, error) {
	registerDecoders()
	loader := openapi3.NewLoader()
	loader.Context = ctx
	doc, err := loader.LoadFromData(document)
	if err != nil {
		return nil, fmt.Errorf("servertest: load the document: %w", err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("servertest: the document is not valid OpenAPI: %w", err)
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("servertest: route the document: %w", err)
	}
	var def *openapi3.ResponseRef
	if doc.Components != nil {
		def = doc.Components.Responses[DefaultResponse]
	}
	if def == nil || def.Value == nil {
		return nil, fmt.Errorf("servertest: the document has no components.responses.%s", DefaultResponse)
	}
	responses := openapi3.NewResponses(openapi3.WithName("default", def.Value))
	return &Validator{doc: doc, router: router, fallback: &routers.Route{Spec: doc,
		Operation: &openapi3.Operation{Responses: responses}}}, nil
}

// Document returns the loaded document.
func (v *Validator) Document() *openapi3.T { return v.doc }

// CheckSchema validates a JSON value against components.schemas[name],
// as the document's version validates (JSON Schema 2020-12 for 3.1).
func (v *Validator) CheckSchema(name string, value []byte) error {
	ref := v.doc.Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("servertest: no components.schemas.%s", name)
	}
	var x any
	if err := json.Unmarshal(value, &x); err != nil {
		return fmt.Errorf("servertest: %w", err)
	}
	return ref.Value.VisitJSON(x, v.visitOptions()...)
}

// visitOptions are the options of VisitJSON for the document's version
// (JSON Schema 2020-12 for 3.1).
func (v *Validator) visitOptions() []openapi3.SchemaValidationOption {
	if v.doc.IsOpenAPI31OrLater() {
		return []openapi3.SchemaValidationOption{openapi3.EnableJSONSchema2020()}
	}
	return nil
}

// Check validates one answer to req: its status, headers and body.
//
//   - A request that matches an operation must get a status that the
//     operation lists by number (its "default" does not count), with the
//     headers and the body, in one of the media types, that the document
//     gives for it. An answer the document gives no content for has no
//     body.
//   - A request that matches no operation must get 404 or 405 as the
//     default response describes it (the router's answers).
//   - A HEAD request is checked as its GET with the body left out, and
//     must have no body.
//   - A value of the body where the document refers to a component a
//     published contract describes (ContractComponents) must satisfy the
//     contract too.
func (v *Validator) Check(req *http.Request, status int, header http.Header, body []byte) error {
	// The document's server is relative ("/"): match the path alone.
	r := req.Clone(req.Context())
	r.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	r.Host = ""
	head := r.Method == http.MethodHead
	if head {
		if len(body) > 0 {
			return v.fail(req, status, body, "a HEAD answer has a body")
		}
		r.Method = http.MethodGet
	}
	route, params, err := v.router.FindRoute(r)
	var re *routers.RouteError
	switch {
	case errors.As(err, &re):
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			return v.fail(req, status, body, "no operation of the document matches, so the answer must be the router's 404 or 405")
		}
		route, params = v.fallback, nil
	case err != nil:
		return v.fail(req, status, body, "find the operation: "+err.Error())
	default:
		if route.Operation.Responses.Status(status) == nil {
			return v.fail(req, status, body, fmt.Sprintf("%s %s does not list status %d", route.Method, route.Path, status))
		}
	}
	resp := route.Operation.Responses.Status(status)
	if resp == nil {
		resp = route.Operation.Responses.Default()
	}
	if resp.Value != nil && len(resp.Value.Content) == 0 && len(body) > 0 {
		return v.fail(req, status, body, "the document gives this answer no content, but it has a body")
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, ExcludeResponseBody: head},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(r.Context(), in); err != nil {
		return v.fail(req, status, body, err.Error())
	}
	if resp.Value != nil && !head {
		if mt := resp.Value.Content.Get(header.Get("Content-Type")); mt != nil {
			if err := v.checkContracts(mt.Schema, body); err != nil {
				return v.fail(req, status, body, err.Error())
			}
		}
	}
	return nil
}

// MismatchError is an answer the document does not describe.
type MismatchError struct {
	Method, Path string
	Status       int
	Reason       string
	Body         string // the start of the body
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s %s answered %d, which the OpenAPI document does not describe: %s; body: %s",
		e.Method, e.Path, e.Status, e.Reason, e.Body)
}

func (v *Validator) fail(req *http.Request, status int, body []byte, reason string) error {
	b := body
	if len(b) > 600 {
		b = append(slices.Clip(b[:600]), "…"...)
	}
	return &MismatchError{Method: req.Method, Path: req.URL.RequestURI(), Status: status, Reason: reason, Body: strconv.Quote(string(b))}
}

// Handler serves h and checks each answer before it is sent on; an answer
// the document does not describe fails tb (with tb.Errorf, so the test
// goes on and its own assertions still speak).
func (v *Validator) Handler(tb testing.TB, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		if err := v.Check(r, rec.status, rec.header, rec.body.Bytes()); err != nil {
			tb.Errorf("servertest: %v", err)
		}
		for k, vs := range rec.header {
			w.Header()[k] = vs
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body.Bytes())
	})
}

// recorder keeps an answer whole until it has been checked.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

// NewServer starts an httptest server that serves h through a Validator
// on the document h serves, and closes it when tb ends.
func NewServer(tb testing.TB, h http.Handler) *httptest.Server {
	tb.Helper()
	v, err := Fetch(context.Background(), h)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	ts := httptest.NewServer(v.Handler(tb, h))
	tb.Cleanup(ts.Close)
	return ts
}

// NewProxy starts an httptest server that forwards every request to the
// server at target (a base URL, such as the address ledger serve logs) and
// checks each answer as NewServer does, against the document that server
// serves; it closes when tb ends. It is for servers a test does not build
// itself: the CLI's serve, run in process or as a binary.
func NewProxy(tb testing.TB, target string) *httptest.Server {
	tb.Helper()
	u, err := url.Parse(target)
	if err != nil {
		tb.Fatalf("servertest: proxy target %q: %v", target, err)
	}
	return NewServer(tb, httputil.NewSingleHostReverseProxy(u))
}
