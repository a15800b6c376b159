package mcpgw_test

import (
	"context"
	"errors"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// Bad input through the gateway: each a clear MCP error, nothing lost,
// nothing run twice.

func (h *harness) actions(t *testing.T) []*ledger.Action {
	t.Helper()
	runs, err := h.store.FindRuns(context.Background(), ledger.RunFilter{})
	require.NoError(t, err)
	var out []*ledger.Action
	for _, r := range runs {
		as, err := h.store.FindActions(context.Background(), ledger.ActionFilter{RunID: &r.ID})
		require.NoError(t, err)
		out = append(out, as...)
	}
	return out
}

func (h *harness) approve(t *testing.T, res *mcp.CallToolResult) ledger.ActionID {
	t.Helper()
	id := ledger.ActionID(res.Meta[mcpgw.MetaAction].(string))
	_, err := h.approvals.Decide(context.Background(), approval.DecideParams{Tenant: "default", Principal: "alice", ActionID: id,
		ActionDigest: ledger.Digest(res.Meta[mcpgw.MetaDigest].(string)), Decision: ledger.DecisionGrant})
	require.NoError(t, err)
	return id
}

func TestGatewayRefusesAnUnlistedTool(t *testing.T) {
	h := newHarness(t, "200ms")
	_, err := h.client.CallTool(context.Background(), &mcp.CallToolParams{Name: "notes__note_status", Arguments: map[string]any{}})
	require.ErrorContains(t, err, "unknown tool", "note_status was never confirmed")
	require.Empty(t, h.actions(t))
}

func TestGatewayRefusesArgumentsTheSchemaRefuses(t *testing.T) {
	h := newHarness(t, "200ms")
	res := h.call("notes__note_write", map[string]any{"text": 5, "extra": true})
	require.True(t, res.IsError)
	require.Contains(t, text(res), "invalid_arguments")
	require.Contains(t, text(res), "/text")
	require.Empty(t, h.actions(t), "nothing is recorded of a call the schema refuses")
	_, calls := h.up.effectCount()
	require.Zero(t, calls)
}

func TestGatewayKeepsAHugeAnswerOutOfTheLedger(t *testing.T) {
	h := newHarness(t, "200ms")
	res := h.call("notes__note_huge", map[string]any{"mb": 20}) // over the cap plus 16 MiB; 50 MB over stdio: TestMCPGatewayHugeAnswer
	require.True(t, res.IsError)
	require.Contains(t, text(res), "result_too_large")
	require.Less(t, len(text(res)), 2000)
	as := h.actions(t)
	require.Len(t, as, 1)
	require.Equal(t, ledger.ActionFailed, as[0].State, "a read that answered too much is settled, with no effect")
	att, err := h.engine.LastAttempt(context.Background(), as[0].ID)
	require.NoError(t, err)
	require.Empty(t, att.Result)
}

// A client that goes away while its call waits for a person ends its wait,
// never the action: approved later, the next call joins it and it runs
// once.
func TestGatewayDisconnectWhileWaitingKeepsTheAction(t *testing.T) {
	h := newHarness(t, "10s")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := h.client.CallTool(ctx, &mcp.CallToolParams{Name: "notes__note_write", Arguments: map[string]any{"text": "x"}})
		errc <- err
	}()
	require.Eventually(t, func() bool { return len(h.actions(t)) == 1 }, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.Error(t, <-errc)
	require.NoError(t, h.client.Close())
	as := h.actions(t)
	require.Equal(t, ledger.ActionAwaitingApproval, as[0].State)

	again := h.connect(mcpgw.Identity{Tenant: "default", Principal: "agent"}, nil)
	_, err := h.approvals.Decide(context.Background(), approval.DecideParams{Tenant: "default", Principal: "alice", ActionID: as[0].ID,
		ActionDigest: as[0].ActionDigest, Decision: ledger.DecisionGrant})
	require.NoError(t, err)
	res, err := again.CallTool(context.Background(), &mcp.CallToolParams{Name: "notes__note_write", Arguments: map[string]any{"text": "x"}})
	require.NoError(t, err)
	require.False(t, res.IsError, text(res))
	require.Equal(t, string(as[0].ID), res.Meta[mcpgw.MetaAction])
	total, calls := h.up.effectCount()
	require.Equal(t, 1, total)
	require.Equal(t, 1, calls)
}

// An upstream that dies in the middle of a write: the call is a tool error
// whose effect is unknown, recovery asks the upstream (its query tool) once
// it is back, and the client's next call gets the settled outcome, never a
// second call.
func TestGatewayUpstreamDiesMidCall(t *testing.T) {
	h := newHarness(t, "200ms")
	h.up.mu.Lock()
	h.up.started = make(chan struct{}, 1)
	h.up.mu.Unlock()
	res := h.call("notes__note_hang", map[string]any{})
	id := h.approve(t, res)
	answered := make(chan *mcp.CallToolResult, 1)
	go func() { answered <- h.call("notes__note_hang", map[string]any{}) }()
	<-h.up.started
	h.srv.CloseClientConnections()
	got := <-answered
	require.True(t, got.IsError)
	a, err := h.store.FindActionByID(context.Background(), id)
	require.NoError(t, err)
	// note_hang has no profile guarantees: a write with no guarantees whose
	// call ended without an answer goes to a person.
	require.Contains(t, []ledger.ActionState{ledger.ActionNeedsReview, ledger.ActionUncertain}, a.State, text(got))
	require.Contains(t, text(got), string(id))
	_, calls := h.up.effectCount()
	require.Equal(t, 1, calls)

	// Calling again does not call again.
	again := h.call("notes__note_hang", map[string]any{})
	require.True(t, again.IsError)
	require.Equal(t, string(id), again.Meta[mcpgw.MetaAction])
	_, calls = h.up.effectCount()
	require.Equal(t, 1, calls)
}

// Another tenant's principal names the first one's run: not found, and
// nothing recorded in either run.
func TestGatewayRefusesAnotherTenantsRun(t *testing.T) {
	h := newHarness(t, "200ms")
	first := h.call("notes__note_count", map[string]any{})
	require.False(t, first.IsError, text(first))
	run := first.Meta[mcpgw.MetaRun].(string)

	other := h.connect(mcpgw.Identity{Tenant: "other", Principal: "mallory"}, nil)
	res, err := other.CallTool(context.Background(), &mcp.CallToolParams{Name: "notes__note_count", Arguments: map[string]any{},
		Meta: mcp.Meta{mcpgw.MetaRun: run}})
	require.NoError(t, err)
	require.True(t, res.IsError)
	require.Contains(t, text(res), "not found")
	require.Len(t, h.actions(t), 1)
}

// A forged request state is refused, and so is one the gateway gave
// another caller; the real one joins the action it names.
func TestGatewayChecksRequestStates(t *testing.T) {
	h := newHarness(t, "200ms")
	ctx := context.Background()
	// A 2026-07-28 client that takes URL elicitations: the gateway answers
	// input-required with a URL and a request state; the client's SDK
	// calls this handler, as its user would open the URL, then calls again
	// with the state. The person approves while the handler runs.
	var mu sync.Mutex
	var elicited []*mcp.ElicitParams
	urlCaps := &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}
	opts := &mcp.ClientOptions{
		Capabilities: urlCaps,
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			elicited = append(elicited, req.Params)
			mu.Unlock()
			a, err := h.store.FindActionByID(ctx, ledger.ActionID(path.Base(req.Params.URL)))
			if err != nil {
				return nil, err
			}
			if a.State == ledger.ActionAwaitingApproval {
				if _, err := h.approvals.Decide(ctx, approval.DecideParams{Tenant: "default", Principal: "alice", ActionID: a.ID,
					ActionDigest: a.ActionDigest, Decision: ledger.DecisionGrant}); err != nil {
					return nil, err
				}
			}
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
	}
	cs := h.connect(mcpgw.Identity{Tenant: "default", Principal: "agent"}, opts)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "notes__note_write", Arguments: map[string]any{"text": "elicited"}})
	require.NoError(t, err)
	require.False(t, res.IsError, text(res))
	mu.Lock()
	require.Len(t, elicited, 1)
	require.Equal(t, "url", elicited[0].Mode)
	require.Equal(t, "http://ledger.test/v1/actions/"+res.Meta[mcpgw.MetaAction].(string), elicited[0].URL)
	mu.Unlock()
	total, _ := h.up.effectCount()
	require.Equal(t, 1, total)

	// A client that handles input-required results itself gets the state.
	manual := &mcp.ClientOptions{Capabilities: urlCaps, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}
	second := map[string]any{"text": "second"}
	mine := h.connect(mcpgw.Identity{Tenant: "default", Principal: "agent"}, manual)
	waiting, err := mine.CallTool(ctx, &mcp.CallToolParams{Name: "notes__note_write", Arguments: second})
	require.NoError(t, err)
	require.True(t, waiting.NeedsInput())
	require.NotEmpty(t, waiting.RequestState)
	sealed := waiting.RequestState
	el, ok := waiting.InputRequests["approval"].(*mcp.ElicitParams)
	require.True(t, ok)
	id := ledger.ActionID(path.Base(el.URL))

	for name, tc := range map[string]struct {
		id    mcpgw.Identity
		state string
		args  map[string]any
	}{
		"forged":         {mcpgw.Identity{Tenant: "default", Principal: "agent"}, "eyJhIjoiYWN0In0.AAAA", second},
		"altered":        {mcpgw.Identity{Tenant: "default", Principal: "agent"}, "x" + sealed, second},
		"another tenant": {mcpgw.Identity{Tenant: "other", Principal: "agent"}, sealed, second},
		"other args":     {mcpgw.Identity{Tenant: "default", Principal: "agent"}, sealed, map[string]any{"text": "third"}},
	} {
		t.Run(name, func(t *testing.T) {
			other := h.connect(tc.id, manual)
			res, err := other.CallTool(ctx, &mcp.CallToolParams{Name: "notes__note_write", Arguments: tc.args, RequestState: tc.state})
			require.NoError(t, err)
			require.True(t, res.IsError)
			require.Contains(t, text(res), "request state")
		})
	}
	_, err = h.approvals.Decide(ctx, approval.DecideParams{Tenant: "default", Principal: "alice", ActionID: id,
		ActionDigest: ledger.Digest(waiting.Meta[mcpgw.MetaDigest].(string)), Decision: ledger.DecisionGrant})
	require.NoError(t, err)
	done, err := mine.CallTool(ctx, &mcp.CallToolParams{Name: "notes__note_write", Arguments: second, RequestState: sealed})
	require.NoError(t, err)
	require.False(t, done.IsError, text(done))
	require.Equal(t, string(id), done.Meta[mcpgw.MetaAction])
	total, calls := h.up.effectCount()
	require.Equal(t, 2, total)
	require.Equal(t, 2, calls)
}

// A flood of calls from one session: every call answered, the same read
// made at once joined into one action, distinct ones each recorded once.
func TestGatewayFloodFromOneSession(t *testing.T) {
	h := newHarness(t, "200ms")
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			res, err := h.client.CallTool(context.Background(), &mcp.CallToolParams{Name: "notes__note_count", Arguments: map[string]any{"i": i % 4}})
			switch {
			case err != nil:
				errs <- err
			case res.IsError:
				errs <- errors.New(text(res))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, a := range h.actions(t) {
		require.Equal(t, ledger.ActionSucceeded, a.State)
	}
}
