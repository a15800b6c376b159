package engine

import (
	"context"
	"sync"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// The agent protocol's sweeps: lapsed leases and unanswered decisions
// handed to recovery, a page at a time.

// sweepLeases applies the recovery table to attempts whose lease lapsed,
// so that an agent that never comes back leaves its unknown effects in
// review, not open; then to the decisions told to agents that have gone
// unanswered past their tool's decision timeout (sweepDecisions). It runs
// with the pool's passes. A lapsed attempt whose agent was told a decision
// since is not listed again (the store leaves it out): it waits for its
// answer or its timeout, and a backlog of such attempts never keeps the
// sweep from the others.
func (e *Engine) sweepLeases(ctx context.Context) error {
	lapsed, err := e.store.FindLapsedLeases(ctx, e.now(), sweepPage)
	if err != nil {
		return err
	}
	for _, l := range lapsed {
		if _, err := e.recoverClient(ctx, l.RunID, l.ActionID); err != nil && ledger.Code(err) != ledger.CodeConflict {
			return err
		}
	}
	return e.sweepDecisions(ctx)
}

// sweepPage is how many lapsed leases, or told decisions, one pass of the
// sweep reads.
const sweepPage = 100

// sweepCursor is where the next pass over told decisions starts.
type sweepCursor struct {
	mu    sync.Mutex
	after *ledger.AgentDecision
}

// sweepDecisions hands to a person each action whose agent was told a
// decision (query, cancel, resend) and has not acted on it within its
// tool's decision timeout. Each pass reads one page of the decisions told
// longer ago than the shortest timeout, from where the last pass stopped,
// and starts again from the oldest once it reaches the end, so that
// decisions not due yet (a tool with a longer timeout) never keep the
// sweep from the rest.
func (e *Engine) sweepDecisions(ctx context.Context) error {
	if e.minDecisionTimeout <= 0 {
		return nil // no client tool
	}
	c := &e.decisionSweep
	c.mu.Lock()
	defer c.mu.Unlock()
	now := e.now()
	told, err := e.store.FindAgentDecisions(ctx, ledger.AgentDecisionFilter{DecidedBefore: now.Add(-e.minDecisionTimeout),
		After: c.after, Limit: sweepPage})
	if err != nil {
		return err
	}
	if len(told) < sweepPage {
		c.after = nil
	} else {
		c.after = told[len(told)-1]
	}
	for _, d := range told {
		if err := e.escalateUnanswered(ctx, d, now); err != nil && ledger.Code(err) != ledger.CodeConflict && ledger.Code(err) != ledger.CodeNotFound {
			return err
		}
	}
	return nil
}

// escalateUnanswered lets recovery decide again about an action whose
// agent has left the decision d unanswered past its tool's timeout; the
// table then hands it to a person if d is still the decision its facts
// call for. An action whose attempt holds a live lease is in flight, not
// waiting for an answer.
func (e *Engine) escalateUnanswered(ctx context.Context, d *ledger.AgentDecision, now time.Time) error {
	a, err := e.store.FindActionByID(ctx, d.ActionID)
	if err != nil {
		return err
	}
	probe, ok := e.probe(a.Tool, a.ToolVersion)
	if !ok || !probe.Client || !recovery.Overdue(*d, probe.Tool, now) {
		return nil
	}
	switch a.State {
	case ledger.ActionRunning:
		if live, err := e.leaseLive(ctx, a.ID); err != nil || live {
			return err
		}
	case ledger.ActionApproved:
		// Only a resend still due: anything else of an approved action is
		// no question to the agent.
		atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
		if err != nil || len(atts) == 0 {
			return err
		}
		if recovery.ResendDecisionID(recovery.Facts{Action: a, Attempt: atts[len(atts)-1]}) != d.DecisionID {
			return nil
		}
	case ledger.ActionUncertain:
	default:
		return nil
	}
	run, err := e.store.FindRunByID(ctx, a.RunID)
	if err != nil || run.State.Terminal() {
		return err
	}
	if _, err := e.recoverer.Recover(ctx, run, a); err != nil {
		return err
	}
	e.Notify()
	return nil
}
