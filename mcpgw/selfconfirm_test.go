package mcpgw_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// formClient is a 2025-11-25 client that takes form elicitations and
// answers each with confirm, counting them.
func formClient(confirm bool, asked *atomic.Int32) *mcp.ClientOptions {
	return &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}}},
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked.Add(1)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": confirm}}, nil
		},
	}
}

// A client's own answer to a form elicitation grants a write only where a
// rule allows it, recorded as self_confirmation; elsewhere the client is
// never asked and a person decides.
func TestGatewaySelfConfirmation(t *testing.T) {
	rules := &contracts.Rules{SchemaVersion: contracts.CurrentVersion, Rules: []contracts.Rule{
		{Tool: "notes.note_write", Decision: contracts.RuleDecisionRequireApproval, AllowSelfConfirmation: true}}}
	ctx := context.Background()

	t.Run("AllowedByARule", func(t *testing.T) {
		h := newHarnessWith(t, "5s", rules)
		var asked atomic.Int32
		cs := h.connectAt(mcpgw.Identity{Tenant: "default", Principal: "agent"}, formClient(true, &asked), "2025-11-25")
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "notes__note_write", Arguments: map[string]any{"text": "confirmed"}})
		require.NoError(t, err)
		require.False(t, res.IsError, text(res))
		require.EqualValues(t, 1, asked.Load())
		id := ledger.ActionID(res.Meta[mcpgw.MetaAction].(string))
		granted, err := h.store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &id})
		require.NoError(t, err)
		require.Len(t, granted, 1)
		require.Equal(t, approval.SelfConfirmer, granted[0].DecidedBy)
		require.Contains(t, granted[0].Reason, "agent")
		total, _ := h.up.effectCount()
		require.Equal(t, 1, total)
	})
	t.Run("Declined", func(t *testing.T) {
		h := newHarnessWith(t, "200ms", rules)
		var asked atomic.Int32
		cs := h.connectAt(mcpgw.Identity{Tenant: "default", Principal: "agent"}, formClient(false, &asked), "2025-11-25")
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "notes__note_write", Arguments: map[string]any{"text": "no"}})
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.Contains(t, text(res), "waits for a person")
		require.EqualValues(t, 1, asked.Load())
	})
	t.Run("NoRule", func(t *testing.T) {
		h := newHarness(t, "200ms")
		var asked atomic.Int32
		cs := h.connectAt(mcpgw.Identity{Tenant: "default", Principal: "agent"}, formClient(true, &asked), "2025-11-25")
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "notes__note_write", Arguments: map[string]any{"text": "x"}})
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.Zero(t, asked.Load(), "a client is asked only where a rule lets its answer count")
		total, _ := h.up.effectCount()
		require.Zero(t, total)
	})
}
