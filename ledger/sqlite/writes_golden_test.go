package sqlite_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
)

// update rewrites the golden files: go test ./ledger/sqlite -run Golden -update
var update = flag.Bool("update", false, "rewrite testdata/<Test>.golden")

// golden compares got with testdata/<Test>.golden.
func golden(t *testing.T, got string) {
	t.Helper()
	path := filepath.Join("testdata", t.Name()+".golden")
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create it")
	require.Equal(t, string(want), got, "golden file %s: what the writes stored changed (run with -update to rewrite, if that is meant)", path)
}

// TestWritesGolden holds what the hot writes store — every row of every
// table, the events with their hashes and the signed heads — to what they
// stored when the golden file was written, byte for byte: with a fake
// clock, sequential ids and a fixed signing key the same calls write the
// same database. A change that only makes the writes cheaper (fewer
// statements, rows inserted in their final state, digests taken once)
// leaves the file as it is; one that changes what the chain records does
// not, and says so by rewriting it.
func TestWritesGolden(t *testing.T) {
	ctx := context.Background()
	clock := ledgertest.NewClock()
	path := filepath.Join(t.TempDir(), "ledger.db")
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	store, err := sqlite.OpenStore(ctx, sqlite.Config{Path: path, Now: clock.Now, NewID: ledgertest.SequentialIDs(), SigningKey: key})
	require.NoError(t, err)
	tick := func() { clock.Advance(1500 * time.Microsecond) }
	audit := ledger.GateAudit{Rule: 0, Reason: "auto", RulesDigest: ledger.DigestCanonical([]byte(`{}`))}
	usage := func() *ledger.AddUsageParams {
		return &ledger.AddUsageParams{Steps: 1, Tokens: 15, Execution: 700 * time.Microsecond}
	}
	create := func(run ledger.RunID, key string, gate ledger.ActionState, start bool, mod func(*ledger.CreateActionParams)) ledger.CreateActionResult {
		t.Helper()
		tick()
		p := ledger.CreateActionParams{RunID: run, IdempotencyKey: key, Tool: "cards.write", ToolVersion: "1",
			Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{ "title": "t", "cards": [{"front":"q","back":"a"}] }`),
			Gate: gate, GateAudit: audit, Actor: "engine", Usage: usage(), StartAttempt: start, ApprovalTTL: time.Hour}
		if mod != nil {
			mod(&p)
		}
		res, err := store.CreateAction(ctx, p)
		require.NoError(t, err)
		return res
	}
	finish := func(att ledger.AttemptID, p ledger.FinishAttemptParams) ledger.FinishAttemptResult {
		t.Helper()
		tick()
		p.AttemptID, p.Actor = att, "engine"
		res, err := store.FinishAttempt(ctx, p)
		require.NoError(t, err)
		return res
	}
	succeeded := ledger.FinishAttemptParams{Status: ledger.AttemptSucceeded, Result: json.RawMessage(`{ "ok": true, "id": 7 }`),
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened, Detail: json.RawMessage(`{ "ok": true, "id": 7 }`)}}

	run := ledgertest.RunningRun(t, store, "golden", ledger.BudgetLimits{MaxAttemptsPerRun: 5, MaxSteps: 100})

	// The engine's path: approved by a rule, usage and the attempt in the
	// same write, then the outcome with its observation.
	res := create(run.ID, "step-1", ledger.ActionApproved, true, nil)
	require.NotNil(t, res.Attempt)
	finish(res.Attempt.ID, succeeded)

	// A failure whose effect is known not to have happened, with an error.
	res = create(run.ID, "step-2", ledger.ActionApproved, true, func(p *ledger.CreateActionParams) { p.GateAudit = ledger.GateAudit{} })
	finish(res.Attempt.ID, ledger.FinishAttemptParams{Status: ledger.AttemptFailed, Error: &ledger.AttemptError{Code: "refused", Message: "no \"such\" deck"},
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectNotHappened}})

	// A replay of the first step's key: nothing is written.
	tick()
	again := create(run.ID, "step-1", ledger.ActionApproved, true, nil)
	require.True(t, again.Duplicate)

	// Approved without starting, then started on its own, then a timeout
	// with no observation.
	res = create(run.ID, "step-3", ledger.ActionApproved, false, nil)
	tick()
	att, err := store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: res.Action.ID, Actor: "worker"})
	require.NoError(t, err)
	finish(att.ID, ledger.FinishAttemptParams{Status: ledger.AttemptTimedOut, Error: &ledger.AttemptError{Code: "timeout", Message: "the tool did not answer in time"}})

	// A person's approval, then the engine's start and a success.
	res = create(run.ID, "step-4", ledger.ActionAwaitingApproval, false, func(p *ledger.CreateActionParams) { p.Usage = nil })
	require.NotNil(t, res.Approval)
	tick()
	_, err = store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: res.Action.ID, ActionDigest: res.Action.ActionDigest,
		Decision: ledger.DecisionGrant, Principal: "alice", Reason: "fine"})
	require.NoError(t, err)
	tick()
	att, err = store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: res.Action.ID, Actor: "engine"})
	require.NoError(t, err)
	finish(att.ID, succeeded)

	// One that supersedes a pending one, and a denied one.
	pending := create(run.ID, "step-5", ledger.ActionAwaitingApproval, false, nil)
	res = create(run.ID, "step-6", ledger.ActionApproved, true, func(p *ledger.CreateActionParams) { p.Supersedes = pending.Action.ID })
	finish(res.Attempt.ID, succeeded)
	create(run.ID, "step-7", ledger.ActionDenied, false, nil)

	// The run's attempts are spent (5 of 5): the action is recorded, its
	// attempt refused.
	res = create(run.ID, "step-8", ledger.ActionApproved, true, nil)
	require.Nil(t, res.Attempt)
	require.ErrorIs(t, res.StartErr, ledger.ErrBudgetExceeded)

	// A second run, cancelled while its attempt runs: no attempt starts.
	other := ledgertest.RunningRun(t, store, "golden-2", ledger.BudgetLimits{})
	res = create(other.ID, "step-1", ledger.ActionApproved, true, nil)
	tick()
	_, err = store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: other.ID, Principal: "alice", Reason: "stop"})
	require.NoError(t, err)
	finish(res.Attempt.ID, ledger.FinishAttemptParams{Status: ledger.AttemptCancelled, Error: &ledger.AttemptError{Code: "cancelled", Message: "the run was cancelled during the call"},
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}})

	for _, r := range []ledger.RunID{run.ID, other.ID} {
		rep, err := store.VerifyChain(ctx, r)
		require.NoError(t, err)
		require.True(t, rep.OK, "run %s: %+v", r, rep)
	}
	require.NoError(t, store.Close())
	golden(t, ledgertest.Dump(t, path))
}
