package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/actionledger/ledger/storehealth"
)

var storeErrorsDesc = prometheus.NewDesc("ledger_store_errors_total",
	"Calls of the ledger store that failed (I/O, a full disk: not a lost race or another answer of the ledger), "+
		"by store operation, from the engine's workers and the HTTP handlers alike.",
	[]string{"op"}, nil)

// storeErrorsCollector exports the store health's counts as
// ledger_store_errors_total{op}, every operation of the Store present from
// the start so rates need no first failure.
type storeErrorsCollector struct{ health *storehealth.Tracker }

// Describe implements prometheus.Collector.
func (c storeErrorsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- storeErrorsDesc }

// Collect implements prometheus.Collector.
func (c storeErrorsCollector) Collect(ch chan<- prometheus.Metric) {
	for op, n := range c.health.Errors() {
		ch <- prometheus.MustNewConstMetric(storeErrorsDesc, prometheus.CounterValue, float64(n), op)
	}
}
