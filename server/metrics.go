package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/actionledger/ledger/ledger"
)

// Metrics are the Prometheus metrics the server registers. The store
// gauges (ledger_runs, ledger_approvals_waiting, ledger_attempts) are
// computed when scraped.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// RecoveryDecisions counts the decisions of the recovery scan by
	// decision (continue, reconcile, stop, review); the scan increments it.
	RecoveryDecisions *prometheus.CounterVec
}

// newMetrics registers the server's metrics on reg. With own set, reg is
// the server's own registry and also gets the Go and process collectors.
func newMetrics(reg *prometheus.Registry, own bool, store ledger.Store, log *slog.Logger) (*Metrics, error) {
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
		RecoveryDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_recovery_decisions_total",
			Help: "Decisions the recovery scan recorded, by decision.",
		}, []string{"decision"}),
	}
	cs := []prometheus.Collector{m.requests, m.duration, m.RecoveryDecisions, &storeCollector{store: store, log: log}}
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

// scrapeTimeout bounds the store queries of one scrape.
const scrapeTimeout = 5 * time.Second

var (
	runsDesc = prometheus.NewDesc("ledger_runs",
		"Runs in the ledger, by state.", []string{"state"}, nil)
	approvalsWaitingDesc = prometheus.NewDesc("ledger_approvals_waiting",
		"Approvals pending a person's decision.", nil, nil)
	attemptsDesc = prometheus.NewDesc("ledger_attempts",
		"Attempts in the ledger, by status and effect fact.", []string{"status", "effect"}, nil)
)

// storeCollector computes the store gauges at scrape time. The Store has no
// counting queries, so it lists rows and counts them: one query per run
// state and attempt status, loading whole rows. That is fine for a ledger
// of thousands of runs; a larger one needs count methods on the Store.
type storeCollector struct {
	store ledger.Store
	log   *slog.Logger
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- runsDesc
	ch <- approvalsWaitingDesc
	ch <- attemptsDesc
}

// Collect implements prometheus.Collector. A failing query is reported as
// an invalid metric, which fails the scrape visibly rather than showing
// zeros.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	fail := func(d *prometheus.Desc, err error) {
		c.log.ErrorContext(ctx, "metrics: query the store", "err", err)
		ch <- prometheus.NewInvalidMetric(d, err)
	}
	for _, st := range ledger.RunStates() {
		runs, err := c.store.FindRuns(ctx, ledger.RunFilter{State: &st})
		if err != nil {
			fail(runsDesc, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(len(runs)), string(st))
	}
	pending := ledger.ApprovalPending
	aprs, err := c.store.FindApprovals(ctx, ledger.ApprovalFilter{State: &pending})
	if err != nil {
		fail(approvalsWaitingDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(approvalsWaitingDesc, prometheus.GaugeValue, float64(len(aprs)))
	for _, st := range ledger.AttemptStatuses() {
		atts, err := c.store.FindAttempts(ctx, ledger.AttemptFilter{Status: &st})
		if err != nil {
			fail(attemptsDesc, err)
			return
		}
		n := map[ledger.EffectFact]int{}
		for _, a := range atts {
			n[a.Effect]++
		}
		for _, e := range ledger.EffectFacts() {
			ch <- prometheus.MustNewConstMetric(attemptsDesc, prometheus.GaugeValue, float64(n[e]), string(st), string(e))
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
