package httpupstream_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/httptool"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/simulator/httpupstream"
)

const cardsArgs = `{"title":"Rust","cards":[{"front":"Q1","back":"A1"}]}`

// bundle is the simulator's http tool server on a real effect store, and
// the ledger's executor pointed at it.
type bundle struct {
	store *simulator.EffectStore
	srv   *httptest.Server
	write *httptool.Tool
	count *httptool.Tool
}

func setup(t *testing.T, cfg simulator.Config, opts httpupstream.Options) *bundle {
	t.Helper()
	store, err := simulator.OpenEffectStore(context.Background(), filepath.Join(t.TempDir(), "effects.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	h, err := httpupstream.New(store, cfg, opts)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	getenv := func(string) string { return opts.Token }
	ep := contracts.HTTPEndpoints{URL: srv.URL + httpupstream.PathCardsWrite, QueryURL: srv.URL + httpupstream.PathCardsQuery,
		CancelURL: srv.URL + httpupstream.PathCardsCancel}
	if opts.Token != "" {
		ep.BearerTokenEnv = "SIM_TOKEN"
	}
	write, err := httptool.New(simulator.CardsWriteDescriptor(), ep, httptool.Options{Getenv: getenv})
	require.NoError(t, err)
	count, err := httptool.New(simulator.CardsCountDescriptor(), contracts.HTTPEndpoints{URL: srv.URL + httpupstream.PathCardsCount,
		QueryURL: srv.URL + "/unused", BearerTokenEnv: ep.BearerTokenEnv}, httptool.Options{Getenv: getenv})
	require.NoError(t, err)
	return &bundle{store: store, srv: srv, write: write, count: count}
}

func (b *bundle) effects(t *testing.T, key string) int {
	t.Helper()
	n, err := b.store.CountEffects(context.Background(), key)
	require.NoError(t, err)
	return n
}

func call(run string, token int64) engine.Call {
	return engine.Call{RunID: ledger.RunID(run), ActionID: "act_1", Attempt: 1, AttemptID: "att_1", DedupKey: run + "/act_1",
		FencingToken: token, Arguments: json.RawMessage(cardsArgs)}
}

func TestServer(t *testing.T) {
	t.Run("WriteDedupsByKey", func(t *testing.T) {
		b := setup(t, simulator.Config{}, httpupstream.Options{})
		ctx := context.Background()
		first, err := b.write.Execute(ctx, call("run_a", 1))
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, first.Effect)
		second, err := b.write.Execute(ctx, call("run_a", 1))
		require.NoError(t, err)
		require.JSONEq(t, string(first.Output), string(second.Output), "the first effect's output")
		require.Equal(t, 1, b.effects(t, "run_a/act_1"))

		calls, err := b.store.Calls(ctx)
		require.NoError(t, err)
		require.Len(t, calls, 2)
		require.Equal(t, simulator.CallDeduplicated, calls[1].Outcome)
		require.EqualValues(t, 1, calls[1].FencingToken)
	})

	// A write whose fencing token is lower than its run's highest comes
	// from a process that lost the run: refused, nothing done.
	t.Run("Fenced", func(t *testing.T) {
		b := setup(t, simulator.Config{}, httpupstream.Options{})
		ctx := context.Background()
		newer := call("run_f", 9)
		newer.DedupKey, newer.ActionID = "run_f/act_new", "act_new"
		_, err := b.write.Execute(ctx, newer)
		require.NoError(t, err)
		_, err = b.write.Execute(ctx, call("run_f", 4))
		var te *engine.ToolError
		require.ErrorAs(t, err, &te)
		require.Equal(t, simulator.CodeFenced, te.Code)
		require.Equal(t, ledger.EffectNotHappened, te.Effect)
		require.Equal(t, 0, b.effects(t, "run_f/act_1"))

		_, err = b.write.Execute(ctx, call("run_other", 4))
		require.NoError(t, err, "another run's fence is its own")
	})

	t.Run("QueryAndCancel", func(t *testing.T) {
		b := setup(t, simulator.Config{}, httpupstream.Options{})
		ctx := context.Background()
		q, err := b.write.Query(ctx, "run_q/act_1")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectNotHappened, q.Effect)

		_, err = b.write.Execute(ctx, call("run_q", 1))
		require.NoError(t, err)
		q, err = b.write.Query(ctx, "run_q/act_1")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, q.Effect)
		require.Contains(t, string(q.Output), `"effect_seq"`)

		c, err := b.write.Cancel(ctx, "run_q/act_1")
		require.NoError(t, err)
		require.False(t, c.Confirmed, "it happened: nothing to cancel")
		c, err = b.write.Cancel(ctx, "run_c/act_1")
		require.NoError(t, err)
		require.True(t, c.Confirmed)
	})

	t.Run("Read", func(t *testing.T) {
		b := setup(t, simulator.Config{}, httpupstream.Options{})
		ctx := context.Background()
		_, err := b.write.Execute(ctx, call("run_r", 1))
		require.NoError(t, err)
		res, err := b.count.Execute(ctx, engine.Call{RunID: "run_r", DedupKey: "run_r/act_2", Arguments: json.RawMessage(`{"title":"Rust"}`)})
		require.NoError(t, err)
		require.Equal(t, ledger.EffectNotHappened, res.Effect)
		require.JSONEq(t, `{"count": 1, "title": "Rust"}`, string(res.Output))
	})

	// A simulated error answers with a 4xx and the effect it knows.
	t.Run("SimulatedError", func(t *testing.T) {
		cfg := simulator.Config{Tools: map[string]simulator.ToolConfig{simulator.CardsWriteTool: {
			Faults: []simulator.Fault{{Kind: simulator.FaultError, Calls: []int{1}}}}}}
		b := setup(t, cfg, httpupstream.Options{})
		_, err := b.write.Execute(context.Background(), call("run_e", 1))
		var te *engine.ToolError
		require.ErrorAs(t, err, &te)
		require.Equal(t, simulator.CodeSimulatedError, te.Code)
		require.Equal(t, ledger.EffectNotHappened, te.Effect)
	})

	t.Run("QueryUnsupported", func(t *testing.T) {
		cfg := simulator.Config{Tools: map[string]simulator.ToolConfig{simulator.CardsWriteTool: {
			Guarantees: &contracts.Guarantees{Dedup: true}}}}
		b := setup(t, cfg, httpupstream.Options{})
		_, err := b.write.Query(context.Background(), "run_u/act_1")
		require.ErrorIs(t, err, httptool.ErrStatus)
		require.ErrorContains(t, err, "HTTP 501")
	})

	t.Run("Token", func(t *testing.T) {
		b := setup(t, simulator.Config{}, httpupstream.Options{Token: "sim-token"})
		_, err := b.write.Execute(context.Background(), call("run_t", 1))
		require.NoError(t, err)

		resp, err := http.Post(b.srv.URL+httpupstream.PathCardsWrite, "application/json", strings.NewReader(`{"dedup_key": "k", "arguments": {}}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.Equal(t, 1, b.effects(t, "run_t/act_1"))
		require.Equal(t, 0, b.effects(t, "k"))
	})

	t.Run("ErrBadRequest", func(t *testing.T) {
		b := setup(t, simulator.Config{}, httpupstream.Options{})
		for name, body := range map[string]string{
			"not JSON":      `nope`,
			"no dedup key":  `{"arguments": {}}`,
			"unknown field": `{"dedup_key": "k", "arguments": {}, "colour": "blue"}`,
		} {
			t.Run(name, func(t *testing.T) {
				resp, err := http.Post(b.srv.URL+httpupstream.PathCardsWrite, "application/json", strings.NewReader(body))
				require.NoError(t, err)
				defer resp.Body.Close()
				require.Equal(t, http.StatusBadRequest, resp.StatusCode)
				data, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				require.Contains(t, string(data), `"effect":"not_happened"`)
			})
		}
		resp, err := http.Get(b.srv.URL + httpupstream.PathCardsWrite)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	})
}
