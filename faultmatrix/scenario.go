package faultmatrix

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// Scenario is one line of the matrix: the tool's guarantees, where the
// fault strikes, how the scenario is driven, and what must hold after.
type Scenario struct {
	Name       string               `json:"name"`
	Guarantees contracts.Guarantees `json:"guarantees"`
	Fault      string               `json:"fault"`
	// Expect is the outcome the recovery table promises for this line.
	Expect Expectation `json:"expect"`

	// AutoApprove runs serve with a rule that approves cards.write, so
	// the action and its attempt are recorded in one commit.
	AutoApprove bool `json:"-"`

	tool simulator.ToolConfig
	// python marks a client-driven scenario: it runs a Python agent, and
	// is skipped where no interpreter or client package is found.
	python bool
	// read marks a client cell whose agent's one call is a read of the
	// client read tool, not a write.
	read bool
	// replica marks a replica cell (replicas.go): several processes on one
	// PostgreSQL database, run by replicaRun instead of drive.
	replica *replicaCell
	drive   func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error)
}

// Expectation is the end state a scenario must reach. A replica cell's
// is about its runs together (replicas.go): State is what the runs whose
// attempt the fault interrupted end in, the others completing; Effects and
// Attempts are the most any one action may have.
type Expectation struct {
	State      ledger.RunState   `json:"state"`
	StopReason ledger.StopReason `json:"stop_reason,omitempty"`
	Effects    int               `json:"effects"`
	// Attempts is the number of attempts of the run's write action; 0
	// means no action was attempted.
	Attempts int `json:"attempts"`
	// Tampered marks a scenario whose chain must be reported broken.
	Tampered bool `json:"tampered,omitempty"`
}

// simEnv is the simulator configuration for the scenario's tool.
func (sc *Scenario) simEnv() (string, error) {
	cfg := sc.tool
	g := sc.Guarantees
	cfg.Guarantees = &g
	b, err := json.Marshal(simulator.Config{Tools: map[string]simulator.ToolConfig{simulator.CardsWriteTool: cfg}})
	if err != nil {
		return "", err
	}
	return "LEDGER_SIMULATOR_CONFIG=" + string(b), nil
}

func guaranteeCombos() []contracts.Guarantees {
	var out []contracts.Guarantees
	for i := range 8 {
		out = append(out, contracts.Guarantees{Query: i&4 != 0, Dedup: i&2 != 0, Cancel: i&1 != 0})
	}
	return out
}

func comboName(g contracts.Guarantees) string {
	flag := func(b bool, s string) string {
		if b {
			return s
		}
		return "no" + s
	}
	return flag(g.Query, "query") + "-" + flag(g.Dedup, "dedup") + "-" + flag(g.Cancel, "cancel")
}

var (
	allOn     = contracts.Guarantees{Query: true, Dedup: true, Cancel: true}
	completed = func(effects, attempts int) Expectation {
		return Expectation{State: ledger.RunCompleted, StopReason: ledger.StopCompleted, Effects: effects, Attempts: attempts}
	}
	review = func(effects, attempts int) Expectation {
		return Expectation{State: ledger.RunNeedsReview, Effects: effects, Attempts: attempts}
	}
)

// Catalogue is the whole matrix.
func Catalogue() []*Scenario {
	var out []*Scenario
	for _, p := range engine.FaultPoints() {
		for _, g := range guaranteeCombos() {
			out = append(out, &Scenario{Name: fmt.Sprintf("crash/%s/%s", p, comboName(g)), Guarantees: g, Fault: string(p),
				Expect: crashExpectation(p, g), drive: driveCrash(p)})
		}
	}
	for _, p := range engine.FaultPoints() {
		for _, g := range guaranteeCombos() {
			out = append(out, &Scenario{Name: fmt.Sprintf("crash-auto/%s/%s", p, comboName(g)), Guarantees: g,
				Fault: string(p) + ", action approved by a rule", AutoApprove: true,
				Expect: crashExpectation(p, g), drive: driveCrashAuto(p)})
		}
	}
	out = append(out,
		&Scenario{Name: "crash/awaiting_approval", Guarantees: allOn, Fault: string(engine.FaultAwaitingApproval),
			Expect: completed(1, 1), drive: driveCrashAwaiting},
		&Scenario{Name: "crash/during_cancellation", Guarantees: allOn, Fault: string(engine.FaultCancelStopping),
			Expect: Expectation{State: ledger.RunStopped, StopReason: ledger.StopUserCancelled}, drive: driveCrashCancel},
		&Scenario{Name: "store_write_error", Guarantees: allOn, Fault: "store_error@" + string(engine.FaultAfterToolCall),
			Expect: completed(1, 1), drive: driveStoreError},
		&Scenario{Name: "tool_timeout", Guarantees: allOn, Fault: "timeout on call 1",
			tool:   simulator.ToolConfig{TimeoutMS: ptr(int64(100)), Faults: []simulator.Fault{{Kind: simulator.FaultTimeout, Calls: []int{1}}}},
			Expect: completed(1, 2), drive: driveApproved},
		&Scenario{Name: "tool_error_then_retry", Guarantees: allOn, Fault: "error of unknown effect on call 1",
			tool:   simulator.ToolConfig{Faults: []simulator.Fault{{Kind: simulator.FaultErrorUnknown, Calls: []int{1}}}},
			Expect: completed(1, 2), drive: driveApproved},
		&Scenario{Name: "duplicate_concurrent_submit", Guarantees: allOn, Fault: "20 identical submits at once",
			Expect: completed(1, 1), drive: driveConcurrentSubmit},
		&Scenario{Name: "conflicting_key_reuse", Guarantees: allOn, Fault: "same key, other body",
			Expect: completed(1, 1), drive: driveKeyReuse},
		&Scenario{Name: "stale_digest_approval", Guarantees: allOn, Fault: "approve with another digest",
			Expect: completed(1, 1), drive: driveStaleDigest},
		&Scenario{Name: "budget_exhausted_across_restarts", Guarantees: contracts.Guarantees{Query: true},
			Fault:  "kill at " + string(engine.FaultAfterAttemptRecorded) + " on every start, 3-attempt budget",
			Expect: Expectation{State: ledger.RunStopped, StopReason: ledger.StopRetryBudgetExhausted, Attempts: 3}, drive: driveBudget},
		&Scenario{Name: "event_edited_in_database", Guarantees: allOn, Fault: "an event's data edited by hand",
			Expect: Expectation{State: ledger.RunCompleted, StopReason: ledger.StopCompleted, Effects: 1, Attempts: 1, Tampered: true},
			drive:  driveTamper},
	)
	out = append(out, timeBudgetScenarios()...)
	out = append(out, replicaScenarios()...)
	out = append(out, clientScenarios()...)
	out = append(out, clientGoneScenarios()...)
	return append(out, clientReadScenarios()...)
}

// timeBudgetScenarios kill the process mid-attempt and start it again only
// once the run's time budget has passed: the interrupted attempt counts
// until it is found interrupted, so recovery sees the budget spent, starts
// no new attempt, and stops the run with max_runtime (or, where the effect
// cannot be known, hands it to a person).
func timeBudgetScenarios() []*Scenario {
	dedupOnly := contracts.Guarantees{Dedup: true}
	stopped := func(effects int) Expectation {
		return Expectation{State: ledger.RunStopped, StopReason: ledger.StopMaxRuntime, Effects: effects, Attempts: 1}
	}
	var out []*Scenario
	for _, b := range []timeBudget{
		{name: "max_execution", field: "max_execution_ms", limit: time.Second},
		{name: "deadline", field: "deadline_ms", limit: 2 * time.Second},
	} {
		for _, c := range []struct {
			point    engine.FaultPoint
			g        contracts.Guarantees
			decision string // recovery's last decision about the action
			expect   Expectation
		}{
			// The tool was never called: the query says so, and no attempt is left.
			{engine.FaultAfterAttemptRecorded, allOn, "stop", stopped(0)},
			// The tool acted: the query finds it, it is kept, and the run stops
			// before its next step.
			{engine.FaultAfterToolCall, allOn, "reconcile", stopped(1)},
			// The tool acted and only a resend could tell: no attempt is left
			// to resend with, so a person decides.
			{engine.FaultAfterToolCall, dedupOnly, "review", review(1, 1)},
		} {
			b := b
			b.decision = c.decision
			out = append(out, &Scenario{Name: fmt.Sprintf("budget/%s/%s/%s", b.name, c.point, comboName(c.g)), Guarantees: c.g,
				Fault:  fmt.Sprintf("kill at %s, restart after the %s budget (%s) has passed", c.point, b.field, b.limit),
				Expect: c.expect, drive: driveTimeBudget(b, c.point)})
		}
	}
	return out
}

// crashExpectation is the recovery table read for one crash point.
func crashExpectation(p engine.FaultPoint, g contracts.Guarantees) Expectation {
	switch p {
	case engine.FaultAfterAttemptRecorded: // recorded, the tool never called
		if !g.Query && !g.Dedup && !g.Cancel {
			return review(0, 1)
		}
		return completed(1, 2) // established by query or cancel, or resent with the dedup key
	case engine.FaultAfterToolCall: // the tool acted, nothing recorded it
		switch {
		case g.Query:
			return completed(1, 1) // reconciled from the query, never called again
		case g.Dedup:
			return completed(1, 2) // resent; the tool deduplicated
		default:
			return review(1, 1)
		}
	default:
		return completed(1, 1)
	}
}

func ptr[T any](v T) *T { return &v }
