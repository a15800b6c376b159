package server_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// TestStoreErrors: a write of the HTTP handlers that the store cannot make
// is a 500, counted in ledger_store_errors_total{op}, and /readyz is 503
// until a write succeeds with none failed for two seconds.
func TestStoreErrors(t *testing.T) {
	t.Parallel()
	full := &atomic.Bool{}
	reg := prometheus.NewRegistry()
	// The store's writes fail while full is set, as on a full disk: its
	// own fault hook, so its health sees them through its hook.
	e := newEnv(t, options{config: func(c *server.Config) { c.Registry = reg },
		writeFault: func(_ int64, at ledger.WritePoint) error {
			if at == ledger.WriteBeforeCommit && full.Load() {
				return errors.New("database or disk is full")
			}
			return nil
		}})
	metric := func(op string) string {
		return `ledger_store_errors_total{op="` + op + `"} `
	}
	body := string(e.get(t, "", "/metrics").Body)
	require.Contains(t, body, metric("submit_run")+"0", "every operation is exported from the start")
	require.Contains(t, body, metric("finish_attempt")+"0")

	full.Store(true)
	p := requireProblem(t, e.submitRaw(t, "alice", "k1", submitBody(t)), http.StatusInternalServerError, "internal")
	require.Equal(t, "internal error", p.Detail, "the cause goes to the log")
	requireProblem(t, e.get(t, "", "/readyz"), http.StatusServiceUnavailable, server.CodeNotReady)
	require.Contains(t, string(e.get(t, "", "/metrics").Body), metric("submit_run")+"1")
	require.Error(t, e.engine.Health().Err(), "the handlers' failures are the engine's health too")
	require.Zero(t, e.runCount(t), "nothing was acknowledged, nothing stored")

	full.Store(false)
	e.submit(t, "alice", "k1") // the same key: nothing of the failed try remains
	requireProblem(t, e.get(t, "", "/readyz"), http.StatusServiceUnavailable, server.CodeNotReady)
	e.Clock.Advance(2 * time.Second)
	require.Equal(t, http.StatusOK, e.get(t, "", "/readyz").Status, "a write succeeded and none failed for 2s: ready again")
	require.Contains(t, string(e.get(t, "", "/metrics").Body), metric("submit_run")+"1", "a counter, never reset")
}
