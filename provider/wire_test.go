package provider_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/provider"
)

// The keys the tests' environment holds, under the names the tiers give.
const (
	openaiKeyEnv    = "TEST_OPENAI_KEY"
	openaiKey       = "sk-test-openai-0123456789abcdef"
	anthropicKeyEnv = "TEST_ANTHROPIC_KEY"
	anthropicKey    = "sk-ant-test-0123456789abcdef"
)

// getenv is the tests' environment.
func getenv(name string) string {
	return map[string]string{openaiKeyEnv: openaiKey, anthropicKeyEnv: anthropicKey}[name]
}

// testNow is the clock Retry-After dates are read against.
var testNow = time.Date(2026, 10, 21, 7, 27, 30, 0, time.UTC)

// wantRequest is a transcript's request.json: what the adapter must send.
type wantRequest struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers"`
	// Body holds the essential fields: each must be in the body sent, with
	// the same value (objects compared key by key, arrays item by item).
	Body json.RawMessage `json:"body"`
	// Absent are top-level fields the body must not have.
	Absent []string `json:"absent"`
	// Forbid are strings the body must not contain (another format's
	// opaque items).
	Forbid []string `json:"forbid"`
}

// recorded is the request a transcript server received.
type recorded struct {
	mu      sync.Mutex
	count   int
	method  string
	path    string
	headers http.Header
	body    []byte
}

func (r *recorded) requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// served is a transcript's response.http: status line, headers, blank
// line, body (JSON, or a server-sent event stream).
type served struct {
	status  int
	headers http.Header
	body    []byte
}

func readServed(t *testing.T, path string) served {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	require.NoError(t, err, path)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return served{status: res.StatusCode, headers: res.Header, body: body}
}

// serveTranscript starts a server that records the request and answers
// with dir's response.http; an event stream is written event by event.
func serveTranscript(t *testing.T, dir string) (*httptest.Server, *recorded) {
	t.Helper()
	resp := readServed(t, filepath.Join(dir, "response.http"))
	rec := &recorded{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.count++
		rec.method, rec.path, rec.headers, rec.body = r.Method, r.URL.Path, r.Header.Clone(), body
		rec.mu.Unlock()
		for k, vs := range resp.headers {
			for _, v := range vs {
				w.Header().Add(k, v)
			}
		}
		w.WriteHeader(resp.status)
		if !strings.HasPrefix(resp.headers.Get("Content-Type"), "text/event-stream") {
			_, _ = w.Write(resp.body)
			return
		}
		for _, ev := range bytes.SplitAfter(resp.body, []byte("\n\n")) {
			_, _ = w.Write(ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv, rec
}

// checkRequest holds the recorded request to dir's request.json.
func checkRequest(t *testing.T, dir string, rec *recorded) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "request.json"))
	require.NoError(t, err)
	var want wantRequest
	require.NoError(t, json.Unmarshal(raw, &want))
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, 1, rec.count, "requests sent")
	require.Equal(t, want.Method, rec.method)
	require.Equal(t, want.Path, rec.path)
	for k, v := range want.Headers {
		require.Equal(t, v, rec.headers.Get(k), "header %s", k)
	}
	got := decodeJSON(t, rec.body)
	if len(want.Body) > 0 {
		containsJSON(t, "body", decodeJSON(t, want.Body), got)
	}
	obj, ok := got.(map[string]any)
	require.True(t, ok, "the body is a JSON object: %s", rec.body)
	for _, k := range want.Absent {
		require.NotContains(t, obj, k, "body field %s", k)
	}
	for _, s := range want.Forbid {
		require.NotContains(t, string(rec.body), s)
	}
}

func decodeJSON(t *testing.T, raw []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v), "%s", raw)
	return v
}

// containsJSON requires got to hold every field of want with its value.
func containsJSON(t *testing.T, at string, want, got any) {
	t.Helper()
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		require.True(t, ok, "%s: want an object, got %v", at, got)
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			gv, ok := g[k]
			require.True(t, ok, "%s.%s: missing (have %v)", at, k, g)
			containsJSON(t, at+"."+k, w[k], gv)
		}
	case []any:
		g, ok := got.([]any)
		require.True(t, ok, "%s: want an array, got %v", at, got)
		require.Len(t, g, len(w), "%s: %v", at, g)
		for i := range w {
			containsJSON(t, fmt.Sprintf("%s[%d]", at, i), w[i], g[i])
		}
	default:
		require.Equal(t, want, got, at)
	}
}

// turnJSON renders a turn for comparison, raw JSON fields compacted.
func turnJSON(t *testing.T, turn provider.Turn) string {
	t.Helper()
	raw, err := json.Marshal(turn)
	require.NoError(t, err)
	return string(raw)
}
