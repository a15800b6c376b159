package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// Metrics are the Prometheus metrics the server registers: what a
// dashboard of the service needs. Every label takes values from a fixed
// set (states, statuses, decisions, route templates, registered tools), so
// no request can grow a series.
//
// The store gauges (ledger_runs, ledger_actions, ledger_approvals,
// ledger_approvals_waiting, ledger_attempts) are counted when scraped.
// The commit and tool-call histograms and the recovery counter are fed by
// the hooks of the ledger (ObserveCommit), the engine (ObserveToolCall)
// and the recovery scan (ObserveDecision), which the caller wires: the
// server builds neither.
type Metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	rateLimited *prometheus.CounterVec
	replays     prometheus.Counter
	conflicts   *prometheus.CounterVec
	decisions   *prometheus.HistogramVec
	commits     prometheus.Histogram
	batch       prometheus.Histogram
	toolCalls   *prometheus.HistogramVec
	// ledger_store_errors_total, the store's failed writes and reads by
	// kind, belongs here too; it is added with the store's error hooks.

	// RecoveryDecisions counts the decisions of the recovery scan by
	// decision, every kind from 0 (ObserveDecision increments it).
	RecoveryDecisions *prometheus.CounterVec
}

// Buckets of the histograms whose range DefBuckets (5 ms to 10 s) does not
// fit.
var (
	// commitBuckets: a group commit is an fsync or two, 100 µs to seconds.
	commitBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 12)
	// batchBuckets: writes per commit, 1 to the ledger's batch limit (64).
	batchBuckets = []float64{1, 2, 4, 8, 16, 32, 64}
	// decisionBuckets: a person's decision, seconds to a week.
	decisionBuckets = []float64{1, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 3 * 24 * 3600, 7 * 24 * 3600}
)

// conflictKinds are the values of ledger_submit_key_conflicts_total's kind.
var conflictKinds = []string{"reused", "in_progress"}

// rateLimitScopes are the values of ledger_http_rate_limited_total's scope.
var rateLimitScopes = []string{"principal", "address"}

// newMetrics registers the server's metrics on reg. With own set, reg is
// the server's own registry and also gets the Go and process collectors.
// version is ledger_build_info's.
func newMetrics(reg *prometheus.Registry, own bool, store ledger.Store, log *slog.Logger, version string) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_http_requests_total",
			Help: "HTTP requests answered, by method, route template and status code.",
		}, []string{"method", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ledger_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by method and route template.",
			Buckets: prometheus.DefBuckets,
		}, []string{"method", "route"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_http_rate_limited_total",
			Help: "Requests refused with 429 rate_limited, by scope: a principal over its rate, or a client address over its rate of 401s.",
		}, []string{"scope"}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ledger_submit_replays_total",
			Help: "Submits answered as replays of an earlier one (same Idempotency-Key and body).",
		}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_submit_key_conflicts_total",
			Help: "Submits refused for their Idempotency-Key: reused with another body (422), or still in progress (409).",
		}, []string{"kind"}),
		decisions: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ledger_approval_decision_seconds",
			Help:    "Time from an approval's request to a person's decision, by decision (granted, denied).",
			Buckets: decisionBuckets,
		}, []string{"decision"}),
		commits: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ledger_store_commit_duration_seconds",
			Help:    "Time of one group commit of the ledger's writer, BEGIN to the end of COMMIT.",
			Buckets: commitBuckets,
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ledger_store_commit_batch_writes",
			Help:    "Writes that shared one group commit.",
			Buckets: batchBuckets,
		}),
		toolCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ledger_tool_call_duration_seconds",
			Help:    "Time a tool took to answer a call, by tool and outcome (the attempt's status; interrupted when shutdown cut the call short).",
			Buckets: prometheus.DefBuckets,
		}, []string{"tool", "outcome"}),
		RecoveryDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_recovery_decisions_total",
			Help: "Decisions the recovery scan recorded, by decision.",
		}, []string{"decision"}),
	}
	// Series that exist from the start, so a dashboard shows 0 rather
	// than nothing, and rate() sees the first increment.
	for _, k := range recovery.Kinds() {
		m.RecoveryDecisions.WithLabelValues(string(k))
	}
	for _, k := range conflictKinds {
		m.conflicts.WithLabelValues(k)
	}
	for _, s := range rateLimitScopes {
		m.rateLimited.WithLabelValues(s)
	}
	for _, d := range []ledger.ApprovalState{ledger.ApprovalGranted, ledger.ApprovalDenied} {
		m.decisions.WithLabelValues(string(d))
	}
	if version == "" {
		version = "unknown"
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ledger_build_info",
		Help: "Always 1: the version of this ledger and the Go it was built with.",
	}, []string{"version", "goversion"})
	build.WithLabelValues(version, runtime.Version()).Set(1)

	cs := []prometheus.Collector{m.requests, m.duration, m.rateLimited, m.replays, m.conflicts, m.decisions,
		m.commits, m.batch, m.toolCalls, m.RecoveryDecisions, build, &storeCollector{store: store, log: log}}
	if own {
		cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// knownMethods bounds the method label.
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// observe records one answered request.
func (m *Metrics) observe(method, route string, status int, took time.Duration) {
	if !knownMethods[method] {
		method = "other"
	}
	m.requests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(method, route).Observe(took.Seconds())
}

// ObserveCommit records one group commit; it is a driver's OnCommit (sqlite.Config.OnCommit).
func (m *Metrics) ObserveCommit(c ledger.CommitStats) {
	m.commits.Observe(c.Duration.Seconds())
	m.batch.Observe(float64(c.Writes))
}

// ObserveToolCall records one tool call; it is engine.Config.OnToolCall.
// Tool names are the registered tools', so the label is bounded.
func (m *Metrics) ObserveToolCall(c engine.ToolCallStats) {
	outcome := string(c.Status)
	if c.Status == ledger.AttemptStarted {
		outcome = "interrupted"
	}
	m.toolCalls.WithLabelValues(c.Tool, outcome).Observe(c.Duration.Seconds())
}

// ObserveDecision counts one recovery decision; it is
// engine.Config.OnDecision.
func (m *Metrics) ObserveDecision(d recovery.Decision) {
	m.RecoveryDecisions.WithLabelValues(string(d.Kind)).Inc()
}

// observeApproval records a person's decision on an approval, with the
// time it waited.
func (m *Metrics) observeApproval(a *ledger.Approval) {
	if a.DecidedAt == nil || (a.State != ledger.ApprovalGranted && a.State != ledger.ApprovalDenied) {
		return
	}
	m.decisions.WithLabelValues(string(a.State)).Observe(max(a.DecidedAt.Sub(a.RequestedAt), 0).Seconds())
}

// scrapeTimeout bounds the store queries of one scrape.
const scrapeTimeout = 5 * time.Second

var (
	runsDesc = prometheus.NewDesc("ledger_runs",
		"Runs in the ledger, by state.", []string{"state"}, nil)
	actionsDesc = prometheus.NewDesc("ledger_actions",
		"Actions in the ledger, by state.", []string{"state"}, nil)
	approvalsDesc = prometheus.NewDesc("ledger_approvals",
		"Approvals in the ledger, by state.", []string{"state"}, nil)
	approvalsWaitingDesc = prometheus.NewDesc("ledger_approvals_waiting",
		"Approvals pending a person's decision.", nil, nil)
	attemptsDesc = prometheus.NewDesc("ledger_attempts",
		"Attempts in the ledger, by status and effect fact.", []string{"status", "effect"}, nil)
)

// storeCollector computes the store gauges at scrape time with one
// counting read of the store (ledger.Store.CountByState).
type storeCollector struct {
	store ledger.Store
	log   *slog.Logger
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{runsDesc, actionsDesc, approvalsDesc, approvalsWaitingDesc, attemptsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A failing query is reported as
// an invalid metric, which fails the scrape visibly rather than showing
// zeros. Every state is shown, with 0 where the ledger has none.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	n, err := c.store.CountByState(ctx)
	if err != nil {
		c.log.ErrorContext(ctx, "metrics: count the store", "err", err)
		ch <- prometheus.NewInvalidMetric(runsDesc, err)
		return
	}
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	for _, st := range ledger.RunStates() {
		gauge(runsDesc, n.Runs[st], string(st))
	}
	for _, st := range ledger.ActionStates() {
		gauge(actionsDesc, n.Actions[st], string(st))
	}
	for _, st := range ledger.ApprovalStates() {
		gauge(approvalsDesc, n.Approvals[st], string(st))
	}
	gauge(approvalsWaitingDesc, n.Approvals[ledger.ApprovalPending])
	for _, st := range ledger.AttemptStatuses() {
		for _, e := range ledger.EffectFacts() {
			gauge(attemptsDesc, n.Attempts[ledger.AttemptCountKey{Status: st, Effect: e}], string(st), string(e))
		}
	}
}

// metricsHandler serves the registry in the Prometheus text format.
func metricsHandler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slogPrinter{log},
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// slogPrinter adapts slog to promhttp's error logger.
type slogPrinter struct{ log *slog.Logger }

// Println implements promhttp.Logger.
func (p slogPrinter) Println(v ...any) {
	p.log.Error("serve metrics", "err", strings.TrimSpace(fmt.Sprintln(v...)))
}
