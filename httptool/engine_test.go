package httptool_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/httptool"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/simulator/httpupstream"
)

// The engine's runs calling the simulator's http tool over real HTTP: a
// real ledger on a temp file, the simulator's server on its own effect
// store, and an agent whose scripted model proposes one cards.write.

const deck = `{"title":"Rust","cards":[{"front":"What owns a value?","back":"One variable"}]}`

type e2e struct {
	*ledgertest.Bundle
	effects   *simulator.EffectStore
	approvals *approval.Service
	engine    *engine.Engine
}

// newE2E wires the engine with the agent "writer" over the http tool
// cards.write at the simulator's server; wrap, if set, stands between the
// executor and the server.
func newE2E(t *testing.T, cfg simulator.Config, wrap func(http.Handler) http.Handler) *e2e {
	t.Helper()
	ctx := context.Background()
	lb := ledgertest.OpenStore(t)
	effects, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = effects.Close() })
	h, err := httpupstream.New(effects, cfg, httpupstream.Options{Token: token})
	require.NoError(t, err)
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	write, err := httptool.New(simulator.CardsWriteDescriptor(), contracts.HTTPEndpoints{URL: srv.URL + httpupstream.PathCardsWrite,
		QueryURL: srv.URL + httpupstream.PathCardsQuery, CancelURL: srv.URL + httpupstream.PathCardsCancel, BearerTokenEnv: "TICKETS_TOKEN"},
		httptool.Options{Getenv: env})
	require.NoError(t, err)
	writer := engine.Agent{
		Name: "writer",
		NewModel: func(json.RawMessage) (engine.Model, error) {
			return simulator.NewScriptedModel(
				engine.Step{Kind: engine.StepToolCall, Tool: simulator.CardsWriteTool, Arguments: json.RawMessage(deck), Usage: &engine.Usage{}},
				engine.Step{Kind: engine.StepFinal, Final: json.RawMessage(`{"done":true}`), Usage: &engine.Usage{}},
			), nil
		},
		Tools: []engine.Tool{write},
	}
	e := &e2e{Bundle: lb, effects: effects}
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	e.approvals = approval.NewService(lb.Store, policy, func(n string) (contracts.ToolDescriptor, bool) { return e.engine.Tool(n) }, approval.Options{})
	e.engine, err = engine.New(engine.Config{Store: lb.Store, Approvals: e.approvals, Agents: []engine.Agent{writer}, Tools: []engine.Tool{write},
		Now: lb.Clock.Now, PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	return e
}

// approvedRun submits a run of writer, advances it to its approval and
// grants it: the next Advance calls the tool.
func (e *e2e) approvedRun(t *testing.T) (*ledger.Run, *ledger.Action) {
	t.Helper()
	ctx := context.Background()
	res, err := e.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k1", Principal: "alice", Agent: "writer",
		Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, e.engine.Advance(ctx, res.Run.ID))
	run, err := e.Store.FindRunByID(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.RunAwaitingApproval, run.State)
	actions, err := e.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
	require.NoError(t, err)
	require.Len(t, actions, 1)
	a := actions[0]
	_, err = e.approvals.Decide(ctx, approval.DecideParams{Tenant: "acme", Principal: "bob", ActionID: a.ID, ActionDigest: a.ActionDigest,
		Decision: ledger.DecisionGrant})
	require.NoError(t, err)
	return run, a
}

// settled advances the run and returns it with its one action and that
// action's attempts.
func (e *e2e) settled(t *testing.T, run ledger.RunID, a ledger.ActionID) (*ledger.Run, *ledger.Action, []*ledger.Attempt) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.engine.Advance(ctx, run))
	r, err := e.Store.FindRunByID(ctx, run)
	require.NoError(t, err)
	action, err := e.Store.FindActionByID(ctx, a)
	require.NoError(t, err)
	atts, err := e.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a})
	require.NoError(t, err)
	rep, err := e.Store.VerifyChain(ctx, run)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	return r, action, atts
}

// effectsOf counts the effects of a dedup key in the simulator's own
// store, never the ledger's.
func (e *e2e) effectsOf(t *testing.T, key string) int {
	t.Helper()
	n, err := e.effects.CountEffects(context.Background(), key)
	require.NoError(t, err)
	return n
}

func TestEngineRunsHTTPTool(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		e := newE2E(t, simulator.Config{}, nil)
		run, a := e.approvedRun(t)
		require.Equal(t, 0, e.effectsOf(t, a.DedupKey), "nothing runs before approval")

		r, action, atts := e.settled(t, run.ID, a.ID)
		require.Equal(t, ledger.RunCompleted, r.State)
		require.Equal(t, ledger.ActionSucceeded, action.State)
		require.Len(t, atts, 1)
		require.Equal(t, ledger.AttemptSucceeded, atts[0].Status)
		require.Equal(t, ledger.EffectHappened, atts[0].Effect)
		require.Contains(t, string(atts[0].Result), `"effect_seq"`)
		require.Equal(t, 1, e.effectsOf(t, a.DedupKey))

		calls, err := e.effects.Calls(context.Background())
		require.NoError(t, err)
		require.Len(t, calls, 1)
		require.Equal(t, a.DedupKey, calls[0].DedupKey)
		require.EqualValues(t, 1, calls[0].Attempt, "the attempt's number went over the wire")

		d, ok := e.engine.Tool(simulator.CardsWriteTool)
		require.True(t, ok)
		require.Equal(t, simulator.CardsWriteDescriptor().Version, d.Version)
		require.Len(t, e.engine.Tools(), 1)
	})

	// The tool acts, then its answer is lost (the connection drops): the
	// attempt is uncertain, recovery asks query_url, finds the effect and
	// reconciles. One effect, one call.
	t.Run("AnswerLostSettledByQuery", func(t *testing.T) {
		cfg := simulator.Config{
			Tools:     map[string]simulator.ToolConfig{simulator.CardsWriteTool: {Faults: []simulator.Fault{{Kind: simulator.FaultEffectThenCrash, Calls: []int{1}}}}},
			CrashFunc: func() { panic(http.ErrAbortHandler) }, // drop the connection, keep the process
		}
		e := newE2E(t, cfg, nil)
		run, a := e.approvedRun(t)
		r, action, atts := e.settled(t, run.ID, a.ID)
		e.requireReconciled(t, r, action, atts, httptool.CodeTransport)
	})

	// The same with a 500 written after the effect was recorded.
	t.Run("ServerErrorSettledByQuery", func(t *testing.T) {
		var first atomic.Bool
		e := newE2E(t, simulator.Config{}, func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == httpupstream.PathCardsWrite && first.CompareAndSwap(false, true) {
					next.ServeHTTP(httptest.NewRecorder(), r) // the tool acts; its answer goes nowhere
					http.Error(w, `{"status": "failed", "effect": "not_happened"}`, http.StatusInternalServerError)
					return
				}
				next.ServeHTTP(w, r)
			})
		})
		run, a := e.approvedRun(t)
		r, action, atts := e.settled(t, run.ID, a.ID)
		e.requireReconciled(t, r, action, atts, httptool.CodeStatus)
	})

	// The tool refuses before acting, and says so: the action failed,
	// nothing to recover.
	t.Run("RefusedNotHappened", func(t *testing.T) {
		cfg := simulator.Config{Tools: map[string]simulator.ToolConfig{simulator.CardsWriteTool: {
			Faults: []simulator.Fault{{Kind: simulator.FaultError, Calls: []int{1}}}}}}
		e := newE2E(t, cfg, nil)
		run, a := e.approvedRun(t)
		r, action, atts := e.settled(t, run.ID, a.ID)
		require.Equal(t, ledger.RunFailed, r.State)
		require.Equal(t, ledger.StopToolError, r.StopReason)
		require.Equal(t, ledger.ActionFailed, action.State)
		require.Len(t, atts, 1)
		require.Equal(t, ledger.EffectNotHappened, atts[0].Effect)
		require.Equal(t, simulator.CodeSimulatedError, atts[0].Error.Code)
		require.Equal(t, 0, e.effectsOf(t, a.DedupKey))
	})
}

// requireReconciled checks a run whose one call's answer was lost (the
// attempt failed with code, effect unknown) and that recovery settled
// through the tool's query: one effect, one call, one query.
func (e *e2e) requireReconciled(t *testing.T, r *ledger.Run, action *ledger.Action, atts []*ledger.Attempt, code string) {
	t.Helper()
	ctx := context.Background()
	require.Equal(t, ledger.RunCompleted, r.State)
	require.Equal(t, ledger.ActionSucceeded, action.State, "reconciled")
	require.Len(t, atts, 1, "no second attempt")
	require.Equal(t, ledger.AttemptFailed, atts[0].Status)
	require.Equal(t, code, atts[0].Error.Code)
	require.Equal(t, ledger.EffectHappened, atts[0].Effect, "established by the query")

	obs, err := e.Store.FindObservations(ctx, ledger.ObservationFilter{AttemptID: &atts[0].ID})
	require.NoError(t, err)
	var queried bool
	for _, o := range obs {
		if o.Source == ledger.ObservedQuery && o.Effect == ledger.EffectHappened {
			queried = true
			require.Equal(t, atts[0].EffectObservation, o.ID)
		}
	}
	require.True(t, queried, "the effect came from query_url: %+v", obs)

	require.Equal(t, 1, e.effectsOf(t, action.DedupKey), "one effect in the tool's own store")
	calls, err := e.effects.Calls(ctx)
	require.NoError(t, err)
	require.Len(t, calls, 1, "the tool was called once")
	queries, err := e.effects.Queries(ctx)
	require.NoError(t, err)
	require.Len(t, queries, 1)
	require.Equal(t, simulator.QueryHappened, queries[0].Outcome)
}
