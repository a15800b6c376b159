package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync/atomic"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
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

// faultPlan is LEDGER_FAULT_PLAN: {"point": "after_tool_call", "hit": 1,
// "action": "kill"}. The hit-th time (default 1) the point is reached, the
// process kills itself (action kill, the default) or arms a store failure
// (action store_error): the engine's next write of an attempt's outcome
// fails as a broken disk would make it, and the process carries on.
type faultPlan struct {
	Point  engine.FaultPoint `json:"point"`
	Hit    int               `json:"hit,omitempty"`
	Action string            `json:"action,omitempty"`
}

// faults is what the environment asks of this process.
type faults struct {
	Func      func(engine.FaultPoint)
	Simulator simulator.Config
	// WrapStore, if set, wraps the engine's store (store_error plans).
	WrapStore func(ledger.Store) ledger.Store
}

// faultsFromEnv reads the fault plan and simulator configuration of the
// environment; both are optional.
func faultsFromEnv() (faults, error) {
	var f faults
	if raw := os.Getenv(envSimulatorConfig); raw != "" {
		var err error
		if f.Simulator, err = simulator.ParseConfig([]byte(raw)); err != nil {
			return f, fmt.Errorf("%s: %w", envSimulatorConfig, err)
		}
	}
	raw := os.Getenv(envFaultPlan)
	if raw == "" {
		return f, nil
	}
	var plan faultPlan
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&plan); err != nil {
		return f, fmt.Errorf("%s: %w", envFaultPlan, err)
	}
	if !slices.Contains(engine.AllFaultPoints(), plan.Point) {
		return f, fmt.Errorf("%s: unknown point %q (one of %v)", envFaultPlan, plan.Point, engine.AllFaultPoints())
	}
	if plan.Hit <= 0 {
		plan.Hit = 1
	}
	act := killSelf
	switch plan.Action {
	case "", "kill":
	case "store_error":
		var armed atomic.Bool
		act = func() { armed.Store(true) }
		f.WrapStore = func(s ledger.Store) ledger.Store { return &failingStore{Store: s, armed: &armed} }
	default:
		return f, fmt.Errorf("%s: unknown action %q (kill or store_error)", envFaultPlan, plan.Action)
	}
	var hits atomic.Int64
	f.Func = func(p engine.FaultPoint) {
		if p == plan.Point && hits.Add(1) == int64(plan.Hit) {
			act()
		}
	}
	return f, nil
}

// failingStore fails the next FinishAttempt once armed: the outcome of a
// call that really happened cannot be written.
type failingStore struct {
	ledger.Store
	armed *atomic.Bool
}

// FinishAttempt fails once when armed, else passes through.
func (s *failingStore) FinishAttempt(ctx context.Context, p ledger.FinishAttemptParams) (ledger.FinishAttemptResult, error) {
	if s.armed.CompareAndSwap(true, false) {
		return ledger.FinishAttemptResult{}, ledger.Errorf(ledger.CodeInternal, "finish attempt: disk I/O error (fault plan)")
	}
	return s.Store.FinishAttempt(ctx, p)
}

// openLocalService opens the service on a database file for the local
// commands (recover, worker), with whatever fault plan and simulator
// settings the process's environment holds, and the signing key of
// signingKeyFlag or $LEDGER_SIGNING_KEY_FILE if either names one.
func openLocalService(ctx context.Context, dbPath, signingKeyFlag string) (*service, error) {
	f, err := faultsFromEnv()
	if err != nil {
		return nil, err
	}
	key, err := signingKeyFrom(signingKeyFlag)
	if err != nil {
		return nil, err
	}
	return openService(ctx, serviceConfig{DBPath: dbPath, Simulator: f.Simulator, FaultFunc: f.Func,
		WrapStore: f.WrapStore, Logger: discardLogger(), SigningKey: key})
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
