package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/simulator"
)

// TestFrontEndsRecordTheSameFacts runs the same proposals through both
// front ends of the one propose path — a built-in agent's model steps and a
// client's protocol proposals — and compares what the ledger recorded: the
// actions (tool, version, effect, arguments, step key, gate and its audit),
// the approvals opened, the usage counted, and how a loop policy stopped
// the run. The client executes what the engine executes for the built-in
// agent (begin, then complete as the tool answered), so that both histories
// are alike when the policies look at them.
func TestFrontEndsRecordTheSameFacts(t *testing.T) {
	ctx := context.Background()
	lb := ledgertest.OpenStore(t)
	effects, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), lb.Clock.Now)
	require.NoError(t, err)
	t.Cleanup(func() { _ = effects.Close() })
	peek := simulator.CardsCountDescriptor()
	peek.Name = workingTool
	tools := []engine.Tool{
		simulator.NewTool(peek, effects, simulator.ToolConfig{}),
		simulator.NewTool(simulator.CardsWriteDescriptor(), effects, simulator.ToolConfig{}),
	}
	descs := map[string]contracts.ToolDescriptor{}
	var clientTools []engine.Tool // the same descriptors, run by the client
	for _, tool := range tools {
		descs[tool.Descriptor().Name] = tool.Descriptor()
		clientTools = append(clientTools, engine.ClientTool(tool.Descriptor(), engine.Lease{}))
	}
	read := func(title string, in, out int64) engine.Step {
		return engine.Step{Kind: engine.StepToolCall, Tool: workingTool, Arguments: json.RawMessage(fmt.Sprintf(`{"title":%q}`, title)),
			Usage: &engine.Usage{InputTokens: in, OutputTokens: out}}
	}
	write := engine.Step{Kind: engine.StepToolCall, Tool: simulator.CardsWriteTool,
		Arguments: json.RawMessage(`{"title":"Go channels","cards":[{"front":"Who closes a channel?","back":"The sender."}]}`),
		Usage:     &engine.Usage{InputTokens: 20, OutputTokens: 9}}
	scripts := map[string][]engine.Step{
		// Two reads the rules approve, then the first again: repeated_action.
		"repeat": {read("a", 10, 5), read("b", 7, 3), read("a", 4, 4)},
		// A read, then a write that waits for a person.
		"approval": {read("c", 3, 2), write},
	}
	policy := budget.Policy{RepeatLimit: 1}
	var agents []engine.Agent
	for name, steps := range scripts {
		agents = append(agents,
			engine.Agent{Name: "builtin-" + name, Tools: tools, Policy: policy,
				NewModel: func(json.RawMessage) (engine.Model, error) { return simulator.NewScriptedModel(steps...), nil }},
			engine.Agent{Name: "client-" + name, Driver: engine.DriverClient, Tools: clientTools, Policy: policy})
	}
	rules, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(lb.Store, rules, func(n string) (contracts.ToolDescriptor, bool) { d, ok := descs[n]; return d, ok },
		approval.Options{})
	eng, err := engine.New(engine.Config{Store: lb.Store, Approvals: svc, Agents: agents, Now: lb.Clock.Now})
	require.NoError(t, err)
	caller := engine.Caller{Tenant: "acme", Principal: "bot", MayDrive: func(*ledger.Run) bool { return true }}

	submit := func(agent string) *ledger.Run {
		res, err := lb.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: agent, Principal: "alice",
			Agent: agent, Input: json.RawMessage(`{}`), Start: true})
		require.NoError(t, err)
		return res.Run
	}
	// drive is the client's side of the script: each step proposed with
	// the built-in agent's step key, and an approved call executed as the
	// engine executes it, until a proposal is refused.
	drive := func(t *testing.T, run *ledger.Run, steps []engine.Step) {
		for i, s := range steps {
			res, err := eng.Propose(ctx, engine.ProposeParams{Caller: caller, RunID: run.ID, StepKey: fmt.Sprintf("step-%d", i+1),
				Tool: s.Tool, Arguments: s.Arguments, Usage: s.Usage})
			if err != nil {
				require.Equal(t, engine.CodeRunStopped, protoCode(t, err))
				return
			}
			if res.Action.State != ledger.ActionApproved {
				continue
			}
			begun, err := eng.Begin(ctx, engine.BeginParams{Caller: caller, ActionID: res.Action.ID, Key: "b1"})
			require.NoError(t, err)
			_, err = eng.Complete(ctx, engine.CompleteParams{Caller: caller, AttemptID: begun.Attempt.ID, Token: begun.Token,
				Outcome: engine.Outcome{Status: ledger.AttemptSucceeded, Output: json.RawMessage(`{"count":0}`)}})
			require.NoError(t, err)
		}
	}

	for name, steps := range scripts {
		t.Run(name, func(t *testing.T) {
			builtin := submit("builtin-" + name)
			require.NoError(t, eng.Advance(ctx, builtin.ID))
			client := submit("client-" + name)
			drive(t, client, steps)

			b, c := recordedFacts(t, lb.Store, builtin.ID), recordedFacts(t, lb.Store, client.ID)
			require.NotEmpty(t, b.Actions)
			require.Equal(t, map[string]ledger.StopReason{"repeat": ledger.StopRepeatedAction, "approval": ""}[name], b.Stop)
			require.Equal(t, b, c, "the same proposals, through either front end, are the same facts")
		})
	}
}

// facts is what a run's proposals recorded, with what differs between two
// runs of the same proposals by design left out: ids, the run's agent and
// actor, times, and where a live run waits — a built-in agent's run is
// parked in awaiting_approval so that it holds no worker, a client's stays
// running, since its agent may go on with other calls.
type facts struct {
	Actions   []proposedFacts
	Approvals int
	Stop      ledger.StopReason
	Rationale string
	Steps     int64
	Tokens    int64
}

type proposedFacts struct {
	Key, Tool, Version string
	Effect             ledger.Effect
	Arguments          string
	Gate               any
}

var actionIDs = regexp.MustCompile(`act_[0-9A-Z]+`)

func recordedFacts(t *testing.T, s ledger.Store, id ledger.RunID) facts {
	t.Helper()
	ctx := context.Background()
	run, err := s.FindRunByID(ctx, id)
	require.NoError(t, err)
	f := facts{Stop: run.StopReason, Steps: run.Budget.Used.Steps, Tokens: run.Budget.Used.Tokens}
	events, err := s.FindEvents(ctx, id)
	require.NoError(t, err)
	for _, e := range events {
		var data map[string]any
		if len(e.Data) > 0 {
			require.NoError(t, json.Unmarshal(e.Data, &data))
		}
		switch {
		case e.Type == "action.approved" && e.FromState == string(ledger.ActionProposed),
			e.Type == "action.awaiting_approval" && e.FromState == string(ledger.ActionProposed):
			a, err := s.FindActionByID(ctx, ledger.ActionID(e.EntityID))
			require.NoError(t, err)
			f.Actions = append(f.Actions, proposedFacts{Key: a.IdempotencyKey, Tool: a.Tool, Version: a.ToolVersion, Effect: a.Effect,
				Arguments: string(a.Arguments), Gate: []any{e.ToState, data["gate"]}})
		case e.Type == "approval.pending":
			f.Approvals++
		case e.EntityType == "run" && ledger.RunState(e.ToState).Terminal():
			if r, ok := data["rationale"].(string); ok {
				f.Rationale = actionIDs.ReplaceAllString(r, "act_…")
			}
		}
	}
	return f
}
