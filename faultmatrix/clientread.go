package faultmatrix

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// clientReadScenarios are the cells of a client read interrupted by a
// crash: the agent's one call is a read of a tool with no guarantees. A
// read has no effect to doubt, so recovery continues it within its budget
// (/next says execute or resend), the agent runs it again and finishes:
// the run completes with two attempts and no effect, and no person is ever
// asked. One cell kills the agent after its read answered, before the
// complete, and starts it again; one kills the server while the attempt is
// open and restarts it once the lease has lapsed, the agent going on.
func clientReadScenarios() []*Scenario {
	none := contracts.Guarantees{}
	agentAt, serverAt := engine.FaultAfterToolCall, engine.FaultAfterAttemptRecorded
	return []*Scenario{
		{Name: fmt.Sprintf("client-read/agent/%s/%s", agentAt, comboName(none)), Guarantees: none,
			Fault:  fmt.Sprintf("the Python agent SIGKILLs itself at %s of a read, then resumes", agentAt),
			Expect: completed(0, 2), python: true, read: true, drive: neverReviewed(driveClientCrash(agentAt))},
		{Name: fmt.Sprintf("client-read/server-kill/%s/%s", serverAt, comboName(none)), Guarantees: none,
			Fault:  fmt.Sprintf("the server is SIGKILLed while the agent is at %s of a read, restarted on the same port", serverAt),
			Expect: completed(0, 2), python: true, read: true, drive: neverReviewed(driveServerKill(serverAt))},
	}
}

// neverReviewed wraps a drive: once it is done, no action of the run may
// ever have been in review, and recovery may never have decided review.
func neverReviewed(drive func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error)) func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	return func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
		id, err := drive(ctx, h, sc)
		if err != nil || id == "" {
			return id, err
		}
		tl, err := h.timeline(id)
		if err != nil {
			return id, err
		}
		for _, e := range tl.Events {
			var d struct{ Decision, Rationale string }
			switch {
			case e.Type == "recovery.decision" && json.Unmarshal(e.Data, &d) == nil && d.Decision == string(recovery.Review):
				return id, fmt.Errorf("recovery handed the read to a person (event %d): %s", e.Seq, d.Rationale)
			case e.ToState == string(ledger.ActionNeedsReview):
				return id, fmt.Errorf("%s %s went to needs_review (event %d)", e.EntityType, e.EntityID, e.Seq)
			}
		}
		return id, nil
	}
}
