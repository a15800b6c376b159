package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync/atomic"

	"github.com/actionledger/ledger/contracts"
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

// faultPlan is LEDGER_FAULT_PLAN, one of three kinds:
//
//   - at a point of an attempt: {"point": "after_tool_call", "hit": 1,
//     "action": "kill"}. The hit-th time (default 1) the point is reached,
//     the process kills itself (action kill, the default), arms a store
//     failure (action store_error): the engine's next write of an
//     attempt's outcome fails as a broken disk would make it, and the
//     process carries on; or freezes itself with SIGSTOP (action stop),
//     as a process paused by its host would be, and carries on where it
//     stopped once whoever started it sends SIGCONT (faults_stop.go).
//   - at a store write: {"action": "kill", "write": 3, "at":
//     "before_commit"}. The process kills itself at the write-th write of
//     its ledger store (counted from 1 in the order the writes run, the
//     migrations at start-up not included), after the write's statements
//     ran and before its commit (before_commit), or after the commit and
//     before its caller is answered (after_commit).
//   - a full disk: {"action": "store_full", "while_file": PATH}. Every
//     write of the process fails while PATH exists (faults_store.go).
type faultPlan struct {
	Point     engine.FaultPoint `json:"point,omitempty"`
	Hit       int               `json:"hit,omitempty"`
	Action    string            `json:"action,omitempty"`
	Write     int64             `json:"write,omitempty"`
	At        ledger.WritePoint `json:"at,omitempty"`
	WhileFile string            `json:"while_file,omitempty"`
}

// faults is what the environment asks of this process.
type faults struct {
	Func      func(engine.FaultPoint)
	Simulator simulator.Config
	// WrapStore, if set, wraps the engine's store (store_error plans).
	WrapStore func(ledger.Store) ledger.Store
	// WriteFault, if set, is the ledger store's write hook (write and
	// store_full plans).
	WriteFault func(n int64, at ledger.WritePoint) error
	// UseEffects, if set, is given the simulator's effect store once it is
	// open (stop plans, which wait until the process leaves it idle).
	UseEffects func(*simulator.EffectStore)
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
	plan, err := parseFaultPlan([]byte(raw))
	if err != nil {
		return f, fmt.Errorf("%s: %w", envFaultPlan, err)
	}
	if plan.Action == actionStoreFull {
		return storeFullFaults(f, plan), nil
	}
	if plan.Write > 0 {
		f.WriteFault = func(n int64, at ledger.WritePoint) error {
			if n == plan.Write && at == plan.At {
				killSelf()
			}
			return nil
		}
		return f, nil
	}
	act := killSelf
	switch plan.Action {
	case "store_error":
		var armed atomic.Bool
		act = func() { armed.Store(true) }
		f.WrapStore = func(s ledger.Store) ledger.Store { return &failingStore{Store: s, armed: &armed} }
	case actionStop:
		var effects atomic.Pointer[simulator.EffectStore]
		f.UseEffects = effects.Store
		act = func() { stopSelf(effects.Load()) }
	}
	var hits atomic.Int64
	f.Func = func(p engine.FaultPoint) {
		if p == plan.Point && hits.Add(1) == int64(plan.Hit) {
			act()
		}
	}
	return f, nil
}

// parseFaultPlan decodes and checks a fault plan: one JSON object without
// duplicate keys, unknown fields or trailing data, naming a point of an
// attempt, a store write, or a full disk's flag file. A plan at a point
// gets hit 1 and action kill where it names none.
func parseFaultPlan(raw []byte) (faultPlan, error) {
	var plan faultPlan
	if err := ledger.CheckJSON(raw); err != nil {
		return plan, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&plan); err != nil {
		return plan, fmt.Errorf("fault plan: %w", err)
	}
	switch {
	case plan.Action == actionStoreFull:
		switch {
		case plan.WhileFile == "":
			return plan, fmt.Errorf("action %s needs while_file", actionStoreFull)
		case plan.Point != "" || plan.Hit != 0 || plan.Write != 0 || plan.At != "":
			return plan, fmt.Errorf("action %s takes no point, hit, write or at", actionStoreFull)
		}
		return plan, nil
	case plan.WhileFile != "":
		return plan, fmt.Errorf("while_file needs action %s", actionStoreFull)
	case plan.Write != 0 || plan.At != "":
		switch {
		case plan.Point != "" || plan.Hit != 0:
			return plan, errors.New("a plan names either a point (and hit) or a write (and at), not both")
		case plan.Write < 0:
			return plan, fmt.Errorf("write %d: writes are counted from 1", plan.Write)
		case plan.Write == 0:
			return plan, errors.New(`"at" needs "write": the number of the store write to kill at`)
		case !slices.Contains(ledger.WritePoints(), plan.At):
			return plan, fmt.Errorf("unknown at %q (one of %v)", plan.At, ledger.WritePoints())
		case plan.Action != "" && plan.Action != "kill":
			return plan, fmt.Errorf("unknown action %q for a write (kill)", plan.Action)
		}
		plan.Action = "kill"
		return plan, nil
	case !slices.Contains(engine.AllFaultPoints(), plan.Point):
		return plan, fmt.Errorf("unknown point %q (one of %v)", plan.Point, engine.AllFaultPoints())
	case plan.Hit < 0:
		return plan, fmt.Errorf("hit %d: hits are counted from 1", plan.Hit)
	case plan.Action != "" && plan.Action != "kill" && plan.Action != "store_error" && plan.Action != actionStop:
		return plan, fmt.Errorf("unknown action %q (kill, store_error, %s or %s)", plan.Action, actionStop, actionStoreFull)
	}
	if plan.Hit == 0 {
		plan.Hit = 1
	}
	if plan.Action == "" {
		plan.Action = "kill"
	}
	return plan, nil
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

// openLocalService opens the service on a database file for a local
// command (recover, worker), with whatever fault plan and simulator
// settings the process's environment holds, and the signing key of
// signingKeyFlag or $LEDGER_SIGNING_KEY_FILE if either names one
// (allowUnsigned: --allow-unsigned). Its warnings go to stderr.
func openLocalService(ctx context.Context, stderr io.Writer, dbPath, signingKeyFlag, configFlag string, allowUnsigned bool) (*service, error) {
	f, err := faultsFromEnv()
	if err != nil {
		return nil, err
	}
	// The same agents as serve's: a run of an agent this process does not
	// know would be stopped as internal_error.
	cfg, err := loadConfig(configFrom(configFlag))
	if err != nil {
		return nil, err
	}
	var rules *contracts.Rules
	if cfg != nil {
		rules = cfg.Rules
	}
	warnings := warningLogger(stderr)
	key, err := signingKeyFrom(warnings, signingKeyFlag)
	if err != nil {
		return nil, err
	}
	return openService(ctx, serviceConfig{DBPath: dbPath, Simulator: f.Simulator, FaultFunc: f.Func,
		WrapStore: f.WrapStore, WriteFault: f.WriteFault, OnEffects: f.UseEffects, Logger: discardLogger(), SigningKey: key, Config: cfg, Rules: rules,
		AllowUnsigned: allowUnsigned, Warnings: warnings})
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
