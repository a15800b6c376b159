package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// sse is one Server-Sent Event as the stream sent it.
type sse struct {
	ID    int64
	Event string
	Data  string
}

// readSSE reads the next event from r, skipping comments; io.EOF once the
// stream has ended.
func readSSE(r *bufio.Reader) (sse, error) {
	var ev sse
	seen := false
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if err == io.EOF && line == "" && !seen {
				return sse{}, io.EOF
			}
			return sse{}, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if seen {
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			n, err := strconv.ParseInt(strings.TrimPrefix(line, "id: "), 10, 64)
			if err != nil {
				return sse{}, err
			}
			ev.ID, seen = n, true
		case strings.HasPrefix(line, "event: "):
			ev.Event, seen = strings.TrimPrefix(line, "event: "), true
		case strings.HasPrefix(line, "data: "):
			ev.Data, seen = strings.TrimPrefix(line, "data: "), true
		default:
			return sse{}, io.ErrUnexpectedEOF
		}
	}
}

// parseSSE reads a whole stream.
func parseSSE(t testing.TB, body []byte) []sse {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(body))
	var out []sse
	for {
		ev, err := readSSE(r)
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out = append(out, ev)
	}
}

// requireTimeline holds events to the run's timeline from after on: the
// same seqs and types, and data that is the timeline's entry byte for byte
// and valid as the document's TimelineEvent.
func (e *env) requireTimeline(t testing.TB, run ledger.RunID, after int64, events []sse) {
	t.Helper()
	res := e.get(t, "root", "/v1/runs/"+string(run)+"/timeline")
	require.Equal(t, http.StatusOK, res.Status)
	var tl struct {
		Events []json.RawMessage `json:"events"`
	}
	require.NoError(t, json.Unmarshal(res.Body, &tl))
	require.Len(t, events, len(tl.Events)-int(after))
	for i, ev := range events {
		require.Equal(t, after+int64(i)+1, ev.ID)
		var te server.TimelineEvent
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &te))
		require.Equal(t, ev.ID, te.Seq)
		require.Equal(t, ev.Event, te.Type)
		require.JSONEq(t, string(tl.Events[after+int64(i)]), ev.Data)
		require.NoError(t, e.validator.CheckSchema("TimelineEvent", []byte(ev.Data)))
	}
}

// TestProtocolEvents: the run's events as Server-Sent Events, delivered
// while the run goes on, ending after its terminal event, resumed from
// Last-Event-ID; each answer checked against the document.
func TestProtocolEvents(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "e1")
	a := e.proposeOK(t, run, "r1", toolRead, `{"q":"balance"}`)
	path := "/v1/runs/" + string(run) + "/events"

	t.Run("Live", func(t *testing.T) {
		// Straight to the handler, to read the stream as it comes (the
		// validating server answers once the handler is done); the whole
		// stream is checked against the document at the end.
		raw := httptest.NewServer(e.srv.Handler())
		defer raw.Close()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, raw.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+e.tokens["ada"])
		client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{}}
		defer client.CloseIdleConnections()
		res, err := client.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
		var whole bytes.Buffer
		r := bufio.NewReader(io.TeeReader(res.Body, &whole))

		head := e.run(t, run).EventSeq
		var got []sse
		for len(got) == 0 || got[len(got)-1].ID < head {
			ev, err := readSSE(r)
			require.NoError(t, err)
			got = append(got, ev)
		}
		// The stream is open, and delivers what happens next.
		b := e.beginOK(t, a.ID, "b1")
		ev, err := readSSE(r)
		require.NoError(t, err)
		require.Equal(t, head+1, ev.ID)
		got = append(got, ev)

		res2 := e.attemptPost(t, "ada", b.Attempt.ID, "complete", tokenBody(b.AttemptToken, `"status":"succeeded"`))
		require.Equal(t, http.StatusOK, res2.Status, string(res2.Body))
		res2 = e.post(t, "ada", "/v1/runs/"+string(run)+"/finish", `{"outcome":"completed"}`)
		require.Equal(t, http.StatusOK, res2.Status, string(res2.Body))
		for {
			ev, err := readSSE(r)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			got = append(got, ev)
		}
		require.Equal(t, e.run(t, run).EventSeq, got[len(got)-1].ID, "the stream ends after the run's terminal event")
		e.requireTimeline(t, run, 0, got)
		require.NoError(t, e.validator.Check(req, res.StatusCode, res.Header, whole.Bytes()))
	})

	t.Run("Resume", func(t *testing.T) {
		res := e.send(t, request{principal: "ada", method: http.MethodGet, path: path,
			header: map[string][]string{"Last-Event-ID": {"3"}}})
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
		evs := parseSSE(t, res.Body)
		require.NotEmpty(t, evs)
		e.requireTimeline(t, run, 3, evs)

		all := e.get(t, "ada", path)
		require.Equal(t, http.StatusOK, all.Status)
		e.requireTimeline(t, run, 0, parseSSE(t, all.Body))

		past := e.send(t, request{principal: "ada", method: http.MethodGet, path: path,
			header: map[string][]string{"Last-Event-ID": {strconv.FormatInt(e.run(t, run).EventSeq, 10)}}})
		require.Equal(t, http.StatusOK, past.Status)
		require.Empty(t, parseSSE(t, past.Body), "nothing after the last event, and the stream ends")
	})

	t.Run("Errors", func(t *testing.T) {
		for _, v := range []string{"x", "-1", "1.5"} {
			p := requireProblem(t, e.send(t, request{principal: "ada", method: http.MethodGet, path: path,
				header: map[string][]string{"Last-Event-ID": {v}}}), http.StatusBadRequest, "invalid")
			requireLocation(t, p, "Last-Event-ID", "")
		}
		requireProblem(t, e.get(t, "gus", path), http.StatusNotFound, "not_found")
		requireProblem(t, e.get(t, "ada", "/v1/runs/run_nope/events"), http.StatusNotFound, "not_found")
		requireProblem(t, e.get(t, "carol", path), http.StatusForbidden, "forbidden")
	})
}
