package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/simulator"
)

// Fault plans exist for the crash tests and the fault matrix: a process
// started with LEDGER_FAULT_PLAN kills itself with SIGKILL at the named
// point of an attempt, and LEDGER_SIMULATOR_CONFIG sets the simulated
// tools' guarantees and faults. Only the environment of the process sets
// them — whoever starts it — never a request, and `serve` logs loudly when
// one is present.
const (
	envFaultPlan       = "LEDGER_FAULT_PLAN"
	envSimulatorConfig = "LEDGER_SIMULATOR_CONFIG"
)

// faultPlan is LEDGER_FAULT_PLAN: {"point": "after_tool_call", "hit": 1}
// kills the process the hit-th time (default 1) the point is reached.
type faultPlan struct {
	Point engine.FaultPoint `json:"point"`
	Hit   int               `json:"hit,omitempty"`
}

// faultsFromEnv reads the fault plan and simulator configuration of the
// environment; both are optional.
func faultsFromEnv() (func(engine.FaultPoint), simulator.Config, error) {
	var sim simulator.Config
	if raw := os.Getenv(envSimulatorConfig); raw != "" {
		var err error
		if sim, err = simulator.ParseConfig([]byte(raw)); err != nil {
			return nil, sim, fmt.Errorf("%s: %w", envSimulatorConfig, err)
		}
	}
	raw := os.Getenv(envFaultPlan)
	if raw == "" {
		return nil, sim, nil
	}
	var plan faultPlan
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&plan); err != nil {
		return nil, sim, fmt.Errorf("%s: %w", envFaultPlan, err)
	}
	if !slices.Contains(engine.AllFaultPoints(), plan.Point) {
		return nil, sim, fmt.Errorf("%s: unknown point %q (one of %v)", envFaultPlan, plan.Point, engine.AllFaultPoints())
	}
	if plan.Hit <= 0 {
		plan.Hit = 1
	}
	var (
		mu   sync.Mutex
		hits int
	)
	return func(p engine.FaultPoint) {
		if p != plan.Point {
			return
		}
		mu.Lock()
		hits++
		n := hits
		mu.Unlock()
		if n == plan.Hit {
			killSelf()
		}
	}, sim, nil
}

// killSelf ends the process at once, as a power cut or OOM kill would: no
// deferred function, no flush, no graceful anything.
func killSelf() {
	p, err := os.FindProcess(os.Getpid())
	if err == nil {
		_ = p.Kill()
	}
	select {} // the signal is on its way
}
