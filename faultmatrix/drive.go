package faultmatrix

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	_ "github.com/mattn/go-sqlite3" // to edit an event by hand, as an intruder would
)

const wait = 30 * time.Second

func planEnv(point engine.FaultPoint, action string) string {
	plan := map[string]string{"point": string(point)}
	if action != "" {
		plan["action"] = action
	}
	b, _ := json.Marshal(plan)
	return "LEDGER_FAULT_PLAN=" + string(b)
}

// awaitingAction waits for the run to wait for approval and returns the
// action waiting.
func awaitingAction(h *harness, id ledger.RunID) (server.Action, error) {
	r, err := h.waitRun(id, wait, func(r server.Run) bool { return r.State == ledger.RunAwaitingApproval })
	if err != nil {
		return server.Action{}, err
	}
	for _, a := range r.Actions {
		if a.State == ledger.ActionAwaitingApproval {
			return a, nil
		}
	}
	return server.Action{}, fmt.Errorf("run %s awaits approval but no action does", id)
}

// submitAndApprove submits the practice-cards run and approves its write
// action; an approval that races the fault plan's kill may lose its answer,
// so the caller checks the outcome, not the reply.
func submitAndApprove(h *harness, key string, budgets map[string]int64) (ledger.RunID, error) {
	sub, _, err := h.submit(key, budgets)
	if err != nil {
		return "", err
	}
	a, err := awaitingAction(h, sub.ID)
	if err != nil {
		return sub.ID, err
	}
	_, _ = h.decide(a.ID, a.ActionDigest, "approve")
	return sub.ID, nil
}

// startScenario starts serve with the scenario's simulator settings and
// any extra environment (a fault plan).
func startScenario(ctx context.Context, h *harness, sc *Scenario, env ...string) error {
	sim, err := sc.simEnv()
	if err != nil {
		return err
	}
	return h.start(ctx, append([]string{sim}, env...)...)
}

// approveAndFinish approves the action the run waits for and waits until
// the run needs nothing more from the engine.
func approveAndFinish(h *harness, id ledger.RunID) error {
	a, err := awaitingAction(h, id)
	if err != nil {
		return err
	}
	if _, err := h.decide(a.ID, a.ActionDigest, "approve"); err != nil {
		return err
	}
	_, err = h.waitRun(id, wait, finished)
	return err
}

func finished(r server.Run) bool {
	return r.State.Terminal() || r.State == ledger.RunNeedsReview
}

// restart starts serve again without a fault plan and waits for the run to
// settle: recovery at start-up, then the workers.
func restart(ctx context.Context, h *harness, sc *Scenario, id ledger.RunID) error {
	if err := startScenario(ctx, h, sc); err != nil {
		return err
	}
	_, err := h.waitRun(id, wait, finished)
	return err
}

func driveCrash(p engine.FaultPoint) func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	return func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
		if err := startScenario(ctx, h, sc, planEnv(p, "")); err != nil {
			return "", err
		}
		id, err := submitAndApprove(h, "crash-1", nil)
		if err != nil {
			return id, err
		}
		if err := h.waitKilled(wait); err != nil {
			return id, err
		}
		return id, restart(ctx, h, sc, id)
	}
}

// driveCrashAuto is driveCrash for an action the rules approve: its
// attempt is recorded in the same commit as the action.
func driveCrashAuto(p engine.FaultPoint) func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	return func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
		if err := startScenario(ctx, h, sc, planEnv(p, "")); err != nil {
			return "", err
		}
		id, err := submitThroughCrash(ctx, h, sc, "crash-auto-1")
		if err != nil {
			return id, err
		}
		_, err = h.waitRun(id, wait, finished)
		return id, err
	}
}

// submitThroughCrash submits a run to a process whose fault plan kills it
// once the engine picks the run up, waits for the kill and starts serve
// again. The worker the submit wakes may reach the fault point before the
// submit's answer is written; a client that lost the answer that way sends
// the same request again, and the idempotency key resolves it to the run
// the first one created (or creates it, if the first never committed).
func submitThroughCrash(ctx context.Context, h *harness, sc *Scenario, key string) (ledger.RunID, error) {
	sub, _, submitErr := h.submit(key, nil)
	if err := h.waitKilled(wait); err != nil {
		return sub.ID, errors.Join(submitErr, err)
	}
	if err := startScenario(ctx, h, sc); err != nil {
		return sub.ID, err
	}
	if submitErr != nil {
		var err error
		if sub, _, err = h.submit(key, nil); err != nil {
			return "", fmt.Errorf("submit again after losing the answer (%v): %w", submitErr, err)
		}
	}
	return sub.ID, nil
}

func driveCrashAwaiting(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	if err := startScenario(ctx, h, sc, planEnv(engine.FaultAwaitingApproval, "")); err != nil {
		return "", err
	}
	id, err := submitThroughCrash(ctx, h, sc, "await-1")
	if err != nil {
		return id, err
	}
	return id, approveAndFinish(h, id)
}

func driveCrashCancel(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	if err := startScenario(ctx, h, sc, planEnv(engine.FaultCancelStopping, "")); err != nil {
		return "", err
	}
	sub, _, err := h.submit("cancel-1", nil)
	if err != nil {
		return "", err
	}
	if _, err := awaitingAction(h, sub.ID); err != nil {
		return sub.ID, err
	}
	_, _ = h.cancel(sub.ID) // the process dies while answering
	if err := h.waitKilled(wait); err != nil {
		return sub.ID, err
	}
	return sub.ID, restart(ctx, h, sc, sub.ID)
}

func driveStoreError(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	if err := startScenario(ctx, h, sc, planEnv(engine.FaultAfterToolCall, "store_error")); err != nil {
		return "", err
	}
	id, err := submitAndApprove(h, "store-1", nil)
	if err != nil {
		return id, err
	}
	_, err = h.waitRun(id, wait, finished)
	return id, err
}

func driveApproved(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	if err := startScenario(ctx, h, sc); err != nil {
		return "", err
	}
	id, err := submitAndApprove(h, "run-1", nil)
	if err != nil {
		return id, err
	}
	_, err = h.waitRun(id, wait, finished)
	return id, err
}

func driveConcurrentSubmit(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	if err := startScenario(ctx, h, sc); err != nil {
		return "", err
	}
	const n = 20
	var wg sync.WaitGroup
	ids := make([]ledger.RunID, n)
	codes := make([]int, n)
	for i := range n {
		wg.Go(func() {
			sub, code, _ := h.submit("same-key", nil)
			ids[i], codes[i] = sub.ID, code
		})
	}
	wg.Wait()
	var id ledger.RunID
	for i := range n {
		switch codes[i] {
		case http.StatusCreated:
			if id != "" && ids[i] != id {
				return id, fmt.Errorf("two runs for one key: %s and %s", id, ids[i])
			}
			id = ids[i]
		case http.StatusConflict: // the first request was still in progress
		default:
			return id, fmt.Errorf("submit answered %d", codes[i])
		}
	}
	if id == "" {
		return "", fmt.Errorf("no submit got 201")
	}
	var list server.RunList
	if _, err := h.do(http.MethodGet, "/v1/runs", nil, nil, &list); err != nil {
		return id, err
	}
	if len(list.Runs) != 1 {
		return id, fmt.Errorf("%d runs after %d identical submits", len(list.Runs), n)
	}
	return id, approveAndFinish(h, id)
}

func driveKeyReuse(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	if err := startScenario(ctx, h, sc); err != nil {
		return "", err
	}
	sub, _, err := h.submit("reused", nil)
	if err != nil {
		return "", err
	}
	before, err := h.run(sub.ID)
	if err != nil {
		return sub.ID, err
	}
	_, code, _ := h.submit("reused", map[string]int64{"max_steps": 7})
	if code != http.StatusUnprocessableEntity {
		return sub.ID, fmt.Errorf("key reuse with another body answered %d, want 422", code)
	}
	after, err := h.run(sub.ID)
	if err != nil {
		return sub.ID, err
	}
	if after.Budget.Limits.MaxSteps != before.Budget.Limits.MaxSteps {
		return sub.ID, fmt.Errorf("the refused request changed the run's budget")
	}
	return sub.ID, approveAndFinish(h, sub.ID)
}

func driveStaleDigest(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	if err := startScenario(ctx, h, sc); err != nil {
		return "", err
	}
	sub, _, err := h.submit("stale-1", nil)
	if err != nil {
		return "", err
	}
	a, err := awaitingAction(h, sub.ID)
	if err != nil {
		return sub.ID, err
	}
	stale := ledger.Digest("sha256:" + strings.Repeat("0", 64))
	if code, _ := h.decide(a.ID, stale, "approve"); code != http.StatusConflict {
		return sub.ID, fmt.Errorf("approve with a stale digest answered %d, want 409", code)
	}
	effects, err := h.effects(ctx)
	if err != nil {
		return sub.ID, err
	}
	if len(effects) != 0 {
		return sub.ID, fmt.Errorf("a refused approval let the tool act")
	}
	if err := approveAndFinish(h, sub.ID); err != nil {
		return sub.ID, fmt.Errorf("after the refused approval: %w", err)
	}
	return sub.ID, nil
}

func driveBudget(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	plan := planEnv(engine.FaultAfterAttemptRecorded, "")
	if err := startScenario(ctx, h, sc, plan); err != nil {
		return "", err
	}
	id, err := submitAndApprove(h, "budget-1", map[string]int64{"max_attempts_per_action": 3})
	if err != nil {
		return id, err
	}
	for kills := 0; ; kills++ {
		if kills > 6 {
			return id, fmt.Errorf("still killed after %d restarts: the budget did not hold", kills)
		}
		if err := h.waitKilled(wait); err != nil {
			return id, err
		}
		if err := startScenario(ctx, h, sc, plan); err != nil {
			return id, err
		}
		if _, err := h.waitRun(id, wait, finished); err == nil {
			return id, nil
		}
	}
}

func driveTamper(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	id, err := driveApproved(ctx, h, sc)
	if err != nil {
		return id, err
	}
	if err := h.stop(); err != nil {
		return id, err
	}
	db, err := sql.Open("sqlite3", "file:"+h.db+"?_busy_timeout=5000")
	if err != nil {
		return id, err
	}
	defer db.Close()
	for _, q := range []string{`DROP TRIGGER events_no_update`,
		`UPDATE events SET data = '{"agent":"someone-else"}' WHERE run_id = '` + string(id) + `' AND seq = 1`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return id, fmt.Errorf("tamper: %w", err)
		}
	}
	out, code, err := h.cli("evidence", "verify", string(id), "--db", h.db)
	switch {
	case err != nil:
		return id, err
	case code != 1:
		return id, fmt.Errorf("evidence verify exited %d on a tampered chain: %s", code, out)
	}
	return id, startScenario(ctx, h, sc)
}

// timeBudget is a run's time budget a scenario spends while the process
// is dead.
type timeBudget struct {
	name  string
	field string // of the submit's budgets
	limit time.Duration
	// decision is what recovery must decide last about the action once it
	// finds the attempt interrupted with the budget spent.
	decision string
}

// driveTimeBudget submits a run with the budget, approves it, lets the plan
// kill serve mid-attempt, waits until the budget has passed with the
// process dead, starts serve again and lets the run settle. It then checks
// that the interrupted attempt was closed as interrupted when recovery
// found it, after the restart, and that its time up to then counts in the
// run's execution budget.
func driveTimeBudget(b timeBudget, point engine.FaultPoint) func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	return func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
		if err := startScenario(ctx, h, sc, planEnv(point, "")); err != nil {
			return "", err
		}
		submitted := time.Now()
		id, err := submitAndApprove(h, "time-1", map[string]int64{b.field: b.limit.Milliseconds()})
		if err != nil {
			return id, err
		}
		if err := h.waitKilled(wait); err != nil {
			return id, err
		}
		// Both budgets are spent once the limit has passed since the submit:
		// the deadline counts from it, and the attempt started after it.
		select {
		case <-time.After(time.Until(submitted.Add(b.limit + 200*time.Millisecond))):
		case <-ctx.Done():
			return id, ctx.Err()
		}
		restarted := time.Now()
		if err := restart(ctx, h, sc, id); err != nil {
			return id, err
		}
		r, err := h.run(id)
		if err != nil {
			return id, err
		}
		var first *server.Attempt
		for _, a := range r.Actions {
			if len(a.Attempts) > 0 {
				first = &a.Attempts[0]
			}
		}
		switch {
		case first == nil:
			return id, fmt.Errorf("no attempt was recorded")
		case first.FinishedAt == nil:
			return id, fmt.Errorf("attempt %s was never closed", first.ID)
		case first.Error == nil || first.Error.Code != "interrupted":
			return id, fmt.Errorf("attempt %s was closed as %s (%+v), not as interrupted", first.ID, first.Status, first.Error)
		case first.FinishedAt.Before(restarted.Add(-time.Second)): // the server's clock against ours: a second of slack
			return id, fmt.Errorf("attempt %s was closed at %s, before the restart at %s", first.ID, first.FinishedAt, restarted)
		}
		// The API gives the execution used in whole milliseconds, rounded
		// down: compare in those.
		counted := first.FinishedAt.Sub(first.StartedAt).Milliseconds()
		if used := r.Budget.Used.ExecutionMS; used < counted {
			return id, fmt.Errorf("the run's execution budget used %dms, less than the interrupted attempt's %dms", used, counted)
		}
		if used := r.Budget.Used.ExecutionMS; b.field == "max_execution_ms" && used < b.limit.Milliseconds() {
			return id, fmt.Errorf("the run stopped having used %dms of its %s execution budget", used, b.limit)
		}
		tl, err := h.timeline(id)
		if err != nil {
			return id, err
		}
		var last string
		for _, e := range tl.Events {
			var d struct{ Decision string }
			if e.Type == "recovery.decision" && json.Unmarshal(e.Data, &d) == nil {
				last = d.Decision
			}
		}
		if last != b.decision {
			return id, fmt.Errorf("recovery decided %q last, want %q: the interrupted attempt's time must count in its budget verdict", last, b.decision)
		}
		return id, nil
	}
}
