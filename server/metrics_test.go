package server_test

import (
	"bytes"
	"context"
	"net/http"
	"runtime"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/server"
)

// scrape reads /metrics with Prometheus' own text parser.
func scrape(t *testing.T, e *env) map[string]*dto.MetricFamily {
	t.Helper()
	res := e.get(t, "", "/metrics")
	require.Equal(t, http.StatusOK, res.Status)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(res.Body))
	require.NoError(t, err)
	return fams
}

// sample finds the series of family name with exactly the given labels.
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	require.True(t, ok, "no family %s", name)
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		return m
	}
	t.Fatalf("%s has no series %v", name, labels)
	return nil
}

// value is a counter's or gauge's value.
func value(m *dto.Metric) float64 {
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// TestDashboardMetrics runs one whole flow and reads what a dashboard
// needs from /metrics: actions and the rest by state, group commits,
// tool calls by tool and outcome, approval decision latency, replays and
// key conflicts, the build, and recovery decisions from 0.
func TestDashboardMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{hooks: true, config: func(c *server.Config) { c.Version = "v1.2.3-test" }})
	ctx := context.Background()

	fams := scrape(t, e)
	for _, k := range recovery.Kinds() {
		require.Zero(t, value(sample(t, fams, "ledger_recovery_decisions_total", map[string]string{"decision": string(k)})),
			"every decision is shown from the start: %s", k)
	}
	require.Zero(t, value(sample(t, fams, "ledger_submit_replays_total", nil)))
	require.Equal(t, 1.0, value(sample(t, fams, "ledger_build_info",
		map[string]string{"version": "v1.2.3-test", "goversion": runtime.Version()})))

	body := submitBody(t)
	id := e.submit(t, "alice", "k1")
	require.Equal(t, http.StatusCreated, e.submitRaw(t, "alice", "k1", body).Status, "a replay")
	requireProblem(t, e.submitRaw(t, "alice", "k1", `{"agent":"practice-cards","input":{"title":"other","markdown":"# x"}}`),
		http.StatusUnprocessableEntity, server.CodeIdempotencyKeyReused)
	run := e.advance(t, id)
	require.Equal(t, ledger.RunAwaitingApproval, run.State)
	a := e.pendingAction(t, id)
	e.Clock.Advance(90 * time.Second) // the approver takes a minute and a half
	res := e.post(t, "bob", "/v1/actions/"+string(a.ID)+"/approve", digestBody(a.ActionDigest))
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	require.Equal(t, ledger.RunCompleted, e.advance(t, id).State)

	fams = scrape(t, e)
	counts, err := e.Store.CountByState(ctx)
	require.NoError(t, err)
	for _, st := range ledger.ActionStates() {
		require.Equal(t, float64(counts.Actions[st]), value(sample(t, fams, "ledger_actions", map[string]string{"state": string(st)})), st)
	}
	require.Equal(t, 1.0, value(sample(t, fams, "ledger_actions", map[string]string{"state": "succeeded"})))
	require.Equal(t, 1.0, value(sample(t, fams, "ledger_runs", map[string]string{"state": "completed"})))
	require.Equal(t, 1.0, value(sample(t, fams, "ledger_approvals", map[string]string{"state": "granted"})))
	require.Zero(t, value(sample(t, fams, "ledger_approvals_waiting", nil)))
	require.Equal(t, 1.0, value(sample(t, fams, "ledger_attempts", map[string]string{"status": "succeeded", "effect": "happened"})))

	calls := sample(t, fams, "ledger_tool_call_duration_seconds", map[string]string{"tool": "cards.write", "outcome": "succeeded"})
	require.Equal(t, uint64(1), calls.GetHistogram().GetSampleCount(), "one call of the write tool")

	commits := sample(t, fams, "ledger_store_commit_duration_seconds", nil).GetHistogram()
	batches := sample(t, fams, "ledger_store_commit_batch_writes", nil).GetHistogram()
	require.Positive(t, commits.GetSampleCount(), "every write was committed")
	require.Equal(t, commits.GetSampleCount(), batches.GetSampleCount(), "one batch size per commit")
	require.GreaterOrEqual(t, batches.GetSampleSum(), float64(batches.GetSampleCount()), "at least one write per commit")

	decided := sample(t, fams, "ledger_approval_decision_seconds", map[string]string{"decision": "granted"}).GetHistogram()
	require.Equal(t, uint64(1), decided.GetSampleCount())
	require.InDelta(t, 90, decided.GetSampleSum(), 0.001, "requested_at to decided_at")
	require.Zero(t, sample(t, fams, "ledger_approval_decision_seconds", map[string]string{"decision": "denied"}).GetHistogram().GetSampleCount())

	require.Equal(t, 1.0, value(sample(t, fams, "ledger_submit_replays_total", nil)))
	require.Equal(t, 1.0, value(sample(t, fams, "ledger_submit_key_conflicts_total", map[string]string{"kind": "reused"})))
	require.Zero(t, value(sample(t, fams, "ledger_submit_key_conflicts_total", map[string]string{"kind": "in_progress"})))
	require.Zero(t, value(sample(t, fams, "ledger_http_rate_limited_total", map[string]string{"scope": "principal"})))
}
