package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/server/servertest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe for the server goroutine to write while
// the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// eventually polls cond every 50ms until it holds or 20s have passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 20s waiting for %s", what)
		}
		<-tick.C
	}
}

// listenURL finds the "listening on http://…" line of serve's log, JSON or
// text.
func listenURL(log string) string {
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && strings.HasPrefix(line.Msg, "listening on http://") {
			return line.URL
		}
		if m := textListening.FindStringSubmatch(sc.Text()); m != nil {
			return m[1]
		}
	}
	return ""
}

var textListening = regexp.MustCompile(`msg="listening on (http://[^"]+)"`)

// startServe runs `ledger serve args…` in process until the test ends, and
// returns its URL, its log and a stop function that cancels its context (a
// signal, for main) and returns what Run returned.
func startServe(t *testing.T, args ...string) (string, *syncBuffer, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, append([]string{"serve"}, args...), &bytes.Buffer{}, logs) }()
	var once sync.Once
	var result error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("serve did not stop within 10s of its signal")
			}
		})
		return result
	}
	t.Cleanup(func() { _ = stop() })
	var url string
	eventually(t, "serve to listen", func() bool {
		select {
		case err := <-done:
			t.Fatalf("serve exited early: %v\n%s", err, logs.String())
		default:
		}
		url = listenURL(logs.String())
		return url != ""
	})
	return url, logs, stop
}

func TestServe(t *testing.T) {
	t.Run("DevMode", func(t *testing.T) {
		dir := t.TempDir()
		served, logs, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0")
		require.Regexp(t, `^http://127\.0\.0\.1:\d+$`, served)
		require.Contains(t, logs.String(), `"level":"WARN","msg":"`+devModeWarning+`"`)
		// The CLI talks to serve through a proxy that checks every answer
		// against the document serve serves.
		url := servertest.NewProxy(t, served).URL

		res, err := http.Get(url + "/healthz")
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
		require.Equal(t, http.StatusOK, res.StatusCode)

		// No token needed; the one principal is dev in tenant default.
		md := filepath.Join(dir, "doc.md")
		require.NoError(t, os.WriteFile(md, []byte("# Go\n\n## Goroutines\n\nLightweight threads.\n"), 0o644))
		out, _, err := runCLI(t, nil, "submit", "--title", "Go", "--markdown-file", md, "--server", url, "--json")
		require.NoError(t, err)
		var sr server.SubmitResponse
		require.NoError(t, json.Unmarshal([]byte(out), &sr))
		require.Equal(t, "default", sr.Tenant)

		// The workers advance the run to its approval without being asked.
		var run server.Run
		eventually(t, "the run to await approval", func() bool {
			out, _, err := runCLI(t, nil, "runs", "show", string(sr.ID), "--server", url, "--json")
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal([]byte(out), &run))
			return run.State == "awaiting_approval"
		})
		// Separation of duties is relaxed: dev approves dev's run.
		a := run.Actions[len(run.Actions)-1]
		_, _, err = runCLI(t, nil, "approve", string(a.ID), "--digest", string(a.ActionDigest), "--server", url)
		require.NoError(t, err)
		eventually(t, "the run to complete", func() bool {
			out, _, err := runCLI(t, nil, "runs", "show", string(sr.ID), "--server", url, "--json")
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal([]byte(out), &run))
			return run.State == "completed"
		})

		// serve wires the store's commits, the engine's tool calls and the
		// build into the server's metrics.
		requireServeMetrics(t, url)

		require.NoError(t, stop(), "a signal is a clean exit")
		require.Contains(t, logs.String(), `"msg":"stopped"`)
		_, err = http.Get(served + "/healthz")
		require.Error(t, err, "no longer listening")
	})

	t.Run("ErrDevModeNotLoopback", func(t *testing.T) {
		dir := t.TempDir()
		for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "example.com:0"} {
			_, _, err := runCLI(t, nil, "serve", "--db", filepath.Join(dir, "ledger.db"), "--addr", addr)
			requireExit(t, err, 2)
			require.Contains(t, err.Error(), "dev mode")
			require.Contains(t, err.Error(), "loopback")
		}
		_, err := os.Stat(filepath.Join(dir, "ledger.db"))
		require.ErrorIs(t, err, os.ErrNotExist, "refused before opening anything")
	})

	t.Run("Tokens", func(t *testing.T) {
		dir := t.TempDir()
		tokens := filepath.Join(dir, "tokens.json")
		out, _, err := runCLI(t, nil, "token", "new", "--principal", "alice", "--tenant", "acme", "--role", "submitter", "--add-to", tokens)
		require.NoError(t, err)
		token, _, _ := strings.Cut(out, "\n")
		t.Setenv(envTokensFile, tokens) // the environment names the file

		served, logs, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0", "--log-format", "json")
		require.NotContains(t, logs.String(), "DEV MODE")
		url := servertest.NewProxy(t, served).URL

		_, _, err = runCLI(t, nil, "runs", "list", "--server", url)
		requireExit(t, err, 4)
		out, _, err = runCLI(t, nil, "runs", "list", "--server", url, "--token", token)
		require.NoError(t, err)
		require.Equal(t, "no runs\n", out)
		require.NoError(t, stop())
		require.NotContains(t, logs.String(), token, "tokens are never logged")
	})

	t.Run("PendingApprovalsCap", func(t *testing.T) {
		url, _, stop := startServe(t, "--db", filepath.Join(t.TempDir(), "ledger.db"), "--addr", "127.0.0.1:0",
			"--max-pending-approvals", "1")
		submit := func(key string) *http.Response {
			req, err := http.NewRequest(http.MethodPost, url+"/v1/runs",
				strings.NewReader(`{"agent":"practice-cards","input":{"title":"Go","markdown":"# Go\n\n## Maps\n\nHash tables.\n"}}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			res, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			require.NoError(t, res.Body.Close())
			return res
		}
		require.Equal(t, http.StatusCreated, submit("first").StatusCode)
		res := submit("second")
		require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "the flag reaches the server")
		require.Equal(t, "30", res.Header.Get("Retry-After"))
		require.NoError(t, stop())
	})

	t.Run("StreamsCap", func(t *testing.T) {
		url, _, stop := startServe(t, "--db", filepath.Join(t.TempDir(), "ledger.db"), "--addr", "127.0.0.1:0",
			"--max-streams", "1")
		req, err := http.NewRequest(http.MethodPost, url+"/v1/runs",
			strings.NewReader(`{"agent":"practice-cards","input":{"title":"Go","markdown":"# Go\n\n## Maps\n\nHash tables.\n"}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var run struct{ ID string }
		require.NoError(t, json.NewDecoder(res.Body).Decode(&run))
		require.NoError(t, res.Body.Close())
		require.Equal(t, http.StatusCreated, res.StatusCode)

		ctx, cancel := context.WithCancel(t.Context())
		stream := func() *http.Response {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/runs/"+run.ID+"/events", nil)
			require.NoError(t, err)
			res, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			return res
		}
		first := stream()
		require.Equal(t, http.StatusOK, first.StatusCode)
		second := stream()
		require.Equal(t, http.StatusTooManyRequests, second.StatusCode, "the flag reaches the server")
		require.NoError(t, second.Body.Close())
		cancel()
		_ = first.Body.Close()
		require.NoError(t, stop())
	})

	t.Run("TextLogs", func(t *testing.T) {
		url, logs, stop := startServe(t, "--db", filepath.Join(t.TempDir(), "ledger.db"), "--addr", "localhost:0", "--log-format", "text")
		require.Contains(t, logs.String(), `level=WARN msg="DEV MODE: no tokens file;`)
		require.NotEmpty(t, url)
		require.NoError(t, stop())
	})

	t.Run("FaultEnvironment", func(t *testing.T) {
		t.Setenv(envSimulatorConfig, `{"tools": {"cards.write": {"faults": [{"kind": "error"}]}}}`)
		_, logs, stop := startServe(t, "--db", filepath.Join(t.TempDir(), "ledger.db"), "--addr", "127.0.0.1:0")
		require.Contains(t, logs.String(), `"level":"WARN","msg":"FAULT INJECTION: `)
		require.NoError(t, stop())

		t.Setenv(envSimulatorConfig, `{"tools": {"nope": {}}}`)
		_, _, err := runCLI(t, nil, "serve", "--db", filepath.Join(t.TempDir(), "ledger.db"), "--addr", "127.0.0.1:0")
		requireExit(t, err, 2)
		require.Contains(t, err.Error(), envSimulatorConfig)
	})

	t.Run("ErrUsage", func(t *testing.T) {
		dir := t.TempDir()
		db := filepath.Join(dir, "ledger.db")
		bad := filepath.Join(dir, "bad.json")
		require.NoError(t, os.WriteFile(bad, []byte(`{"tokens": [{"sha256": "nope"}]}`), 0o600))
		for name, args := range map[string][]string{
			"missing tokens file":     {"--tokens", filepath.Join(dir, "missing.json")},
			"invalid tokens file":     {"--tokens", bad},
			"log format":              {"--log-format", "xml"},
			"log level":               {"--log-level", "loud"},
			"addr":                    {"--addr", "8080"},
			"missing rules file":      {"--rules", filepath.Join(dir, "missing.json")},
			"invalid rules file":      {"--rules", bad},
			"negative rate limit":     {"--rate-limit", "-1"},
			"rate limit not a number": {"--rate-limit", "NaN"},
			"zero burst":              {"--rate-burst", "0"},
			"positional":              {"extra"},
			"negative cap":            {"--max-pending-approvals", "-1"},
			"negative streams cap":    {"--max-streams", "-1"},
			"negative long-polls cap": {"--max-long-polls", "-1"},
		} {
			t.Run(name, func(t *testing.T) {
				_, _, err := runCLI(t, nil, append([]string{"serve", "--db", db}, args...)...)
				requireExit(t, err, 2)
			})
		}
	})
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true,
		"127.0.0.2:0":    true,
		"[::1]:8080":     true,
		"localhost:8080": true,
		"LOCALHOST:1":    true,
		"0.0.0.0:8080":   false,
		":8080":          false,
		"[::]:8080":      false,
		"10.0.0.1:8080":  false,
		"example.com:80": false,
		"127.0.0.1":      false,
	} {
		require.Equal(t, want, isLoopback(addr), addr)
	}
}

// requireServeMetrics reads url's /metrics after one approved run and
// checks what only serve's wiring feeds.
func requireServeMetrics(t *testing.T, url string) {
	t.Helper()
	res, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(res.Body)
	require.NoError(t, err)
	find := func(name string, labels map[string]string) *dto.Metric {
		t.Helper()
		f, ok := fams[name]
		require.True(t, ok, "no %s", name)
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			if len(m.GetLabel()) == len(labels) {
				return m
			}
		}
		t.Fatalf("%s has no series %v", name, labels)
		return nil
	}
	require.Equal(t, 1.0, find("ledger_build_info", map[string]string{"version": Version, "goversion": runtime.Version()}).GetGauge().GetValue())
	require.Positive(t, find("ledger_store_commit_duration_seconds", nil).GetHistogram().GetSampleCount())
	require.Positive(t, find("ledger_store_commit_batch_writes", nil).GetHistogram().GetSampleCount())
	require.Equal(t, uint64(1), find("ledger_tool_call_duration_seconds",
		map[string]string{"tool": "cards.write", "outcome": "succeeded"}).GetHistogram().GetSampleCount())
	require.Equal(t, uint64(1), find("ledger_approval_decision_seconds",
		map[string]string{"decision": "granted"}).GetHistogram().GetSampleCount())
	require.Zero(t, find("ledger_recovery_decisions_total", map[string]string{"decision": "review"}).GetCounter().GetValue(),
		"shown from 0")
	require.Equal(t, 1.0, find("ledger_actions", map[string]string{"state": "succeeded"}).GetGauge().GetValue())
}
