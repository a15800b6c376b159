package engine_test

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/simulator"
)

// update rewrites the golden files: go test ./engine -run Golden -update
var update = flag.Bool("update", false, "rewrite testdata/<Test>.golden")

// historyModel plays steps in order, like simulator's scripted model, and
// writes down every history it is shown, so that a test can hold what the
// engine tells the model to what the ledger holds.
type historyModel struct {
	steps []engine.Step
	clock *ledgertest.Clock
	seen  *strings.Builder
}

func (m historyModel) Next(_ context.Context, h engine.History) (engine.Step, error) {
	m.clock.Advance(300 * time.Microsecond)
	text, err := json.Marshal(h)
	if err != nil {
		return engine.Step{}, err
	}
	m.seen.Write(text)
	m.seen.WriteByte('\n')
	if n := len(h.Entries); n < len(m.steps) {
		return m.steps[n], nil
	}
	return engine.Step{Kind: engine.StepFinal, Final: json.RawMessage(`{"done":true}`), Usage: &engine.Usage{InputTokens: 1}}, nil
}

// clockTool answers at once after moving the clock, and fails (its effect
// not happened) when the arguments say so.
type clockTool struct {
	desc  contracts.ToolDescriptor
	clock *ledgertest.Clock
}

func (t clockTool) Descriptor() contracts.ToolDescriptor { return t.desc }

func (t clockTool) Execute(_ context.Context, c engine.Call) (engine.Result, error) {
	t.clock.Advance(2 * time.Millisecond)
	if strings.Contains(string(c.Arguments), `"fail"`) {
		return engine.Result{}, &engine.ToolError{Code: "refused", Message: "the deck is closed", Effect: ledger.EffectNotHappened}
	}
	return engine.Result{Output: json.RawMessage(`{"ok":true,"attempt":` + string(rune('0'+c.Attempt)) + `}`), Effect: ledger.EffectHappened}, nil
}

// TestAdvanceGolden holds what Engine.Advance writes for runs of
// auto-approved calls (some failing, which the agent answers) — every row
// of the ledger — and every history it shows the model, to what they were
// when the golden file was written: with a fake clock and sequential ids
// the same runs write the same database. The engine may read less or
// write cheaper; what it records and what it tells the model stay the
// same.
func TestAdvanceGolden(t *testing.T) {
	ctx := context.Background()
	lb := ledgertest.OpenStoreWith(t, func(c *sqlite.Config) { c.NewID = ledgertest.SequentialIDs() })
	desc := simulator.CardsWriteDescriptor()
	desc.Name, desc.Guarantees = "golden.write", contracts.Guarantees{}
	tool := clockTool{desc: desc, clock: lb.Clock}
	call := func(args string) engine.Step {
		return engine.Step{Kind: engine.StepToolCall, Tool: desc.Name, Arguments: json.RawMessage(args),
			Usage: &engine.Usage{InputTokens: 10, OutputTokens: 5}}
	}
	steps := []engine.Step{
		call(`{"title":"t","cards":[{"front":"q1","back":"a"}]}`),
		call(`{"title":"t","cards":[{"front":"q2","back":"a"}]}`),
		call(`{"title":"fail","cards":[{"front":"q3","back":"a"}]}`),
		call(`{"title":"t","cards":[{"front":"q4","back":"a"}]}`),
		{Kind: engine.StepToolCall, Tool: desc.Name, Arguments: json.RawMessage(`{"title":"t","cards":[{"front":"q5","back":"a"}]}`)},
		call(`{"title":"t","cards":[{"front":"q6","back":"a"}]}`),
	}
	var seen strings.Builder
	agent := engine.Agent{Name: "golden", Tools: []engine.Tool{tool}, ContinueOnToolError: true,
		NewModel: func(json.RawMessage) (engine.Model, error) {
			return historyModel{steps: steps, clock: lb.Clock, seen: &seen}, nil
		}}
	rules := &contracts.Rules{Rules: []contracts.Rule{{Tool: desc.Name, Decision: contracts.RuleDecisionAutoApprove}}}
	policy, err := approval.NewPolicy(rules, approval.Defaults{})
	require.NoError(t, err)
	eng, err := engine.New(engine.Config{Store: lb.Store, Approvals: approval.NewService(lb.Store, policy, nil, approval.Options{}),
		Agents: []engine.Agent{agent}, Now: lb.Clock.Now})
	require.NoError(t, err)

	for i, key := range []string{"golden-1", "golden-2"} {
		lb.Clock.Advance(time.Second)
		res, err := lb.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: key, Principal: "alice",
			Agent: "golden", Input: json.RawMessage(`{"n":` + string(rune('1'+i)) + `}`)})
		require.NoError(t, err)
		require.NoError(t, eng.Advance(ctx, res.Run.ID))
		run, err := lb.Store.FindRunByID(ctx, res.Run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunCompleted, run.State)
		rep, err := lb.Store.VerifyChain(ctx, run.ID)
		require.NoError(t, err)
		require.True(t, rep.OK, "%+v", rep)
	}
	require.NoError(t, lb.Store.Close())

	got := "# the histories the model was shown\n" + seen.String() + "# the ledger\n" + ledgertest.Dump(t, lb.Path)
	path := filepath.Join("testdata", t.Name()+".golden")
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create it")
	require.Equal(t, string(want), got, "golden file %s: what Advance wrote or showed the model changed (run with -update to rewrite, if that is meant)", path)
}
