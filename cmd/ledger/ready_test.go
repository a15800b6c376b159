package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestReady(t *testing.T) {
	t.Parallel()
	// notReadyFor answers 503 with a problem document n times, then 200.
	notReadyFor := func(t *testing.T, n int64) (*httptest.Server, *atomic.Int64) {
		var calls atomic.Int64
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/readyz" {
				http.NotFound(w, r)
				return
			}
			if calls.Add(1) <= n {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"type":"about:blank","title":"Not ready","status":503,"code":"not_ready","detail":"the service is not ready"}`))
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"status":"ready"}`))
		}))
		t.Cleanup(hs.Close)
		return hs, &calls
	}

	t.Run("OK", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		out, _, err := env.cli(t, "", "ready")
		require.NoError(t, err, "no token needed")
		require.Equal(t, "ready\n", out)
		out, _, err = env.cli(t, "", "ready", "--json")
		require.NoError(t, err)
		var body map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &body))
		require.Equal(t, "ready", body["status"])
		require.Contains(t, body, "leases", "the lease loop is reported")
	})

	t.Run("WaitsUntilReady", func(t *testing.T) {
		hs, calls := notReadyFor(t, 3)
		out, _, err := runCLI(t, nil, "ready", "--server", hs.URL, "--wait", "20s")
		require.NoError(t, err)
		require.Equal(t, "ready\n", out)
		require.Equal(t, int64(4), calls.Load(), "asked again after each 503")
	})

	t.Run("ErrNotReady", func(t *testing.T) {
		hs, calls := notReadyFor(t, 1<<62)
		out, _, err := runCLI(t, nil, "ready", "--server", hs.URL)
		requireExit(t, err, exitOther)
		require.Empty(t, out)
		require.Equal(t, "not ready: 503 not_ready: the service is not ready", err.Error())
		require.Equal(t, int64(1), calls.Load(), "without --wait, asked once")

		_, _, err = runCLI(t, nil, "ready", "--server", hs.URL, "--wait", "300ms")
		requireExit(t, err, exitOther)
		require.Contains(t, err.Error(), "not ready after 300ms: 503 not_ready")
		require.Greater(t, calls.Load(), int64(2), "asked again while waiting")
	})

	t.Run("ErrNobodyListening", func(t *testing.T) {
		hs := httptest.NewServer(http.NotFoundHandler())
		url := hs.URL
		hs.Close()
		_, _, err := runCLI(t, nil, "ready", "--server", url, "--wait", "300ms")
		requireExit(t, err, exitOther)
		require.Contains(t, err.Error(), "cannot reach the ledger server")
	})

	t.Run("ErrServerNeverAnswers", func(t *testing.T) {
		release := make(chan struct{})
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		defer hs.Close()
		defer close(release)
		start := time.Now()
		_, _, err := runCLI(t, nil, "ready", "--server", hs.URL, "--wait", "300ms")
		requireExit(t, err, exitOther)
		require.Less(t, time.Since(start), 10*time.Second, "the wait bounds the request, not --timeout (30s)")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		_, _, err := runCLI(t, nil, "ready", "--wait", "-1s")
		requireExit(t, err, exitUsage)
		_, _, err = runCLI(t, nil, "ready", "extra")
		requireExit(t, err, exitUsage)
	})
}
