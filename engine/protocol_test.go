package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

// clientBundle is a real ledger and an engine with one client-driven
// agent whose tools cover the guarantees recovery tells apart.
type clientBundle struct {
	*ledgertest.Bundle
	engine    *engine.Engine
	approvals *approval.Service
	caller    engine.Caller
}

func clientTool(t *testing.T, name string, effect contracts.Effect, g contracts.Guarantees) engine.Tool {
	t.Helper()
	d := contracts.ToolDescriptor{SchemaVersion: "1.0", Name: name, Version: "1", Effect: effect,
		ArgumentsSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}`),
		Guarantees:      g, TimeoutMS: 60000}
	return engine.ClientTool(d, engine.Lease{HeartbeatTimeout: 10 * time.Second, MaxDuration: time.Minute})
}

func setupClient(t *testing.T) *clientBundle {
	t.Helper()
	lb := ledgertest.OpenStore(t)
	agent := engine.Agent{Name: "py", Driver: engine.DriverClient, Tools: []engine.Tool{
		clientTool(t, "kv.get", contracts.EffectRead, contracts.Guarantees{}),
		clientTool(t, "pay.query", contracts.EffectWrite, contracts.Guarantees{Query: true}),
		clientTool(t, "pay.dedup", contracts.EffectWrite, contracts.Guarantees{Dedup: true}),
		clientTool(t, "pay.none", contracts.EffectWrite, contracts.Guarantees{}),
	}}
	tools := map[string]contracts.ToolDescriptor{}
	for _, tool := range agent.Tools {
		tools[tool.Descriptor().Name] = tool.Descriptor()
	}
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(lb.Store, policy, func(n string) (contracts.ToolDescriptor, bool) { d, ok := tools[n]; return d, ok }, approval.Options{})
	eng, err := engine.New(engine.Config{Store: lb.Store, Approvals: svc, Agents: []engine.Agent{agent}, Now: lb.Clock.Now})
	require.NoError(t, err)
	return &clientBundle{Bundle: lb, engine: eng, approvals: svc, caller: engine.Caller{Tenant: "acme", Principal: "bot"}}
}

func (b *clientBundle) run(t *testing.T, key string) *ledger.Run {
	t.Helper()
	res, err := b.Store.SubmitRun(context.Background(), ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: key,
		Principal: "bot", Agent: "py", Input: json.RawMessage(`{}`), Start: true})
	require.NoError(t, err)
	require.Equal(t, ledger.RunRunning, res.Run.State)
	return res.Run
}

// approved proposes a write and has a person approve it.
func (b *clientBundle) approved(t *testing.T, run ledger.RunID, tool, key string) *ledger.Action {
	t.Helper()
	ctx := context.Background()
	res, err := b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run, StepKey: key, Tool: tool,
		Arguments: json.RawMessage(`{"n":1}`)})
	require.NoError(t, err)
	require.Equal(t, ledger.ActionAwaitingApproval, res.Action.State)
	require.NotNil(t, res.Approval)
	_, err = b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: res.Action.ID, ActionDigest: res.Action.ActionDigest,
		Decision: ledger.DecisionGrant, Principal: "carol"})
	require.NoError(t, err)
	return res.Action
}

func protoCode(t *testing.T, err error) string {
	t.Helper()
	var pe *engine.ProtocolError
	require.True(t, errors.As(err, &pe), "want a protocol error, got %v", err)
	return pe.Code
}

func TestProtocolReadRoundTrip(t *testing.T) {
	b := setupClient(t)
	ctx := context.Background()
	run := b.run(t, "r1")
	res, err := b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "s1", Tool: "kv.get",
		Arguments: json.RawMessage(`{"n": 1}`), Usage: &engine.Usage{InputTokens: 3, OutputTokens: 4}})
	require.NoError(t, err)
	require.Equal(t, ledger.ActionApproved, res.Action.State)

	again, err := b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "s1", Tool: "kv.get",
		Arguments: json.RawMessage(`{"n":1}`)})
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, res.Action.ID, again.Action.ID)

	_, err = b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "s1", Tool: "kv.get",
		Arguments: json.RawMessage(`{"n":2}`)})
	require.Equal(t, engine.CodeStepKeyReused, protoCode(t, err))

	begin, err := b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: res.Action.ID, Key: "b1"})
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, begin.LeaseRemaining)
	replay, err := b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: res.Action.ID, Key: "b1"})
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, begin.Token, replay.Token)
	_, err = b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: res.Action.ID, Key: "b2"})
	require.Equal(t, engine.CodeAttemptOpen, protoCode(t, err))

	b.Clock.Advance(5 * time.Second)
	hb, err := b.engine.Heartbeat(ctx, engine.HeartbeatParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Progress: json.RawMessage(`{"pct":50}`)})
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, hb.LeaseRemaining)
	_, err = b.engine.Heartbeat(ctx, engine.HeartbeatParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: "at_wrong"})
	require.Equal(t, engine.CodeBadToken, protoCode(t, err))

	_, err = b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptSucceeded, Effect: ledger.EffectHappened}})
	require.Equal(t, engine.CodeOutcomeInvalid, protoCode(t, err), "a read carries no effect")
	done, err := b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptSucceeded, Output: json.RawMessage(`{"v": 7}`)}})
	require.NoError(t, err)
	require.Equal(t, ledger.ActionSucceeded, done.Action.State)
	same, err := b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptSucceeded, Output: json.RawMessage(`{"v":7}`)}})
	require.NoError(t, err)
	require.True(t, same.Replayed)
	_, err = b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptFailed}})
	require.Equal(t, engine.CodeOutcomeConflict, protoCode(t, err))

	next, err := b.engine.Next(ctx, b.caller, run.ID)
	require.NoError(t, err)
	require.Len(t, next.Directives, 1)
	require.Equal(t, engine.DirectivePropose, next.Directives[0].Kind)

	fin, err := b.engine.FinishRun(ctx, engine.FinishParams{Caller: b.caller, RunID: run.ID, Outcome: "completed"})
	require.NoError(t, err)
	require.Equal(t, ledger.RunCompleted, fin.State)
	run2, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), run2.Budget.Used.Steps)
	require.Equal(t, int64(7), run2.Budget.Used.Tokens)

	other := engine.Caller{Tenant: "globex", Principal: "bot"}
	_, err = b.engine.Next(ctx, other, run.ID)
	require.Equal(t, ledger.CodeNotFound, ledger.Code(err))
}

func TestProtocolRecoveryDirectives(t *testing.T) {
	for _, tc := range []struct {
		tool string
		want engine.DirectiveKind
	}{
		{"pay.query", engine.DirectiveQuery},
		{"pay.dedup", engine.DirectiveResend},
		{"pay.none", engine.DirectiveReview},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			b := setupClient(t)
			ctx := context.Background()
			run := b.run(t, "r")
			a := b.approved(t, run.ID, tc.tool, "s1")
			begin, err := b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: a.ID, Key: "b1"})
			require.NoError(t, err)
			_, err = b.engine.Abandon(ctx, engine.AbandonParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Reason: "crashed"})
			require.NoError(t, err)
			next, err := b.engine.Next(ctx, b.caller, run.ID)
			require.NoError(t, err)
			require.Len(t, next.Directives, 1)
			require.Equal(t, tc.want, next.Directives[0].Kind, next.Directives[0].Rationale)
			events, err := b.Store.FindEvents(ctx, run.ID)
			require.NoError(t, err)
			again, err := b.engine.Next(ctx, b.caller, run.ID)
			require.NoError(t, err)
			require.Equal(t, next.Directives, again.Directives, "asking twice changes nothing")
			after, err := b.Store.FindEvents(ctx, run.ID)
			require.NoError(t, err)
			require.Len(t, after, len(events), "asking twice records nothing")
			if tc.want == engine.DirectiveReview {
				require.Equal(t, ledger.RunNeedsReview, next.Run.State)
			}
		})
	}
}

func TestProtocolQueryAnswered(t *testing.T) {
	b := setupClient(t)
	ctx := context.Background()
	run := b.run(t, "r")
	a := b.approved(t, run.ID, "pay.query", "s1")
	begin, err := b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: a.ID, Key: "b1"})
	require.NoError(t, err)
	// The agent dies; its lease lapses.
	b.Clock.Advance(11 * time.Second)
	_, err = b.engine.Heartbeat(ctx, engine.HeartbeatParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token})
	require.Equal(t, engine.CodeAttemptClosed, protoCode(t, err))
	next, err := b.engine.Next(ctx, b.caller, run.ID)
	require.NoError(t, err)
	q := next.Directives[0]
	require.Equal(t, engine.DirectiveQuery, q.Kind)
	require.Equal(t, begin.Attempt.ID, q.AttemptID)

	_, err = b.engine.Observe(ctx, engine.ObserveParams{Caller: b.caller, AttemptID: begin.Attempt.ID, DecisionID: "dec_other",
		Kind: engine.ObserveQuery, Effect: ledger.EffectNotHappened})
	require.Equal(t, engine.CodeStaleDecision, protoCode(t, err))
	obs, err := b.engine.Observe(ctx, engine.ObserveParams{Caller: b.caller, AttemptID: begin.Attempt.ID, DecisionID: q.DecisionID,
		Kind: engine.ObserveQuery, Effect: ledger.EffectNotHappened})
	require.NoError(t, err)
	require.Equal(t, engine.DirectiveExecute, obs.Next[0].Kind)
	_, err = b.engine.Observe(ctx, engine.ObserveParams{Caller: b.caller, AttemptID: begin.Attempt.ID, DecisionID: q.DecisionID,
		Kind: engine.ObserveQuery, Effect: ledger.EffectNotHappened})
	require.Equal(t, engine.CodeStaleDecision, protoCode(t, err), "a decision is answered once")

	// The zombie's late outcome is kept, and refused.
	_, err = b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptFailed, Effect: ledger.EffectNotHappened}})
	require.Equal(t, engine.CodeAttemptClosed, protoCode(t, err))
	late, err := b.Store.FindObservations(ctx, ledger.ObservationFilter{AttemptID: &begin.Attempt.ID})
	require.NoError(t, err)
	require.Equal(t, ledger.ObservedLate, late[len(late)-1].Source)

	second, err := b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: a.ID, Key: "b2"})
	require.NoError(t, err)
	require.Equal(t, int64(2), second.Attempt.No)
	done, err := b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: second.Attempt.ID, Token: second.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptSucceeded, Effect: ledger.EffectHappened}})
	require.NoError(t, err)
	require.Equal(t, ledger.ActionSucceeded, done.Action.State)
	rep, err := b.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
}

func TestProtocolRefusals(t *testing.T) {
	b := setupClient(t)
	ctx := context.Background()
	run := b.run(t, "r")
	_, err := b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "x", Tool: "nope",
		Arguments: json.RawMessage(`{"n":1}`)})
	require.Equal(t, engine.CodeUnknownTool, protoCode(t, err))
	_, err = b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "x", Tool: "kv.get",
		Arguments: json.RawMessage(`{"n":"one"}`)})
	require.Equal(t, engine.CodeInvalidArgs, protoCode(t, err))
	a := b.approved(t, run.ID, "pay.none", "s1")
	begin, err := b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: a.ID, Key: "b1"})
	require.NoError(t, err)
	_, err = b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "s2", Tool: "pay.query",
		Arguments: json.RawMessage(`{"n":2}`)})
	require.Equal(t, engine.CodeActionInDoubt, protoCode(t, err))
	_, err = b.engine.FinishRun(ctx, engine.FinishParams{Caller: b.caller, RunID: run.ID, Outcome: "completed"})
	require.Equal(t, engine.CodeActionInDoubt, protoCode(t, err))
	_, err = b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptSucceeded, Effect: ledger.EffectUnknown}})
	require.Equal(t, engine.CodeOutcomeInvalid, protoCode(t, err))
	res, err := b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptFailed, Effect: ledger.EffectHappened}})
	require.NoError(t, err)
	require.Equal(t, ledger.ActionNeedsReview, res.Action.State)
	got, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.RunNeedsReview, got.State)
}

func TestRunnableLeavesClientRunsToTheirClient(t *testing.T) {
	b := setupClient(t)
	ctx := context.Background()
	run := b.run(t, "r")
	ids, err := b.engine.Runnable(ctx)
	require.NoError(t, err)
	require.NotContains(t, ids, run.ID, "a running client run is its client's to advance")
	_, err = b.engine.Cancel(ctx, engine.CancelParams{RunID: run.ID, Principal: "bot"})
	require.NoError(t, err)
	ids, err = b.engine.Runnable(ctx)
	require.NoError(t, err)
	require.Contains(t, ids, run.ID, "a stopping one is the engine's to stop")
	require.NoError(t, b.engine.Advance(ctx, run.ID))
	got, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.RunStopped, got.State)
	require.Equal(t, ledger.StopUserCancelled, got.StopReason)
}

// TestProtocolLoopPolicies: a client's failing calls stop its run by the
// loop policies, with one stop reason, refusing the proposal that tripped
// them.
func TestProtocolLoopPolicies(t *testing.T) {
	b := setupClient(t)
	ctx := context.Background()
	run := b.run(t, "r")
	for i := range 3 {
		res, err := b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: fmt.Sprintf("s%d", i),
			Tool: "kv.get", Arguments: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
		require.NoError(t, err)
		begin, err := b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: res.Action.ID, Key: "b"})
		require.NoError(t, err)
		done, err := b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
			Outcome: engine.Outcome{Status: ledger.AttemptFailed, Error: &ledger.AttemptError{Code: "down", Message: "503"}}})
		require.NoError(t, err)
		require.Equal(t, ledger.ActionFailed, done.Action.State)
	}
	_, err := b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "s3", Tool: "kv.get",
		Arguments: json.RawMessage(`{"n":3}`)})
	require.Equal(t, engine.CodeRunStopped, protoCode(t, err))
	var pe *engine.ProtocolError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, ledger.StopConsecutiveErrors, pe.StopReason)
	got, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.RunStopped, got.State)
	require.Equal(t, ledger.StopConsecutiveErrors, got.StopReason)
	require.Equal(t, int64(4), got.Budget.Used.Steps, "the refused proposal is counted as a step")

	_, err = b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "s4", Tool: "kv.get",
		Arguments: json.RawMessage(`{"n":4}`)})
	require.Equal(t, engine.CodeRunStopped, protoCode(t, err))
	next, err := b.engine.Next(ctx, b.caller, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.DirectiveStop, next.Directives[0].Kind)
	require.Equal(t, ledger.StopConsecutiveErrors, next.Directives[0].StopReason)
}

func TestProtocolProposalRecordsGate(t *testing.T) {
	b := setupClient(t)
	ctx := context.Background()
	run := b.run(t, "r")
	res, err := b.engine.Propose(ctx, engine.ProposeParams{Caller: b.caller, RunID: run.ID, StepKey: "s", Tool: "kv.get",
		Arguments: json.RawMessage(`{"n":1}`)})
	require.NoError(t, err)
	require.NotNil(t, res.Action.Gate, "a client's proposal records the rule that decided")
	require.Equal(t, -1, res.Action.Gate.Rule)
	require.Equal(t, b.approvals.RulesDigest(), res.Action.Gate.RulesDigest)
}

// TestProtocolLateHappenedAfterRetryAllowed: recovery allowed a retry of a
// dedup tool's write, then the zombie's late outcome says it took effect
// before any retry began: the action is reconciled, not executed again.
func TestProtocolLateHappenedAfterRetryAllowed(t *testing.T) {
	b := setupClient(t)
	ctx := context.Background()
	run := b.run(t, "r")
	a := b.approved(t, run.ID, "pay.dedup", "s1")
	begin, err := b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: a.ID, Key: "b1"})
	require.NoError(t, err)
	b.Clock.Advance(11 * time.Second) // the lease lapses
	next, err := b.engine.Next(ctx, b.caller, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.DirectiveResend, next.Directives[0].Kind)
	_, err = b.engine.Complete(ctx, engine.CompleteParams{Caller: b.caller, AttemptID: begin.Attempt.ID, Token: begin.Token,
		Outcome: engine.Outcome{Status: ledger.AttemptSucceeded, Effect: ledger.EffectHappened}})
	require.Equal(t, engine.CodeAttemptClosed, protoCode(t, err))
	got, err := b.Store.FindActionByID(ctx, a.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.ActionSucceeded, got.State, "reconciled by the late outcome")
	_, err = b.engine.Begin(ctx, engine.BeginParams{Caller: b.caller, ActionID: a.ID, Key: "b2"})
	require.Equal(t, engine.CodeNotApproved, protoCode(t, err), "no second execution")
	rep, err := b.Store.VerifyChain(ctx, run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
}

func TestClientAgentNeedsClientTools(t *testing.T) {
	lb := ledgertest.OpenStore(t)
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(lb.Store, policy, nil, approval.Options{})
	d := clientTool(t, "kv.get", contracts.EffectRead, contracts.Guarantees{}).Descriptor()
	_, err = engine.New(engine.Config{Store: lb.Store, Approvals: svc, Agents: []engine.Agent{{Name: "py", Driver: engine.DriverClient,
		Tools: []engine.Tool{perfLikeTool{d}}}}})
	require.ErrorContains(t, err, "ClientTool", "the engine would have no lease for it")
}

// perfLikeTool is a tool the engine could call itself.
type perfLikeTool struct{ d contracts.ToolDescriptor }

func (t perfLikeTool) Descriptor() contracts.ToolDescriptor { return t.d }
func (t perfLikeTool) Execute(context.Context, engine.Call) (engine.Result, error) {
	return engine.Result{}, nil
}
