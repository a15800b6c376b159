package mcpgw_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// notes is an upstream of the tests' own: a write tool that counts its
// effects per dedup key (deduping when asked), a read, and a query tool
// that says whether a dedup key's write took effect.
type notes struct {
	dedup bool

	mu      sync.Mutex
	effects map[string]int // by dedup key
	calls   int
	meta    []mcp.Meta
	// started, if set, hears of each call of note_hang; release, closed
	// when the test ends, lets the calls that hang go.
	started chan struct{}
	release chan struct{}
}

func (n *notes) server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "notes", Version: "1"}, nil)
	object := json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`)
	s.AddTool(&mcp.Tool{Name: "note_write", Description: "Write a note.", InputSchema: object,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, // a lie: the profile decides
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			key, _ := req.Params.Meta[mcpgw.MetaDedupKey].(string)
			n.mu.Lock()
			defer n.mu.Unlock()
			n.calls++
			n.meta = append(n.meta, req.Params.Meta)
			if !n.dedup || n.effects[key] == 0 {
				n.effects[key]++
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "written: " + string(req.Params.Arguments)}},
				Meta: mcp.Meta{mcpgw.MetaEffect: "happened"}}, nil
		})
	s.AddTool(&mcp.Tool{Name: "note_huge", InputSchema: json.RawMessage(`{"type":"object","properties":{"mb":{"type":"integer"}}}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct {
				MB int `json:"mb"`
			}
			_ = json.Unmarshal(req.Params.Arguments, &args)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", args.MB<<20)}}}, nil
		})
	s.AddTool(&mcp.Tool{Name: "note_hang", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n.mu.Lock()
			n.calls++
			started := n.started
			n.mu.Unlock()
			if started != nil {
				started <- struct{}{}
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-n.release:
				return nil, errors.New("the test is over")
			}
		})
	s.AddTool(&mcp.Tool{Name: "note_count", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n.mu.Lock()
			defer n.mu.Unlock()
			total := 0
			for _, c := range n.effects {
				total += c
			}
			return &mcp.CallToolResult{StructuredContent: map[string]int{"notes": total},
				Content: []mcp.Content{&mcp.TextContent{Text: "counted"}}}, nil
		})
	s.AddTool(&mcp.Tool{Name: "note_status", InputSchema: json.RawMessage(`{"type":"object","properties":{"dedup_key":{"type":"string"}}}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct {
				DedupKey string `json:"dedup_key"`
			}
			_ = json.Unmarshal(req.Params.Arguments, &args)
			n.mu.Lock()
			defer n.mu.Unlock()
			effect := "not_happened"
			if n.effects[args.DedupKey] > 0 {
				effect = "happened"
			}
			return &mcp.CallToolResult{StructuredContent: map[string]string{"effect": effect},
				Content: []mcp.Content{&mcp.TextContent{Text: effect}}}, nil
		})
	return s
}

func (n *notes) effectCount() (total int, calls int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.effects {
		total += c
	}
	return total, n.calls
}

// harness is a gateway over a real SQLite ledger, a real engine and the
// notes upstream over real HTTP, with an MCP client of the SDK on it.
type harness struct {
	t         *testing.T
	store     *ledger.DB
	approvals *approval.Service
	engine    *engine.Engine
	gw        *mcpgw.Gateway
	up        *notes
	srv       *httptest.Server
	client    *mcp.ClientSession
}

func newHarness(t *testing.T, wait string) *harness {
	t.Helper()
	return newHarnessWith(t, wait, nil)
}

// newHarnessWith is newHarness with approval rules.
func newHarnessWith(t *testing.T, wait string, rules *contracts.Rules) *harness {
	t.Helper()
	ctx := context.Background()
	up := &notes{dedup: true, effects: map[string]int{}, release: make(chan struct{})}
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up.server() }, nil))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(up.release) })
	dir := t.TempDir()
	cfg := &contracts.ConfigMCP{ApprovalWait: wait, Upstreams: []contracts.ConfigUpstream{{Name: "notes", URL: srv.URL,
		Tools: map[string]contracts.ToolProfile{
			"note_write": {Effect: contracts.EffectWrite, Guarantees: contracts.Guarantees{Query: true, Dedup: true},
				Query: &contracts.ProbeTool{Tool: "note_status"}},
			"note_count":  {Effect: contracts.EffectRead},
			"note_status": {Effect: contracts.EffectRead},
			"note_huge":   {Effect: contracts.EffectRead, TimeoutMS: 120000},
			"note_hang":   {TimeoutMS: 2000},
		}}}}
	// An operator confirms the upstream's definitions first.
	confirm, err := mcpgw.New(mcpgw.Options{Config: cfg, Dir: dir})
	require.NoError(t, err)
	st, err := confirm.Survey(ctx)
	require.NoError(t, err)
	require.Len(t, st, 5)
	for _, s := range st {
		require.Equal(t, mcpgw.StatusUnconfirmed, s.Status, s.Name)
	}
	done, err := confirm.Confirm(ctx, []string{"notes__note_write", "notes__note_count", "notes__note_huge", "notes__note_hang"}, "operator", time.Now())
	require.NoError(t, err)
	require.Equal(t, []string{"notes__note_count", "notes__note_hang", "notes__note_huge", "notes__note_write"}, done)
	require.NoError(t, confirm.Close())

	store, err := sqlite.OpenStore(ctx, sqlite.Config{Path: filepath.Join(dir, "ledger.db")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	// The approval service asks for the tools' descriptors once they exist,
	// as cmd/ledger wires it.
	tools := map[string]contracts.ToolDescriptor{}
	policy, err := approval.NewPolicy(rules, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(store, policy, func(n string) (contracts.ToolDescriptor, bool) { d, ok := tools[n]; return d, ok }, approval.Options{})
	gw, err := mcpgw.New(mcpgw.Options{Config: cfg, Dir: dir, ApprovalURL: func(id ledger.ActionID) string { return "http://ledger.test/v1/actions/" + string(id) },
		Approvals: svc})
	require.NoError(t, err)
	t.Cleanup(func() { _ = gw.Close() })
	agent := gw.Agent()
	require.Len(t, agent.Tools, 4)
	for _, tl := range agent.Tools {
		tools[tl.Descriptor().Name] = tl.Descriptor()
	}
	e, err := engine.New(engine.Config{Store: store, Approvals: svc, Agents: []engine.Agent{agent}})
	require.NoError(t, err)
	gw.Bind(e)

	h := &harness{t: t, store: store, approvals: svc, engine: e, gw: gw, up: up, srv: srv}
	h.client = h.connect(mcpgw.Identity{Tenant: "default", Principal: "agent"}, nil)
	return h
}

// connect serves a new stdio session as id to a new SDK client.
func (h *harness) connect(id mcpgw.Identity, opts *mcp.ClientOptions, sending ...mcp.Middleware) *mcp.ClientSession {
	h.t.Helper()
	return h.connectAt(id, opts, "", sending...)
}

// connectAt is connect of a client that speaks the protocol revision
// version ("": the SDK's newest).
func (h *harness) connectAt(id mcpgw.Identity, opts *mcp.ClientOptions, version string, sending ...mcp.Middleware) *mcp.ClientSession {
	h.t.Helper()
	cin, sout := io.Pipe()
	sin, cout := io.Pipe()
	sctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- h.gw.ServeStdio(sctx, id, sin, sout) }()
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, opts)
	client.AddSendingMiddleware(sending...)
	cs, err := client.Connect(context.Background(), &mcp.IOTransport{Reader: cin, Writer: cout}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	require.NoError(h.t, err)
	h.t.Cleanup(func() {
		_ = cs.Close()
		cancel()
		<-served
	})
	return cs
}

func (h *harness) call(name string, args any) *mcp.CallToolResult {
	h.t.Helper()
	res, err := h.client.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(h.t, err)
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestGatewayListsConfirmedToolsWithTheirProfiles(t *testing.T) {
	h := newHarness(t, "200ms")
	res, err := h.client.ListTools(context.Background(), nil)
	require.NoError(t, err)
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		if tl.Name == "notes__note_write" {
			// The upstream hinted read-only; the profile says write.
			require.False(t, tl.Annotations.ReadOnlyHint)
			require.True(t, *tl.Annotations.DestructiveHint)
		}
	}
	// note_status was never confirmed: not served.
	require.Equal(t, []string{"notes__note_count", "notes__note_hang", "notes__note_huge", "notes__note_write"}, names)
}

func TestGatewayRunsAReadAtOnceAndRecordsIt(t *testing.T) {
	h := newHarness(t, "200ms")
	res := h.call("notes__note_count", map[string]any{})
	require.False(t, res.IsError, text(res))
	require.Equal(t, "succeeded", res.Meta[mcpgw.MetaState])
	a, err := h.store.FindActionByID(context.Background(), ledger.ActionID(res.Meta[mcpgw.MetaAction].(string)))
	require.NoError(t, err)
	require.Equal(t, "notes.note_count", a.Tool)
	require.Equal(t, ledger.ActionSucceeded, a.State)
}

func TestGatewayWriteWaitsForItsDigestAndRunsOnce(t *testing.T) {
	h := newHarness(t, "200ms")
	ctx := context.Background()
	args := map[string]any{"text": "pay the invoice"}
	res := h.call("notes__note_write", args)
	require.True(t, res.IsError)
	require.Contains(t, text(res), "waits for a person to approve")
	id := ledger.ActionID(res.Meta[mcpgw.MetaAction].(string))
	digest := ledger.Digest(res.Meta[mcpgw.MetaDigest].(string))
	require.Contains(t, text(res), string(digest))
	total, calls := h.up.effectCount()
	require.Zero(t, total+calls, "nothing reaches the upstream before a person approves")

	// Calling again while it waits joins the same action.
	again := h.call("notes__note_write", args)
	require.Equal(t, string(id), again.Meta[mcpgw.MetaAction])

	_, err := h.approvals.Decide(ctx, approval.DecideParams{Tenant: "default", Principal: "alice", ActionID: id,
		ActionDigest: digest, Decision: ledger.DecisionGrant, Reason: "ok"})
	require.NoError(t, err)
	done := h.call("notes__note_write", args)
	require.False(t, done.IsError, text(done))
	require.Equal(t, string(id), done.Meta[mcpgw.MetaAction])
	require.Contains(t, text(done), "pay the invoice")
	total, calls = h.up.effectCount()
	require.Equal(t, 1, total)
	require.Equal(t, 1, calls)
	// The upstream got the dedup key and the run's fencing token.
	h.up.mu.Lock()
	meta := h.up.meta[0]
	h.up.mu.Unlock()
	require.Equal(t, string(done.Meta[mcpgw.MetaRun].(string))+"/"+string(id), meta[mcpgw.MetaDedupKey])
	require.NotZero(t, meta[mcpgw.MetaFencingToken])

	// The outcome reached the client: a new call with the same arguments is
	// a new action, which asks a person again.
	require.Eventually(t, func() bool {
		obs, err := h.store.FindObservations(ctx, ledger.ObservationFilter{ActionID: &id})
		require.NoError(t, err)
		for _, o := range obs {
			if o.Source == ledger.ObservedDelivered {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond)
	third := h.call("notes__note_write", args)
	require.NotEqual(t, string(id), third.Meta[mcpgw.MetaAction])
	require.Contains(t, text(third), "waits for a person")
}
