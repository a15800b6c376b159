package mcpupstream_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/simulator/mcpupstream"
)

// env is a server over a real effect store, and an SDK client connected to
// it in memory.
type env struct {
	store  *simulator.EffectStore
	server *mcp.Server
	client *mcp.ClientSession
}

// start opens an effect store in a temp dir, builds the server with cfg and
// opts and connects a client to it. before, if set, is applied to the
// server before it is connected (a test's middleware).
func start(t *testing.T, cfg simulator.Config, opts mcpupstream.Options, before ...func(*mcp.Server)) *env {
	t.Helper()
	ctx := context.Background()
	store, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	srv, err := mcpupstream.New(store, cfg, opts)
	require.NoError(t, err)
	for _, f := range before {
		f(srv)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	require.NoError(t, err)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return &env{store: store, server: srv, client: cs}
}

// guarantees is a Config giving cards.write the guarantees g.
func guarantees(g contracts.Guarantees) simulator.Config {
	return simulator.Config{Tools: map[string]simulator.ToolConfig{simulator.CardsWriteTool: {Guarantees: &g}}}
}

// meta is the _meta of a call of the action with dedup key key.
func meta(key string) mcp.Meta {
	return mcp.Meta{mcpupstream.MetaDedupKey: key}
}

// call calls a tool and fails the test on a protocol error.
func (e *env) call(t *testing.T, name string, m mcp.Meta, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := e.client.CallTool(context.Background(), &mcp.CallToolParams{Meta: m, Name: name, Arguments: args})
	require.NoError(t, err)
	return res
}

// deck is cards_write's arguments.
func deck(title string, n int) map[string]any {
	cards := make([]map[string]string, n)
	for i := range cards {
		cards[i] = map[string]string{"front": "Q", "back": "A"}
	}
	return map[string]any{"title": title, "cards": cards}
}

// effectOf is a result's _meta effect.
func effectOf(t *testing.T, r *mcp.CallToolResult) string {
	t.Helper()
	e, ok := r.Meta[mcpupstream.MetaEffect].(string)
	require.True(t, ok, "result _meta has no %s: %v", mcpupstream.MetaEffect, r.Meta)
	return e
}

// structured is a result's structured content.
func structured(t *testing.T, r *mcp.CallToolResult) map[string]any {
	t.Helper()
	m, ok := r.StructuredContent.(map[string]any)
	require.True(t, ok, "structured content is %T", r.StructuredContent)
	return m
}

// text is a result's one text content.
func text(t *testing.T, r *mcp.CallToolResult) string {
	t.Helper()
	require.Len(t, r.Content, 1)
	tc, ok := r.Content[0].(*mcp.TextContent)
	require.True(t, ok, "content is %T", r.Content[0])
	return tc.Text
}

// requireToolError checks a tool-error result: isError, "CODE: …" text,
// {"code", "message"} and the _meta effect.
func requireToolError(t *testing.T, r *mcp.CallToolResult, code string, effect ledger.EffectFact) {
	t.Helper()
	require.True(t, r.IsError, "not a tool error: %s", text(t, r))
	require.Equal(t, string(effect), effectOf(t, r))
	s := structured(t, r)
	require.Equal(t, code, s["code"])
	require.Equal(t, code+": "+s["message"].(string), text(t, r))
}

func TestListTools(t *testing.T) {
	t.Parallel()
	t.Run("Plain", func(t *testing.T) {
		t.Parallel()
		e := start(t, simulator.Config{}, mcpupstream.Options{})
		res, err := e.client.ListTools(context.Background(), nil)
		require.NoError(t, err)
		byName := map[string]*mcp.Tool{}
		for _, tool := range res.Tools {
			byName[tool.Name] = tool
		}
		require.ElementsMatch(t, []string{"cards_write", "cards_count", "cards_status", "cards_cancel"}, keys(byName))

		w := byName["cards_write"]
		schema, err := json.Marshal(w.InputSchema)
		require.NoError(t, err)
		require.JSONEq(t, string(simulator.CardsWriteDescriptor().ArgumentsSchema), string(schema))
		require.NotNil(t, w.Annotations.DestructiveHint)
		require.True(t, *w.Annotations.DestructiveHint)
		require.False(t, w.Annotations.IdempotentHint)
		require.False(t, w.Annotations.ReadOnlyHint)

		c := byName["cards_count"]
		schema, err = json.Marshal(c.InputSchema)
		require.NoError(t, err)
		require.JSONEq(t, string(simulator.CardsCountDescriptor().ArgumentsSchema), string(schema))
		require.True(t, c.Annotations.ReadOnlyHint)
		require.True(t, byName["cards_status"].Annotations.ReadOnlyHint)
		require.False(t, byName["cards_cancel"].Annotations.ReadOnlyHint)
	})
	t.Run("Misbehaving", func(t *testing.T) {
		t.Parallel()
		e := start(t, simulator.Config{}, mcpupstream.Options{Misbehaving: true})
		res, err := e.client.ListTools(context.Background(), nil)
		require.NoError(t, err)
		var names []string
		for _, tool := range res.Tools {
			names = append(names, tool.Name)
		}
		require.ElementsMatch(t, []string{"cards_write", "cards_count", "cards_status", "cards_cancel",
			"huge_read", "hang", "exit_now", "malformed"}, names)
	})
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestCardsWrite(t *testing.T) {
	t.Parallel()
	t.Run("Dedup", func(t *testing.T) {
		t.Parallel()
		e := start(t, guarantees(contracts.Guarantees{Query: true, Dedup: true, Cancel: true}), mcpupstream.Options{})
		first := e.call(t, "cards_write", meta("run-1/act-1"), deck("Rust", 3))
		require.False(t, first.IsError, text(t, first))
		require.Equal(t, "happened", effectOf(t, first))
		require.Equal(t, float64(3), structured(t, first)["written"])
		require.JSONEq(t, text(t, first), mustJSON(t, first.StructuredContent))

		second := e.call(t, "cards_write", meta("run-1/act-1"), deck("Rust", 3))
		require.False(t, second.IsError, text(t, second))
		require.Equal(t, "happened", effectOf(t, second))
		require.Equal(t, first.StructuredContent, second.StructuredContent, "the first effect's output, again")

		n, err := e.store.CountEffects(context.Background(), "run-1/act-1")
		require.NoError(t, err)
		require.Equal(t, 1, n, "one effect for two calls of one dedup key")
	})
	t.Run("NoDedup", func(t *testing.T) {
		t.Parallel()
		e := start(t, guarantees(contracts.Guarantees{Query: true, Dedup: false, Cancel: true}), mcpupstream.Options{})
		for range 2 {
			r := e.call(t, "cards_write", meta("run-1/act-1"), deck("Rust", 1))
			require.False(t, r.IsError, text(t, r))
			require.Equal(t, "happened", effectOf(t, r))
		}
		n, err := e.store.CountEffects(context.Background(), "run-1/act-1")
		require.NoError(t, err)
		require.Equal(t, 2, n, "a tool without dedup writes twice")
	})
	t.Run("NoDedupKey", func(t *testing.T) {
		t.Parallel()
		e := start(t, simulator.Config{}, mcpupstream.Options{})
		for range 2 {
			r := e.call(t, "cards_write", nil, deck("Rust", 1))
			require.False(t, r.IsError, text(t, r))
		}
		effects, err := e.store.Effects(context.Background())
		require.NoError(t, err)
		require.Len(t, effects, 2, "each call without a key gets a fresh one")
		require.NotEqual(t, effects[0].DedupKey, effects[1].DedupKey)
		for _, ef := range effects {
			require.True(t, strings.HasPrefix(ef.DedupKey, "mcp-upstream/"), ef.DedupKey)
			require.Equal(t, simulator.CardsWriteTool, ef.Tool)
		}
	})
	t.Run("MetaRecorded", func(t *testing.T) {
		t.Parallel()
		e := start(t, simulator.Config{}, mcpupstream.Options{})
		r := e.call(t, "cards_write", mcp.Meta{
			mcpupstream.MetaDedupKey:     "run-9/act-2",
			mcpupstream.MetaRun:          "run-9",
			mcpupstream.MetaAction:       "act-2",
			mcpupstream.MetaFencingToken: 7,
			mcpupstream.MetaAttempt:      4,
		}, deck("Rust", 1))
		require.False(t, r.IsError, text(t, r))
		calls, err := e.store.Calls(context.Background())
		require.NoError(t, err)
		require.Len(t, calls, 1)
		require.Equal(t, "run-9/act-2", calls[0].DedupKey)
		require.Equal(t, int64(4), calls[0].Attempt)
		require.Equal(t, int64(7), calls[0].FencingToken)
		require.Equal(t, simulator.CallEffect, calls[0].Outcome)
	})
	t.Run("InvalidMeta", func(t *testing.T) {
		t.Parallel()
		e := start(t, simulator.Config{}, mcpupstream.Options{})
		for name, m := range map[string]mcp.Meta{
			"dedup key a number":      {mcpupstream.MetaDedupKey: 12},
			"fencing token a string":  {mcpupstream.MetaFencingToken: "7"},
			"fencing token negative":  {mcpupstream.MetaFencingToken: -1},
			"attempt not an integer":  {mcpupstream.MetaAttempt: 1.5},
			"run an object":           {mcpupstream.MetaRun: map[string]any{}},
			"action a list of things": {mcpupstream.MetaAction: []any{"a"}},
		} {
			r := e.call(t, "cards_write", m, deck("Rust", 1))
			requireToolError(t, r, mcpupstream.CodeInvalidMeta, ledger.EffectNotHappened)
			require.Contains(t, text(t, r), "_meta io.actionledger/", name)
		}
		calls, err := e.store.Calls(context.Background())
		require.NoError(t, err)
		require.Empty(t, calls, "the tool was never called")
	})
	t.Run("InvalidArguments", func(t *testing.T) {
		t.Parallel()
		e := start(t, simulator.Config{}, mcpupstream.Options{})
		r := e.call(t, "cards_write", meta("k"), []any{"not", "an", "object"})
		requireToolError(t, r, simulator.CodeInvalidArguments, ledger.EffectNotHappened)
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestCardsCount(t *testing.T) {
	t.Parallel()
	e := start(t, simulator.Config{}, mcpupstream.Options{})
	for _, key := range []string{"a", "b"} {
		r := e.call(t, "cards_write", meta(key), deck("Rust", 2))
		require.False(t, r.IsError, text(t, r))
	}
	r := e.call(t, "cards_count", nil, map[string]any{"title": "Rust"})
	require.False(t, r.IsError, text(t, r))
	require.Equal(t, "not_happened", effectOf(t, r))
	require.Equal(t, map[string]any{"count": float64(2), "title": "Rust"}, structured(t, r))
	effects, err := e.store.Effects(context.Background())
	require.NoError(t, err)
	require.Len(t, effects, 2, "a read writes no effect")
}

func TestCardsStatus(t *testing.T) {
	t.Parallel()
	e := start(t, simulator.Config{}, mcpupstream.Options{})
	w := e.call(t, "cards_write", meta("run-1/act-1"), deck("Rust", 2))
	require.False(t, w.IsError, text(t, w))

	t.Run("AfterWrite", func(t *testing.T) {
		r := e.call(t, "cards_status", nil, map[string]any{"dedup_key": "run-1/act-1"})
		require.False(t, r.IsError, text(t, r))
		require.Equal(t, "not_happened", effectOf(t, r), "a status call changes nothing")
		s := structured(t, r)
		require.Equal(t, "happened", s["effect"])
		require.Equal(t, w.StructuredContent, s["output"])
		require.JSONEq(t, mustJSON(t, s), text(t, r))
	})
	t.Run("UnknownKey", func(t *testing.T) {
		r := e.call(t, "cards_status", nil, map[string]any{"dedup_key": "never-written"})
		require.False(t, r.IsError, text(t, r))
		require.Equal(t, map[string]any{"effect": "not_happened"}, structured(t, r))
	})
	t.Run("NoKey", func(t *testing.T) {
		r := e.call(t, "cards_status", nil, map[string]any{})
		requireToolError(t, r, simulator.CodeInvalidArguments, ledger.EffectNotHappened)
		r = e.call(t, "cards_status", nil, map[string]any{"dedup_key": "k", "extra": 1})
		requireToolError(t, r, simulator.CodeInvalidArguments, ledger.EffectNotHappened)
	})
	t.Run("QueryError", func(t *testing.T) {
		e := start(t, simulator.Config{Tools: map[string]simulator.ToolConfig{simulator.CardsWriteTool: {
			Faults: []simulator.Fault{{Kind: simulator.FaultQueryError, Calls: []int{1}}}}}}, mcpupstream.Options{})
		r := e.call(t, "cards_status", nil, map[string]any{"dedup_key": "k"})
		requireToolError(t, r, simulator.CodeSimulatedQueryError, ledger.EffectUnknown)
		r = e.call(t, "cards_status", nil, map[string]any{"dedup_key": "k"})
		require.False(t, r.IsError, "only the first query fails: %s", text(t, r))
	})
	t.Run("Unsupported", func(t *testing.T) {
		e := start(t, guarantees(contracts.Guarantees{Query: false, Dedup: true, Cancel: true}), mcpupstream.Options{})
		r := e.call(t, "cards_status", nil, map[string]any{"dedup_key": "k"})
		requireToolError(t, r, mcpupstream.CodeUnsupported, ledger.EffectNotHappened)
	})
}

func TestCardsCancel(t *testing.T) {
	t.Parallel()
	e := start(t, simulator.Config{}, mcpupstream.Options{})
	t.Run("BeforeAnyEffect", func(t *testing.T) {
		r := e.call(t, "cards_cancel", nil, map[string]any{"dedup_key": "run-1/act-1"})
		require.False(t, r.IsError, text(t, r))
		require.Equal(t, "happened", effectOf(t, r), "the tombstone is written")
		s := structured(t, r)
		require.Equal(t, true, s["confirmed"])
		require.Equal(t, map[string]any{"dedup_key": "run-1/act-1", "cancelled": true}, s["detail"])
	})
	t.Run("AfterTheEffect", func(t *testing.T) {
		w := e.call(t, "cards_write", meta("run-1/act-2"), deck("Rust", 1))
		require.False(t, w.IsError, text(t, w))
		r := e.call(t, "cards_cancel", nil, map[string]any{"dedup_key": "run-1/act-2"})
		require.False(t, r.IsError, text(t, r))
		require.Equal(t, "not_happened", effectOf(t, r))
		s := structured(t, r)
		require.Equal(t, false, s["confirmed"])
		require.Equal(t, structured(t, w)["effect_seq"], s["detail"].(map[string]any)["effect_seq"])
	})
	t.Run("Unsupported", func(t *testing.T) {
		e := start(t, guarantees(contracts.Guarantees{Query: true, Dedup: true, Cancel: false}), mcpupstream.Options{})
		r := e.call(t, "cards_cancel", nil, map[string]any{"dedup_key": "k"})
		requireToolError(t, r, mcpupstream.CodeUnsupported, ledger.EffectNotHappened)
	})
}

func TestFencing(t *testing.T) {
	t.Parallel()
	e := start(t, simulator.Config{}, mcpupstream.Options{})
	at := func(key string, token int) mcp.Meta {
		return mcp.Meta{mcpupstream.MetaDedupKey: key, mcpupstream.MetaRun: "run-1", mcpupstream.MetaFencingToken: token}
	}
	r := e.call(t, "cards_write", at("run-1/act-1", 5), deck("Rust", 1))
	require.False(t, r.IsError, text(t, r))

	r = e.call(t, "cards_write", at("run-1/act-2", 3), deck("Rust", 1))
	requireToolError(t, r, simulator.CodeFenced, ledger.EffectNotHappened)
	n, err := e.store.CountEffects(context.Background(), "run-1/act-2")
	require.NoError(t, err)
	require.Zero(t, n, "a stale token writes nothing")

	r = e.call(t, "cards_write", at("run-1/act-2", 5), deck("Rust", 1))
	require.False(t, r.IsError, "the holder's own token still writes: %s", text(t, r))
}

func TestFaults(t *testing.T) {
	t.Parallel()
	t.Run("Error", func(t *testing.T) {
		t.Parallel()
		e := start(t, simulator.Config{Tools: map[string]simulator.ToolConfig{simulator.CardsWriteTool: {
			Faults: []simulator.Fault{{Kind: simulator.FaultError, Calls: []int{1}}}}}}, mcpupstream.Options{})
		r := e.call(t, "cards_write", meta("k"), deck("Rust", 1))
		requireToolError(t, r, simulator.CodeSimulatedError, ledger.EffectNotHappened)
		require.Contains(t, text(t, r), "simulated_error: simulated error on call 1 of k")

		r = e.call(t, "cards_write", meta("k"), deck("Rust", 1))
		require.False(t, r.IsError, "the fault is on call 1 only: %s", text(t, r))
		require.Equal(t, "happened", effectOf(t, r))
	})
	t.Run("ErrorUnknown", func(t *testing.T) {
		t.Parallel()
		e := start(t, simulator.Config{Tools: map[string]simulator.ToolConfig{simulator.CardsCountTool: {
			Faults: []simulator.Fault{{Kind: simulator.FaultErrorUnknown}}}}}, mcpupstream.Options{})
		r := e.call(t, "cards_count", nil, map[string]any{"title": "Rust"})
		requireToolError(t, r, simulator.CodeSimulatedError, ledger.EffectUnknown)
	})
	t.Run("EffectThenCrash", func(t *testing.T) {
		t.Parallel()
		var crashes atomic.Int32
		e := start(t, simulator.Config{
			Tools: map[string]simulator.ToolConfig{simulator.CardsWriteTool: {
				Faults: []simulator.Fault{{Kind: simulator.FaultEffectThenCrash, Calls: []int{1}}}}},
			CrashFunc: func() { crashes.Add(1) },
		}, mcpupstream.Options{})
		r := e.call(t, "cards_write", meta("k"), deck("Rust", 1))
		requireToolError(t, r, mcpupstream.CodeToolFailure, ledger.EffectUnknown)
		require.Equal(t, int32(1), crashes.Load())
		n, err := e.store.CountEffects(context.Background(), "k")
		require.NoError(t, err)
		require.Equal(t, 1, n, "the effect was written before the crash")
	})
	t.Run("InvalidConfig", func(t *testing.T) {
		t.Parallel()
		store, err := simulator.OpenEffectStore(context.Background(), filepath.Join(t.TempDir(), "e.db"), nil)
		require.NoError(t, err)
		defer store.Close()
		_, err = mcpupstream.New(store, simulator.Config{Tools: map[string]simulator.ToolConfig{"cards_write": {}}}, mcpupstream.Options{})
		require.ErrorContains(t, err, `unknown tool "cards_write"`, "configured under the simulator's names")
	})
}

func TestHugeRead(t *testing.T) {
	t.Parallel()
	e := start(t, simulator.Config{}, mcpupstream.Options{Misbehaving: true})
	for _, n := range []int{0, 1, 3 << 20} {
		r := e.call(t, "huge_read", nil, map[string]any{"bytes": n})
		require.False(t, r.IsError)
		require.Len(t, text(t, r), n)
		require.Equal(t, "not_happened", effectOf(t, r))
	}
	r := e.call(t, "huge_read", nil, map[string]any{"bytes": mcpupstream.MaxHugeReadBytes + 1})
	requireToolError(t, r, simulator.CodeInvalidArguments, ledger.EffectNotHappened)
	r = e.call(t, "huge_read", nil, map[string]any{})
	requireToolError(t, r, simulator.CodeInvalidArguments, ledger.EffectNotHappened)
}

func TestNoMisbehavingByDefault(t *testing.T) {
	t.Parallel()
	e := start(t, simulator.Config{}, mcpupstream.Options{})
	_, err := e.client.CallTool(context.Background(), &mcp.CallToolParams{Name: "exit_now"})
	require.ErrorContains(t, err, `unknown tool "exit_now"`)
}

func TestHang(t *testing.T) {
	t.Parallel()
	// The test's middleware sees the server enter hang and what hang
	// returns, once it returns.
	entered := make(chan struct{})
	returned := make(chan *mcp.CallToolResult, 1)
	observe := func(s *mcp.Server) {
		s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				call, ok := req.(*mcp.CallToolRequest)
				if !ok || call.Params.Name != "hang" {
					return next(ctx, method, req)
				}
				close(entered)
				res, err := next(ctx, method, req)
				// A copy through its JSON: the session writes into the
				// result's _meta as it sends it.
				var seen mcp.CallToolResult
				if b, merr := json.Marshal(res); merr == nil && json.Unmarshal(b, &seen) == nil {
					returned <- &seen
				} else {
					returned <- nil
				}
				return res, err
			}
		})
	}
	e := start(t, simulator.Config{}, mcpupstream.Options{Misbehaving: true}, observe)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	callErr := make(chan error, 1)
	go func() {
		_, err := e.client.CallTool(ctx, &mcp.CallToolParams{Name: "hang", Arguments: map[string]any{}})
		callErr <- err
	}()
	<-entered
	// A whole round trip on the same session while hang is in its handler:
	// hang has not returned meanwhile.
	r := e.call(t, "cards_count", nil, map[string]any{"title": "x"})
	require.False(t, r.IsError)
	select {
	case <-returned:
		t.Fatal("hang returned before its context ended")
	default:
	}

	cancel()
	require.ErrorIs(t, <-callErr, context.Canceled)
	select {
	case res := <-returned:
		require.NotNil(t, res)
		requireToolError(t, res, mcpupstream.CodeContextEnded, ledger.EffectNotHappened)
	case <-time.After(30 * time.Second): // a bound on a loaded machine, not a wait for something to happen
		t.Fatal("hang did not end with its request's context")
	}
}

func TestExitNow(t *testing.T) {
	t.Parallel()
	var status atomic.Int32
	status.Store(-1)
	e := start(t, simulator.Config{}, mcpupstream.Options{Misbehaving: true, Exit: func(s int) { status.Store(int32(s)) }})
	r := e.call(t, "exit_now", nil, map[string]any{})
	require.Equal(t, int32(mcpupstream.ExitStatus), status.Load())
	requireToolError(t, r, mcpupstream.CodeExitReturned, ledger.EffectNotHappened)
}

func TestMalformed(t *testing.T) {
	t.Parallel()
	e := start(t, simulator.Config{}, mcpupstream.Options{Misbehaving: true})
	for _, kind := range []string{"", mcpupstream.MalformedContentNotArray, mcpupstream.MalformedUnknownContent} {
		t.Run("kind="+kind, func(t *testing.T) {
			args := map[string]any{}
			if kind != "" {
				args["kind"] = kind
			}
			_, err := e.client.CallTool(context.Background(), &mcp.CallToolParams{Name: "malformed", Arguments: args})
			require.Error(t, err, "the SDK's client cannot use the answer")
			// The session survives an answer it could not use.
			r := e.call(t, "cards_count", nil, map[string]any{"title": "x"})
			require.False(t, r.IsError)
		})
	}
	t.Run("UnknownKind", func(t *testing.T) {
		r := e.call(t, "malformed", nil, map[string]any{"kind": "nope"})
		requireToolError(t, r, simulator.CodeInvalidArguments, ledger.EffectNotHappened)
	})
	t.Run("kind="+mcpupstream.MalformedDeepNesting, func(t *testing.T) {
		e := start(t, simulator.Config{}, mcpupstream.Options{Misbehaving: true})
		_, err := e.client.CallTool(context.Background(), &mcp.CallToolParams{Name: "malformed",
			Arguments: map[string]any{"kind": mcpupstream.MalformedDeepNesting}})
		require.ErrorContains(t, err, "exceeded maximum nesting depth")
		// The SDK's client cannot even read the message, and closes the
		// session.
		_, err = e.client.CallTool(context.Background(), &mcp.CallToolParams{Name: "cards_count",
			Arguments: map[string]any{"title": "x"}})
		require.Error(t, err)
	})
}
