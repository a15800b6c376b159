package server_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/actionledger/ledger/server"
)

// TestHead: every GET operation of the document answers HEAD with the
// status and headers of its GET, Content-Length included, and no body;
// errors too.
func TestHead(t *testing.T) {
	t.Parallel()
	// Evidence reports stamp the time they were made: a fixed clock makes
	// a GET and its HEAD the same length.
	fixed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	gw, err := mcpgw.New(mcpgw.Options{Dir: t.TempDir(), Config: &contracts.ConfigMCP{Upstreams: []contracts.ConfigUpstream{{
		Name: "nowhere", URL: "http://127.0.0.1:1/mcp"}}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = gw.Close() })
	e := newEnv(t, options{config: func(c *server.Config) {
		c.Now = func() time.Time { return fixed }
		c.MCP, c.MCPAgent = gw, contracts.DefaultMCPAgent
	}})
	id, a := e.awaiting(t, "alice", "k1")
	// A run's event stream ends when the run has: it is read on one that
	// has ended (cancelled, stopped).
	ended := e.submit(t, "alice", "k-ended")
	require.Equal(t, http.StatusAccepted, e.post(t, "alice", "/v1/runs/"+string(ended)+"/cancel", "").Status)
	require.True(t, e.advance(t, ended).State.Terminal())
	res := e.get(t, "", "/v1/openapi.json")
	require.Equal(t, http.StatusOK, res.Status)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(res.Body, &doc))
	n := 0
	for path, ops := range doc.Paths {
		if _, ok := ops["get"]; !ok {
			continue
		}
		_, hasHead := ops["head"]
		if path == "/mcp" { // a stream of MCP messages: no HEAD
			require.False(t, hasHead)
			continue
		}
		require.True(t, hasHead, "the document describes HEAD %s", path)
		n++
		run := id
		if strings.HasSuffix(path, "/events") {
			run = ended
		}
		url := strings.NewReplacer("{run_id}", string(run), "{action_id}", string(a.ID)).Replace(path)
		t.Run(path, func(t *testing.T) {
			for _, who := range []string{"root", ""} { // an answer and, for /v1, a 401
				get := e.send(t, request{principal: who, method: http.MethodGet, path: url})
				head := e.send(t, request{principal: who, method: http.MethodHead, path: url})
				require.Equal(t, get.Status, head.Status, who)
				require.Empty(t, head.Body)
				for _, h := range []string{"Content-Type", "X-Content-Type-Options", "WWW-Authenticate", "Allow"} {
					require.Equal(t, get.Header.Values(h), head.Header.Values(h), h)
				}
				require.NotEmpty(t, head.Header.Get(server.HeaderRequestID))
				if path != "/metrics" { // its counters moved between the two requests
					require.Equal(t, strconv.Itoa(len(get.Body)), head.Header.Get("Content-Length"), "%s as %q", path, who)
				}
			}
		})
	}
	require.Equal(t, 15, n, "every GET operation but /mcp's was tried")

	t.Run("UnknownRoute", func(t *testing.T) {
		head := e.send(t, request{method: http.MethodHead, path: "/nowhere"})
		require.Equal(t, http.StatusNotFound, head.Status)
		require.Equal(t, "application/problem+json", head.Header.Get("Content-Type"))
		require.Empty(t, head.Body)
	})
	t.Run("MethodNotAllowed", func(t *testing.T) {
		head := e.send(t, request{method: http.MethodHead, path: "/v1/runs/" + string(id) + "/cancel"})
		require.Equal(t, http.StatusMethodNotAllowed, head.Status)
		require.Contains(t, head.Header.Get("Allow"), http.MethodPost)
		require.Empty(t, head.Body)
	})
}
