package engine_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

// fenceTool is a write tool that keeps what each call was given: the Call,
// its context's deadline, and the run's lease as the store held it then.
type fenceTool struct {
	desc  contracts.ToolDescriptor
	store ledger.Store

	mu    sync.Mutex
	calls []seenCall
}

type seenCall struct {
	call     engine.Call
	deadline time.Time
	lease    ledger.RunLease
	leaseErr error
}

func (t *fenceTool) Descriptor() contracts.ToolDescriptor { return t.desc }

func (t *fenceTool) Execute(ctx context.Context, c engine.Call) (engine.Result, error) {
	s := seenCall{call: c}
	s.deadline, _ = ctx.Deadline()
	s.lease, s.leaseErr = t.store.FindRunLease(ledger.WithoutRunLease(ctx), c.RunID)
	t.mu.Lock()
	t.calls = append(t.calls, s)
	t.mu.Unlock()
	return engine.Result{Output: json.RawMessage(`{"ok":true}`)}, nil
}

func (t *fenceTool) seen() []seenCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]seenCall(nil), t.calls...)
}

// TestCallCarriesTheFence: a call the pool makes carries the run's dedup
// key and the fencing token of the lease it is made under, and its
// deadline is set before the lease check: a pause between the check and
// the call (the fault point before_tool_call, where the replica cells
// freeze a process) does not push the deadline back. A call made outside
// the pool, under no lease, carries token 0.
func TestCallCarriesTheFence(t *testing.T) {
	ctx := context.Background()
	clock := ledgertest.NewClock()
	path := filepath.Join(t.TempDir(), "ledger.db")
	const timeout = 2 * time.Second
	tool := &fenceTool{desc: contracts.ToolDescriptor{SchemaVersion: "1.0", Name: "ext.write", Version: "1", Effect: contracts.EffectWrite,
		ArgumentsSchema: json.RawMessage(`{"type":"object"}`), TimeoutMS: timeout.Milliseconds()}}
	var (
		checkedMu sync.Mutex
		checked   []time.Time
	)
	lb, eng := leasedEngine(t, path, clock, tool, "a", func(c *engine.Config) {
		c.FaultFunc = func(p engine.FaultPoint) {
			if p != engine.FaultBeforeToolCall {
				return
			}
			checkedMu.Lock()
			checked = append(checked, time.Now())
			checkedMu.Unlock()
			// The pause modelled here, not a wait on anything: a process
			// stopped between its lease check and its call.
			time.Sleep(50 * time.Millisecond) // the pause is the fault: nothing to wait on
		}
	})
	tool.store = lb.Store

	t.Run("UnderTheLease", func(t *testing.T) {
		run := submitWriter(t, lb.Store, "pooled")
		eng.Start(ctx)
		defer eng.Stop()
		waitFor(t, "the run completes", func() bool {
			r, err := lb.Store.FindRunByID(ctx, run)
			return err == nil && r.State == ledger.RunCompleted
		})
		calls := tool.seen()
		require.Len(t, calls, 1)
		c := calls[0]
		actions, err := lb.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run})
		require.NoError(t, err)
		require.Len(t, actions, 1)
		require.Equal(t, actions[0].DedupKey, c.call.DedupKey)
		require.Equal(t, run, c.call.RunID)
		require.NoError(t, c.leaseErr)
		require.Positive(t, c.call.FencingToken)
		require.Equal(t, c.lease.Token, c.call.FencingToken, "the token of the lease the call is made under")

		checkedMu.Lock()
		require.Len(t, checked, 1)
		check := checked[0]
		checkedMu.Unlock()
		require.False(t, c.deadline.IsZero())
		require.LessOrEqual(t, c.deadline.Sub(check), timeout,
			"the deadline was set before the lease check, so the pause after it does not extend the call")
	})

	t.Run("NoLease", func(t *testing.T) {
		run := submitWriter(t, lb.Store, "advanced")
		require.NoError(t, eng.Advance(ctx, run))
		calls := tool.seen()
		require.Len(t, calls, 2)
		require.Equal(t, run, calls[1].call.RunID)
		require.Zero(t, calls[1].call.FencingToken, "a call under no lease cannot be fenced")
	})
}
