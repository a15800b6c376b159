package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// The recovery scan at start-up and on `ledger recover`, under each run's
// lease.

// Recover runs the recovery scan: every approved, running or uncertain
// action of a live run whose lease this process can claim gets its
// decision, recorded with its rationale, and acted on; a run another
// process holds is that process's to recover (ScanReport.Held). Call it at
// start-up, before Start.
func (e *Engine) Recover(ctx context.Context) (recovery.ScanReport, error) {
	stop := e.leases.keep(ctx)
	defer stop()
	return e.recoverer.Scan(ctx)
}

// scanLease claims the runs of a page of the recovery scan and returns the
// context to recover each one it got with, under its lease.
func (e *Engine) scanLease(ctx context.Context, runs []ledger.RunID) (map[ledger.RunID]context.Context, error) {
	var live []ledger.RunState
	for _, st := range ledger.RunStates() {
		if !st.Terminal() {
			live = append(live, st)
		}
	}
	// Long enough for a probe without extending the lease first.
	ttl := probeTimeout + 2*e.leases.margin()
	got, err := e.leases.claim(ctx, ledger.ClaimRunsParams{Limit: len(runs), States: live, Runs: runs, TTL: ttl})
	if err != nil {
		return nil, err
	}
	out := make(map[ledger.RunID]context.Context, len(got))
	for _, l := range got {
		if wctx, _, ok := e.leases.work(ctx, l.Run); ok {
			out[l.Run] = wctx // its work ends with the release (scanDone)
		}
	}
	return out, nil
}

// probeTimeout bounds each query or cancel recovery makes of a tool.
const probeTimeout = 10 * time.Second

// scanDone releases a run the recovery scan recovered.
func (e *Engine) scanDone(ctx context.Context, run ledger.RunID) { e.leases.release(ctx, run) }

// probeGuard lets recovery query or cancel a tool only while the lease of
// the run it recovers outlasts the probe by the margin.
func (e *Engine) probeGuard(ctx context.Context, timeout time.Duration) error {
	ok, err := e.leases.outlasts(ctx, timeout+e.leases.margin())
	if err == nil && !ok {
		err = fmt.Errorf("%w: the run's lease cannot be made to outlast the probe", ledger.ErrLeaseLost)
	}
	return err
}
