package evidence_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// canary is a secret that must never leave the arguments it was given in.
const canary = "sk-CANARYcanaryCANARY0123456789"

// vaultTool is a write tool whose descriptor marks /api_key secret. Given
// {"mode":"ok"} it succeeds and echoes the canary in its output; given
// {"mode":"fail"} it refuses with the canary in its error message. It is a
// function-field fake of the external edge, the tool.
type vaultTool struct{}

func (vaultTool) Descriptor() contracts.ToolDescriptor {
	return contracts.ToolDescriptor{
		SchemaVersion:   contracts.DefaultVersion,
		Name:            "vault.write",
		Version:         "1",
		Effect:          contracts.EffectWrite,
		ArgumentsSchema: json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}`),
		Guarantees:      contracts.Guarantees{Query: false, Dedup: true, Cancel: false},
		SecretPaths:     []string{"/api_key"},
		TimeoutMS:       2000,
	}
}

func (vaultTool) Execute(_ context.Context, c engine.Call) (engine.Result, error) {
	var args struct {
		Mode string `json:"mode"`
	}
	if err := json.Unmarshal(c.Arguments, &args); err != nil {
		return engine.Result{}, err
	}
	if args.Mode == "fail" {
		return engine.Result{}, &engine.ToolError{Code: "upstream_refused",
			Message: "upstream refused the key " + canary + " (Authorization: Bearer " + canary + ")", Effect: ledger.EffectNotHappened}
	}
	out, err := json.Marshal(map[string]any{"stored": true, "echo": "stored with key " + canary,
		"receipt": map[string]string{"token_used": canary, "note": "url https://svc:" + canary + "@vault.example/"}})
	return engine.Result{Output: out, Effect: ledger.EffectHappened}, err
}

// syncBuffer collects log lines from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCanary runs a real run through the engine with a secret in a tool
// argument at a secret path and as a bearer token in another argument, in
// the tool's output and in its error message, and in the reasons people
// give (approvals, a cancel); then exports every format and checks that
// the secret is in no report, no timeline and no log line, and that the
// ledger's database holds it only in actions.arguments.
func TestCanary(t *testing.T) {
	ctx := context.Background()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	prev := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() { slog.SetDefault(prev) })

	lb := ledgertest.OpenStore(t)
	tool := vaultTool{}
	agent := engine.Agent{
		Name: "vault-agent",
		NewModel: func(json.RawMessage) (engine.Model, error) {
			return simulator.NewScriptedModel(
				engine.Step{Kind: engine.StepToolCall, Tool: "vault.write", Usage: &engine.Usage{InputTokens: 10, OutputTokens: 5},
					Arguments: json.RawMessage(`{"mode":"ok","title":"first","api_key":"` + canary + `","header":"Authorization: Bearer ` + canary + `"}`)},
				engine.Step{Kind: engine.StepToolCall, Tool: "vault.write", Usage: &engine.Usage{InputTokens: 10, OutputTokens: 5},
					Arguments: json.RawMessage(`{"mode":"fail","title":"second","api_key":"` + canary + `"}`)},
			), nil
		},
		Tools: []engine.Tool{tool},
	}
	desc := tool.Descriptor()
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	// One key for what is stored, as a process has (cmd/ledger wires it).
	stored, err := redact.NewRedactor([]byte("canary-stored-key-0123456789abcdef"))
	require.NoError(t, err)
	approvals := approval.NewService(lb.Store, policy, func(n string) (contracts.ToolDescriptor, bool) {
		return desc, n == desc.Name
	}, approval.Options{Redactor: stored})
	eng, err := engine.New(engine.Config{Store: lb.Store, Approvals: approvals, Agents: []engine.Agent{agent},
		Now: lb.Clock.Now, Logger: logger, Redactor: stored})
	require.NoError(t, err)

	sub, err := lb.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "canary", Principal: "alice",
		Agent: "vault-agent", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	id := sub.Run.ID
	// Two writes, each approved by bob; the second fails and ends the run.
	for range 2 {
		require.NoError(t, eng.Advance(ctx, id))
		pending, err := lb.Store.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &id, State: ptr(ledger.ApprovalPending)})
		require.NoError(t, err)
		require.Len(t, pending, 1)
		_, err = approvals.Decide(ctx, approval.DecideParams{Tenant: "acme", Principal: "bob", ActionID: pending[0].ActionID,
			ActionDigest: pending[0].ActionDigest, Decision: ledger.DecisionGrant, Reason: "ok, it uses the key " + canary})
		require.NoError(t, err)
		lb.Clock.Advance(time.Second)
	}
	// Another run, cancelled with the secret in its reason.
	other, err := lb.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "canary-cancel", Principal: "alice",
		Agent: "vault-agent", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	_, err = eng.Cancel(ctx, engine.CancelParams{RunID: other.Run.ID, Principal: "alice", Reason: "leaked " + canary + ", stop"})
	require.NoError(t, err)
	require.NoError(t, eng.Advance(ctx, other.Run.ID))
	require.NoError(t, eng.Advance(ctx, id))
	run, err := lb.Store.FindRunByID(ctx, id)
	require.NoError(t, err)
	require.Equal(t, ledger.RunFailed, run.State)
	require.Equal(t, ledger.StopToolError, run.StopReason)

	// The canary really went through: the tool saw it and answered with it.
	attempts, err := lb.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &id})
	require.NoError(t, err)
	require.Len(t, attempts, 2)
	require.Equal(t, ledger.AttemptSucceeded, attempts[0].Status)
	require.Equal(t, ledger.AttemptFailed, attempts[1].Status)

	redactor, err := redact.NewRedactor([]byte("canary-test-key-0123456789abcdef"))
	require.NoError(t, err)
	rep, err := evidence.Build(ctx, lb.Store, id, evidence.Options{Redactor: redactor, Now: lb.Clock.Now,
		Tools: func(name string) ([]string, bool) {
			if name == desc.Name {
				return desc.SecretPaths, true
			}
			return nil, false
		}})
	require.NoError(t, err)

	t.Run("reports", func(t *testing.T) {
		for _, format := range []string{"json", "md", "html"} {
			got := string(render(t, rep, format))
			require.False(t, strings.Contains(got, canary), "the canary is in the %s report", format)
			// The secret is still visible as a marker, correlated across
			// arguments, output and error.
			require.Contains(t, got, redactor.Marker(canary), format)
		}
	})
	t.Run("timeline", func(t *testing.T) {
		b, err := json.Marshal(rep.Timeline)
		require.NoError(t, err)
		require.NotContains(t, string(b), canary)
		b, err = json.Marshal(rep.RecoveryDecisions)
		require.NoError(t, err)
		require.NotContains(t, string(b), canary)
	})
	t.Run("logs", func(t *testing.T) {
		require.NotContains(t, logs.String(), canary)
	})
	t.Run("cancelled run's report", func(t *testing.T) {
		rep, err := evidence.Build(ctx, lb.Store, other.Run.ID, evidence.Options{Redactor: redactor, Now: lb.Clock.Now,
			Tools: func(string) ([]string, bool) { return desc.SecretPaths, true }})
		require.NoError(t, err)
		require.Equal(t, ledger.CancelStopped, rep.Cancellation.State)
		for _, format := range []string{"json", "md", "html"} {
			require.NotContains(t, string(render(t, rep, format)), canary, format)
		}
	})
	t.Run("database", func(t *testing.T) {
		// The engine redacts tool output and error messages, and the
		// engine and the approval service people's reasons, before they
		// are stored; only the arguments are kept as given.
		require.Equal(t, []string{"actions.arguments"}, canaryColumns(t, lb.Path))
		require.Contains(t, ledgertest.ColumnsHolding(t, lb.Path, stored.Marker(canary)),
			"approvals.reason", "the reason is kept, with its marker")
		require.Contains(t, ledgertest.ColumnsHolding(t, lb.Path, stored.Marker(canary)), "cancellations.reason")
	})
}

// canaryColumns opens the SQLite file raw and returns every table.column
// holding the canary in any row.
func canaryColumns(t *testing.T, path string) []string {
	t.Helper()
	return ledgertest.ColumnsHolding(t, path, canary)
}

func ptr[T any](v T) *T { return &v }
