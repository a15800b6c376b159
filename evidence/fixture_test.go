package evidence_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// update rewrites the golden files: go test ./evidence -run TestReport -update
var update = flag.Bool("update", false, "rewrite testdata/<Test>/<case>.golden")

// TestMain fails the package if a goroutine outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testKey is the fixed HMAC key of the golden reports.
var testKey = []byte("evidence-golden-key-0123456789ab")

// goldenSecret is a secret the golden run carries at a secret path of two
// actions, so the report shows it correlated by one marker.
const goldenSecret = "sk-GOLDENgoldenGOLDEN0123456789"

// goldenRulesDigest stands for the digest of the rules that gated the
// golden run's actions.
const goldenRulesDigest = ledger.Digest("sha256:5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed")

// fixture is a real store with a fixed clock and sequential ids, so that
// every id and time in a report is stable.
type fixture struct {
	store *ledger.DB
	clock *ledgertest.Clock
	path  string
}

func openFixture(tb testing.TB) *fixture {
	tb.Helper()
	return openFixtureWith(tb, sqlite.Config{})
}

func openFixtureWith(tb testing.TB, cfg sqlite.Config) *fixture {
	tb.Helper()
	clock := ledgertest.NewClock()
	cfg.Path = filepath.Join(tb.TempDir(), "ledger.db")
	cfg.Now, cfg.NewID = clock.Now, ledgertest.SequentialIDs()
	s, err := sqlite.OpenStore(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return &fixture{store: s, clock: clock, path: cfg.Path}
}

// secretPaths is what the tests' exports know of tools: cards.write keeps
// an API key at /api_key and one in each card's hint.
func secretPaths(name string) ([]string, bool) {
	switch name {
	case simulator.CardsWriteTool:
		return []string{"/api_key", "/deck/owner/password"}, true
	case simulator.CardsCountTool:
		return nil, true
	}
	return nil, false
}

func (f *fixture) options(tb testing.TB) evidence.Options {
	tb.Helper()
	r, err := redact.NewRedactor(testKey)
	require.NoError(tb, err)
	return evidence.Options{Redactor: r, Tools: secretPaths, Now: f.clock.Now}
}

func (f *fixture) tick() { f.clock.Advance(time.Second) }

// goldenRun records, through the Store and a real recovery.Recoverer, a run
// that has every section of a report:
//
//   - budgets with every limit and a deadline, usage with tokens
//     unavailable;
//   - a write the default gate sent to a person, granted by bob, that ran
//     once and took effect, with its tool_result observation;
//   - a second write auto-approved by rule 0, whose attempt was interrupted, a cancel of the run
//     accepted meanwhile, and recovery's decisions (cancel, then
//     cancelled) with their rationale and the tool's cancel observation;
//   - the cancellation confirmed and the run stopped with user_cancelled.
func goldenRun(t testing.TB, f *fixture) ledger.RunID {
	t.Helper()
	ctx := context.Background()
	s := f.store

	sub, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "evidence-golden", Principal: "alice",
		Agent: simulator.AgentName, Input: json.RawMessage(`{"title":"Go channels","markdown":"# Go channels"}`),
		Budgets: ledger.BudgetLimits{MaxAttemptsPerAction: 3, MaxAttemptsPerRun: 10, MaxExecution: time.Minute,
			MaxSteps: 20, MaxTokens: 50000, DeadlineAfter: 10 * time.Minute}})
	require.NoError(t, err)
	run := sub.Run
	f.tick()
	run, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "worker"})
	require.NoError(t, err)
	f.tick()
	_, err = s.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, Tokens: 1200, Execution: 800 * time.Millisecond})
	require.NoError(t, err)

	// Action 1: a write that needs approval.
	f.tick()
	created, err := s.CreateAction(ctx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: "step-1",
		Tool: simulator.CardsWriteTool, ToolVersion: "1", Effect: ledger.EffectWrite,
		Arguments: json.RawMessage(`{"title":"Go channels","cards":[{"front":"What does an unbuffered send do?","back":"It blocks until a receiver is <ready> & waiting."}],` +
			`"api_key":"` + goldenSecret + `","callback":"https://cards:hunter2@hooks.example/notify",` +
			`"note":"sent with Authorization: Bearer tok_golden.12345","deck":{"owner":{"name":"alice","password":"correct horse"}}}`),
		Gate: ledger.ActionAwaitingApproval, ApprovalTTL: time.Hour, Actor: "engine",
		GateAudit: ledger.GateAudit{Rule: -1, Reason: "default: write actions require approval", RulesDigest: goldenRulesDigest}})
	require.NoError(t, err)
	a1 := created.Action
	f.tick()
	_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunRunning, To: ledger.RunAwaitingApproval,
		Actor: "engine", Data: map[string]any{"action_id": a1.ID}})
	require.NoError(t, err)
	f.clock.Advance(5 * time.Minute)
	_, err = s.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a1.ID, ActionDigest: a1.ActionDigest,
		Decision: ledger.DecisionGrant, Principal: "bob", Reason: "cards look right | the old password=swordfish is rotated",
		ExecuteWithin: 15 * time.Minute})
	require.NoError(t, err)
	f.tick()
	att, err := s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a1.ID, Actor: "engine"})
	require.NoError(t, err)
	f.clock.Advance(1500 * time.Millisecond)
	out := json.RawMessage(`{"effect_seq":1,"title":"Go channels","written":1}`)
	_, err = s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded, Result: out,
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened, Detail: out},
		Actor:       "engine"})
	require.NoError(t, err)
	f.tick()
	_, err = s.AddUsage(ctx, ledger.AddUsageParams{RunID: run.ID, Steps: 1, Execution: 600 * time.Millisecond, TokensUnavailable: true})
	require.NoError(t, err)

	// Action 2: approved by a rule, interrupted after its attempt was
	// recorded (the same API key: the same marker).
	f.tick()
	created, err = s.CreateAction(ctx, ledger.CreateActionParams{RunID: run.ID, IdempotencyKey: "step-2",
		Tool: simulator.CardsWriteTool, ToolVersion: "1", Effect: ledger.EffectWrite,
		Arguments: json.RawMessage(`{"title":"Go channels, part 2","cards":[{"front":"Who closes a channel?","back":"The sender."}],"api_key":"` + goldenSecret + `"}`),
		Gate:      ledger.ActionApproved, Actor: "engine",
		GateAudit: ledger.GateAudit{Rule: 0, Reason: "rule 0: cards.write is auto-approved", RulesDigest: goldenRulesDigest}})
	require.NoError(t, err)
	a2 := created.Action
	f.tick()
	_, err = s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a2.ID, Actor: "engine"})
	require.NoError(t, err)

	// alice cancels: accepted, and the run stopping, in one write; then
	// the engine takes it up.
	f.clock.Advance(30 * time.Second)
	_, err = s.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice", Reason: "wrong deck, see <b>notes</b>"})
	require.NoError(t, err)
	f.tick()
	c, err := s.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID, From: ledger.CancelAccepted, To: ledger.CancelStopping, Actor: "engine"})
	require.NoError(t, err)
	run, err = s.FindRunByID(ctx, run.ID)
	require.NoError(t, err)

	// Recovery settles the interrupted attempt: the tool confirms the cancel.
	f.tick()
	desc := simulator.CardsWriteDescriptor()
	rec := recovery.New(recovery.Config{Store: s, Now: f.clock.Now,
		Probes: func(tool, version string) (recovery.Probe, bool) {
			return recovery.Probe{Tool: recovery.ToolFor(desc),
				QueryFunc: func(context.Context, string) (ledger.EffectFact, json.RawMessage, error) {
					return ledger.EffectNotHappened, json.RawMessage(`{"found":false}`), nil
				},
				CancelFunc: func(context.Context, string) (bool, json.RawMessage, error) {
					return true, json.RawMessage(`{"cancelled":true,"receipt":"AKIAGOLDEN0123456789"}`), nil
				}}, true
		}})
	a2, err = s.FindActionByID(ctx, a2.ID)
	require.NoError(t, err)
	d, err := rec.Recover(ctx, run, a2)
	require.NoError(t, err)
	require.Equal(t, recovery.Cancelled, d.Kind)

	f.tick()
	_, err = s.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID, From: ledger.CancelStopping, To: ledger.CancelStopped, Actor: "engine"})
	require.NoError(t, err)
	_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunStopping, To: ledger.RunStopped,
		StopReason: ledger.StopUserCancelled, Actor: "engine", Data: map[string]any{"cancellation": c.ID}})
	require.NoError(t, err)
	f.tick()
	return run.ID
}

// render returns the report in one format.
func render(t testing.TB, rep *evidence.Report, format string) []byte {
	t.Helper()
	var b bytes.Buffer
	switch format {
	case "json":
		require.NoError(t, rep.JSON(&b))
	case "md":
		require.NoError(t, rep.Markdown(&b))
	case "html":
		require.NoError(t, rep.HTML(&b))
	default:
		t.Fatalf("unknown format %q", format)
	}
	return b.Bytes()
}

// golden compares got with testdata/<Test>/<name>.golden, or rewrites it
// with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	test, _, _ := strings.Cut(t.Name(), "/")
	path := filepath.Join("testdata", test, name+".golden")
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create it")
	require.Equal(t, string(want), string(got), "%s differs; run with -update if the change is intended", path)
}
