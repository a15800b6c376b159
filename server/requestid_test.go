package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// logBuffer collects the server's JSON log lines; the server logs from
// its handlers' goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns every log line logged so far, decoded.
func (b *logBuffer) lines(t testing.TB) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		out = append(out, m)
	}
	return out
}

// withRequestID returns the log lines that name request id.
func (b *logBuffer) withRequestID(t testing.TB, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range b.lines(t) {
		if l["request_id"] == id {
			out = append(out, l)
		}
	}
	return out
}

// loggingEnv is an env whose server logs JSON into the returned buffer.
func loggingEnv(t *testing.T, more func(*server.Config)) (*env, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	e := newEnv(t, options{config: func(c *server.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		if more != nil {
			more(c)
		}
	}})
	return e, logs
}

// requestLine is the one "http request" line among lines.
func requestLine(t testing.TB, lines []map[string]any) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, l := range lines {
		if l["msg"] == "http request" {
			found = append(found, l)
		}
	}
	require.Len(t, found, 1, "%v", lines)
	return found[0]
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	t.Run("Given", func(t *testing.T) {
		e, logs := loggingEnv(t, nil)
		const id = "4f1c2b7e-9a7d-4c1e-8f55-2b0c6d9e1a3f"
		res := e.send(t, request{principal: "bob", method: http.MethodGet, path: "/v1/runs/run_unknown",
			header: map[string][]string{server.HeaderRequestID: {id}}})
		require.Equal(t, id, res.Header.Get(server.HeaderRequestID), "echoed")
		p := requireProblem(t, res, http.StatusNotFound, "not_found")
		require.Equal(t, server.ProblemInstancePrefix+id, p.Instance)

		line := requestLine(t, logs.withRequestID(t, id))
		require.Equal(t, "/v1/runs/:run_id", line["route"])
		require.EqualValues(t, 404, line["status"])
		require.Equal(t, "bob", line["principal"])
		ms, ok := line["duration_ms"].(float64)
		require.True(t, ok, "duration_ms is a number: %v", line)
		require.GreaterOrEqual(t, ms, 0.0)
		require.NotContains(t, line, "duration", "the unit is in the name")
	})

	t.Run("Generated", func(t *testing.T) {
		e, logs := loggingEnv(t, nil)
		res := e.get(t, "", "/nowhere")
		id := res.Header.Get(server.HeaderRequestID)
		rest, ok := strings.CutPrefix(id, server.RequestIDPrefix)
		require.True(t, ok, id)
		require.True(t, ledger.ValidID("req", id), "req_ and a ULID: %s", rest)
		p := requireProblem(t, res, http.StatusNotFound, server.CodeRouteNotFound)
		require.Equal(t, server.ProblemInstancePrefix+id, p.Instance)
		line := requestLine(t, logs.withRequestID(t, id))
		require.Equal(t, "unmatched", line["route"])

		// Every request gets its own.
		other := e.get(t, "", "/healthz").Header.Get(server.HeaderRequestID)
		require.NotEqual(t, id, other)
		require.True(t, ledger.ValidID("req", other))
	})

	t.Run("HandlersLogsCarryIt", func(t *testing.T) {
		e, logs := loggingEnv(t, func(c *server.Config) {
			c.ReadyFunc = func(context.Context) error { return errors.New("disk gone") }
		})
		res := e.send(t, request{method: http.MethodGet, path: "/readyz",
			header: map[string][]string{server.HeaderRequestID: {"probe-1"}}})
		requireProblem(t, res, http.StatusServiceUnavailable, server.CodeNotReady)
		lines := logs.withRequestID(t, "probe-1")
		var msgs []string
		for _, l := range lines {
			msgs = append(msgs, l["msg"].(string))
		}
		require.ElementsMatch(t, []string{"not ready", "http request"}, msgs, "the handler's own line names the request too")
	})

	t.Run("ReplacedWhenInsane", func(t *testing.T) {
		e := newEnv(t, options{})
		for name, vals := range map[string][]string{
			"Space":     {"has space"},
			"Quote":     {`a"b`},
			"NonASCII":  {"ré"},
			"Control":   {"a\tb"},
			"TooLong":   {strings.Repeat("x", server.MaxRequestIDLength+1)},
			"Empty":     {""},
			"TwoValues": {"a", "b"},
		} {
			t.Run(name, func(t *testing.T) {
				res := e.send(t, request{method: http.MethodGet, path: "/healthz",
					header: map[string][]string{server.HeaderRequestID: vals}})
				require.Equal(t, http.StatusOK, res.Status)
				got := res.Header.Get(server.HeaderRequestID)
				require.True(t, ledger.ValidID("req", got), "replaced by the server's own: %q", got)
			})
		}
		t.Run("LongestKept", func(t *testing.T) {
			id := strings.Repeat("a", server.MaxRequestIDLength)
			res := e.send(t, request{method: http.MethodGet, path: "/healthz",
				header: map[string][]string{server.HeaderRequestID: {id}}})
			require.Equal(t, id, res.Header.Get(server.HeaderRequestID))
		})
	})
}
