package engine_test

import (
	"context"
	"testing"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// TestStaleApprovalAsksAgain: a built-in agent's approved write that
// begins after its approval's execute_by does not run; the action asks a
// person again for the same digest and the run waits, as for any
// approval; the next grant runs it, once.
func TestStaleApprovalAsksAgain(t *testing.T) {
	b := setup(t, simulator.Config{})
	ctx := context.Background()
	run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
	a := b.pendingAction(t, run.ID)
	require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
	first := b.approvalsOf(t, a.ID)[0]
	require.Equal(t, first.DecidedAt.Add(approval.DefaultExecuteWithin), *first.ExecuteBy)

	b.Clock.Advance(approval.DefaultExecuteWithin)
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunAwaitingApproval, run.State, "no internal error, no stop: the run waits")
	require.Equal(t, 0, b.effectCount(t), "a stale approval runs nothing")
	asked := b.pendingAction(t, run.ID)
	require.Equal(t, a.ID, asked.ID, "the same action asks again")
	require.Equal(t, ledger.ActionAwaitingApproval, asked.State)
	aprs := b.approvalsOf(t, a.ID)
	require.Len(t, aprs, 2)
	require.Equal(t, ledger.ApprovalGranted, aprs[0].State)
	require.NotNil(t, aprs[0].StaleAt)
	require.Contains(t, aprs[0].StaleReason, "execute_by")
	require.Equal(t, ledger.ApprovalPending, aprs[1].State)
	require.Equal(t, a.ActionDigest, aprs[1].ActionDigest)
	atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
	require.NoError(t, err)
	require.Empty(t, atts, "no attempt was recorded")

	require.NoError(t, b.decide("bob", asked, asked.ActionDigest, ledger.DecisionGrant))
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunCompleted, run.State)
	require.Equal(t, 1, b.effectCount(t))
	b.chainOK(t, run.ID)
}

// TestChangedToolAsksAgain: a tool whose descriptor changed between the
// approval and the attempt (another process, a new version) does not run
// under the old approval, and does not fail the run: a new action of the
// same call at the new version supersedes it and goes through the gate,
// which asks a person; once granted it runs, once. A tool that is gone
// stops the run with a reason that names it.
func TestChangedToolAsksAgain(t *testing.T) {
	b := setup(t, simulator.Config{})
	ctx := context.Background()
	run := b.advance(t, b.submit(t, "practice-cards", "k1").ID)
	a := b.pendingAction(t, run.ID)
	require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))

	v2 := b.engineWith(t, func(d *contracts.ToolDescriptor) { d.Version = "2.0.0" })
	require.NoError(t, v2.Advance(ctx, run.ID))
	run, err := b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.RunAwaitingApproval, run.State)
	require.Equal(t, 0, b.effectCount(t))
	old, err := b.Store.FindActionByID(ctx, a.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.ActionSuperseded, old.State)
	next := b.pendingAction(t, run.ID)
	require.Equal(t, a.ID, next.Supersedes)
	require.Equal(t, "2.0.0", next.ToolVersion)
	require.Equal(t, a.Arguments, next.Arguments, "the same call")
	require.NotEqual(t, a.ActionDigest, next.ActionDigest, "the digest binds the version")
	require.Contains(t, next.Gate.Reason, "changed since the action was approved")

	require.ErrorIs(t, b.decide("bob", next, a.ActionDigest, ledger.DecisionGrant), ledger.ErrConflict,
		"the old digest does not approve the new action")
	require.NoError(t, b.decide("bob", next, next.ActionDigest, ledger.DecisionGrant))
	require.NoError(t, v2.Advance(ctx, run.ID))
	run, err = b.Store.FindRunByID(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.RunCompleted, run.State)
	require.Equal(t, 1, b.effectCount(t))
	b.chainOK(t, run.ID)

	t.Run("gone tool stops the run", func(t *testing.T) {
		run := b.advance(t, b.submit(t, "practice-cards", "k2").ID)
		a := b.pendingAction(t, run.ID)
		require.NoError(t, b.decide("bob", a, a.ActionDigest, ledger.DecisionGrant))
		gone := b.engineWith(t, nil)
		require.NoError(t, gone.Advance(ctx, run.ID))
		run, err := b.Store.FindRunByID(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.RunFailed, run.State)
		require.Equal(t, ledger.StopInternalError, run.StopReason)
		events, err := b.Store.FindEvents(ctx, run.ID)
		require.NoError(t, err)
		require.Contains(t, string(events[len(events)-1].Data), "cards.write is no longer registered")
	})
}

// approvalsOf lists an action's approvals in id order.
func (b *bundle) approvalsOf(t *testing.T, id ledger.ActionID) []*ledger.Approval {
	t.Helper()
	aprs, err := b.Store.FindApprovals(context.Background(), ledger.ApprovalFilter{ActionID: &id})
	require.NoError(t, err)
	return aprs
}

// engineWith is another engine on b's store with the practice-cards
// agent whose cards.write descriptor change made; a nil change leaves
// cards.write out.
func (b *bundle) engineWith(t *testing.T, change func(*contracts.ToolDescriptor)) *engine.Engine {
	t.Helper()
	agent := simulator.PracticeCardsAgent(b.effects, simulator.Config{})
	var tools []engine.Tool
	for _, tool := range agent.Tools {
		d := tool.Descriptor()
		switch {
		case d.Name != simulator.CardsWriteTool:
			tools = append(tools, tool)
		case change != nil:
			change(&d)
			tools = append(tools, described{Tool: tool, d: d})
		}
	}
	agent.Tools = tools
	eng, err := engine.New(engine.Config{Store: b.Store, Approvals: b.approvals, Agents: []engine.Agent{agent}, Now: b.Clock.Now})
	require.NoError(t, err)
	return eng
}

// described is a tool with another descriptor.
type described struct {
	engine.Tool
	d contracts.ToolDescriptor
}

func (t described) Descriptor() contracts.ToolDescriptor { return t.d }
