package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// ledgerBinary builds the real binary once for the package's tests.
func ledgerBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ledger-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "ledger")
		out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return builtBin
}

// crashEnv is the environment of a worker process: the simulator's tool
// guarantees and, for the process meant to die, the fault plan.
func crashEnv(t *testing.T, g contracts.Guarantees, point engine.FaultPoint) []string {
	t.Helper()
	sim, err := json.Marshal(map[string]any{"tools": map[string]any{"cards.write": map[string]any{
		"guarantees": map[string]bool{"query": g.Query, "dedup": g.Dedup, "cancel": g.Cancel}}}})
	require.NoError(t, err)
	env := append(os.Environ(), envSimulatorConfig+"="+string(sim))
	if point != "" {
		env = append(env, envFaultPlan+`={"point":"`+string(point)+`"}`)
	}
	return env
}

// runWorker starts `ledger worker --until-idle` and waits; it reports
// whether the process was killed by SIGKILL.
func runWorker(t *testing.T, db string, env []string) (killed bool) {
	t.Helper()
	cmd := exec.Command(ledgerBinary(t), "worker", "--db", db, "--until-idle")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	require.NoError(t, err, "worker: %s", out)
	return false
}

// approvedRun submits a practice-cards run in-process and approves its
// write action as bob, leaving it for a worker process to execute.
func approvedRun(t *testing.T, db string, g contracts.Guarantees, limits ledger.BudgetLimits) (ledger.RunID, ledger.ActionID) {
	t.Helper()
	ctx := context.Background()
	svc, err := openService(ctx, serviceConfig{DBPath: db, Logger: discardLogger(),
		Simulator: simulator.Config{Tools: map[string]simulator.ToolConfig{"cards.write": {Guarantees: &g}}}})
	require.NoError(t, err)
	defer svc.Close()
	title, md := simulator.SampleDocument()
	input, err := json.Marshal(map[string]string{"title": title, "markdown": md})
	require.NoError(t, err)
	res, err := svc.store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "crash-1", Principal: "alice",
		Agent: "practice-cards", Input: input, Budgets: limits})
	require.NoError(t, err)
	require.NoError(t, svc.engine.Advance(ctx, res.Run.ID))
	pending, err := svc.approvals.Pending(ctx, "acme", 1)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	_, err = svc.approvals.Decide(ctx, approval.DecideParams{Tenant: "acme", Principal: "bob", ActionID: pending[0].ActionID,
		ActionDigest: pending[0].ActionDigest, Decision: ledger.DecisionGrant})
	require.NoError(t, err)
	return res.Run.ID, pending[0].ActionID
}

// outcome is what the ledger and the independent effect store say after
// the restart.
type outcome struct {
	run      *ledger.Run
	action   *ledger.Action
	attempts []*ledger.Attempt
	effects  []simulator.Effect
	events   []*ledger.Event
}

func readOutcome(t *testing.T, db string, run ledger.RunID, action ledger.ActionID) outcome {
	t.Helper()
	ctx := context.Background()
	store, err := sqlite.OpenStore(ctx, sqlite.Config{Path: db})
	require.NoError(t, err)
	defer store.Close()
	effects, err := simulator.OpenEffectStore(ctx, db+".effects.db", nil)
	require.NoError(t, err)
	defer effects.Close()
	var o outcome
	o.run, err = store.FindRunByID(ctx, run)
	require.NoError(t, err)
	o.action, err = store.FindActionByID(ctx, action)
	require.NoError(t, err)
	o.attempts, err = store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &action})
	require.NoError(t, err)
	o.effects, err = effects.Effects(ctx)
	require.NoError(t, err)
	o.events, err = store.FindEvents(ctx, run)
	require.NoError(t, err)
	rep, err := store.VerifyChain(ctx, run)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	return o
}

func (o outcome) decisions(kind string) []string {
	var why []string
	for _, e := range o.events {
		var d struct{ Decision, Rationale string }
		if e.Type == "recovery.decision" && json.Unmarshal(e.Data, &d) == nil && d.Decision == kind {
			why = append(why, d.Rationale)
		}
	}
	return why
}

func allGuarantees() []contracts.Guarantees {
	var out []contracts.Guarantees
	for i := range 8 {
		out = append(out, contracts.Guarantees{Query: i&4 != 0, Dedup: i&2 != 0, Cancel: i&1 != 0})
	}
	return out
}

// TestCrashPoints kills a real `ledger worker` with SIGKILL at each crash
// point of an attempt, for every combination of tool guarantees, starts it
// again, and checks against the simulator's own effect store that no
// action acted twice, no effect the tool made was lost, and every unknown
// effect ended in review with a rationale.
func TestCrashPoints(t *testing.T) {
	ledgerBinary(t)
	for _, point := range engine.FaultPoints() {
		for _, g := range allGuarantees() {
			t.Run(fmt.Sprintf("%s/query=%t,dedup=%t,cancel=%t", point, g.Query, g.Dedup, g.Cancel), func(t *testing.T) {
				t.Parallel()
				db := filepath.Join(t.TempDir(), "ledger.db")
				run, action := approvedRun(t, db, g, ledger.BudgetLimits{})
				require.True(t, runWorker(t, db, crashEnv(t, g, point)), "the fault plan killed the worker")
				require.False(t, runWorker(t, db, crashEnv(t, g, "")), "the restarted worker finishes")
				o := readOutcome(t, db, run, action)

				// Never two effects for one action.
				require.LessOrEqual(t, len(o.effects), 1, "effects: %+v", o.effects)
				for _, e := range o.effects {
					require.Equal(t, o.action.DedupKey, e.DedupKey)
				}
				// What the tool did is never lost: an effect in the tool's
				// store is either recorded as succeeded or in review.
				if len(o.effects) == 1 {
					require.Contains(t, []ledger.ActionState{ledger.ActionSucceeded, ledger.ActionNeedsReview}, o.action.State)
				}
				// Every unknown effect ends in review, with a rationale.
				if o.action.State == ledger.ActionNeedsReview {
					require.Equal(t, ledger.RunNeedsReview, o.run.State)
					require.NotEmpty(t, o.decisions("review"), "a review decision was recorded")
					require.Equal(t, ledger.EffectUnknown, o.attempts[len(o.attempts)-1].Effect)
				}

				want := expectedCrashOutcome(point, g)
				require.Equal(t, want.state, o.run.State, "run: %s", o.run.StopReason)
				require.Len(t, o.effects, want.effects)
				require.Len(t, o.attempts, want.attempts)
			})
		}
	}
}

type crashExpectation struct {
	state    ledger.RunState
	effects  int
	attempts int
}

// expectedCrashOutcome is the recovery table read for one crash point.
func expectedCrashOutcome(p engine.FaultPoint, g contracts.Guarantees) crashExpectation {
	done1 := crashExpectation{ledger.RunCompleted, 1, 1}
	switch p {
	case engine.FaultAfterAttemptRecorded: // no call was made
		if !g.Query && !g.Dedup && !g.Cancel {
			return crashExpectation{ledger.RunNeedsReview, 0, 1}
		}
		return crashExpectation{ledger.RunCompleted, 1, 2} // query/resend/cancel, then one new attempt
	case engine.FaultAfterToolCall: // the tool acted; nothing recorded it
		switch {
		case g.Query:
			return done1 // reconciled from the query
		case g.Dedup:
			return crashExpectation{ledger.RunCompleted, 1, 2} // resent; the tool deduplicated
		default:
			return crashExpectation{ledger.RunNeedsReview, 1, 1}
		}
	default: // before the attempt was recorded, or after its result was
		return done1
	}
}

// TestBudgetSurvivesRestarts: a 3-attempt budget allows no 4th attempt,
// however many times the process dies mid-attempt.
func TestBudgetSurvivesRestarts(t *testing.T) {
	t.Parallel()
	ledgerBinary(t)
	g := contracts.Guarantees{Query: true}
	db := filepath.Join(t.TempDir(), "ledger.db")
	run, action := approvedRun(t, db, g, ledger.BudgetLimits{MaxAttemptsPerAction: 3})
	kills := 0
	for range 10 {
		if !runWorker(t, db, crashEnv(t, g, engine.FaultAfterAttemptRecorded)) {
			break
		}
		kills++
	}
	require.Equal(t, 3, kills, "each of the three attempts died; the fourth was never started")
	o := readOutcome(t, db, run, action)
	require.Len(t, o.attempts, 3)
	require.Equal(t, ledger.RunStopped, o.run.State)
	require.Equal(t, ledger.StopRetryBudgetExhausted, o.run.StopReason)
	require.Equal(t, int64(3), o.run.Budget.Used.Attempts)
	require.Empty(t, o.effects)
	for _, a := range o.attempts {
		require.Equal(t, ledger.EffectNotHappened, a.Effect, "each established by query before deciding")
	}
}
