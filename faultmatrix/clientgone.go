package faultmatrix

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// goneSettle bounds how long after a client agent's death its action may
// take to reach review: its lease, the decision nobody answers, and slack
// for the pool's passes. An action still unsettled then is stuck.
const goneSettle = clientLease + clientDecisionTimeout + 5*time.Second

// clientGoneScenarios are the cells of an agent that never comes back:
// the Python agent SIGKILLs itself mid-attempt and is never started again.
// Whatever recovery tells it (query, resend, cancel) nobody answers, so
// within goneSettle every such action must be in review, never left
// running, uncertain or approved; a person then settles it with what the
// agent's effect store proves, and the run goes on. One cell per decision
// recovery can tell a client (query, resend, cancel) and one for a tool
// with no guarantee, the two points alternating; and one whose server is
// also SIGKILLed once the query was told, and restarted with no agent.
func clientGoneScenarios() []*Scenario {
	var out []*Scenario
	for _, c := range []struct {
		point engine.FaultPoint
		g     contracts.Guarantees
	}{
		{engine.FaultAfterAttemptRecorded, contracts.Guarantees{Query: true}},  // query, unanswered
		{engine.FaultAfterToolCall, contracts.Guarantees{Dedup: true}},         // resend, never begun
		{engine.FaultAfterAttemptRecorded, contracts.Guarantees{Cancel: true}}, // cancel, unanswered
		{engine.FaultAfterToolCall, contracts.Guarantees{}},                    // review once the lease lapses
	} {
		out = append(out, &Scenario{Name: fmt.Sprintf("client-gone/agent/%s/%s", c.point, comboName(c.g)), Guarantees: c.g,
			Fault:  fmt.Sprintf("the Python agent SIGKILLs itself at %s and never comes back", c.point),
			Expect: goneExpectation(c.point), python: true, drive: driveClientGone(c.point, false)})
	}
	p := engine.FaultAfterToolCall
	return append(out, &Scenario{Name: fmt.Sprintf("client-gone/server-kill/%s/%s", p, comboName(allOn)), Guarantees: allOn,
		Fault: fmt.Sprintf("the Python agent SIGKILLs itself at %s and never comes back; the server is SIGKILLed once "+
			"recovery told the query, and restarted", p),
		Expect: goneExpectation(p), python: true, drive: driveClientGone(p, true)})
}

// goneExpectation is where a client-gone cell ends: after the person's
// verdict the runner finishes the run as its agent would, completed if
// the write took effect (after the tool call), failed with tool_error if
// it did not (the agent died before its tool acted). One attempt either
// way: nobody began another.
func goneExpectation(p engine.FaultPoint) Expectation {
	if p == engine.FaultAfterToolCall {
		return completed(1, 1)
	}
	return Expectation{State: ledger.RunFailed, StopReason: ledger.StopToolError, Attempts: 1}
}

// driveClientGone: the agent SIGKILLs itself at the point and is never
// started again (with serverKill, the server is SIGKILLed too once recovery
// recorded the query it tells the agent, and started again). Nobody calls
// /next: the server alone must bring the action to review within
// goneSettle. A person then resolves it with the outcome the agent's
// effect store proves, the run must leave review with nothing left to
// settle (/next says propose), and the runner finishes it as the agent
// would have.
func driveClientGone(p engine.FaultPoint, serverKill bool) func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	return func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
		cs, err := setupClient(h, clientDecisionTimeout)
		if err != nil {
			return "", err
		}
		if err := h.start(ctx); err != nil {
			return "", err
		}
		agent, err := startAgent(ctx, h, cs, sc, 1, "--fault-at", string(p))
		if err != nil {
			return "", err
		}
		err = agent.wait(wait, true)
		id := agent.runID()
		switch {
		case err != nil:
			return id, err
		case id == "":
			return "", fmt.Errorf("the agent died before it said its run: %s", agent.tail())
		}
		died := time.Now()
		if serverKill {
			if err := awaitDecision(h, id, "query", goneSettle); err != nil {
				return id, fmt.Errorf("%w; %s", err, stuckAt(h, cs, id))
			}
			if err := h.kill(); err != nil {
				return id, err
			}
			if err := h.start(ctx); err != nil {
				return id, err
			}
		}
		r, err := h.waitRun(id, goneSettle, func(r server.Run) bool { return r.State == ledger.RunNeedsReview })
		if err != nil {
			return id, fmt.Errorf("the agent died %s ago and the run is not in review: %w; %s",
				time.Since(died).Round(time.Millisecond), err, stuckAt(h, cs, id))
		}
		h.settle = time.Since(died)
		if len(r.Actions) != 1 || r.Actions[0].State != ledger.ActionNeedsReview {
			return id, fmt.Errorf("the run is in review, its actions are not the one write in review: %s", actionStates(r))
		}
		a := r.Actions[0]
		effects, err := h.effects(ctx)
		if err != nil {
			return id, err
		}
		made := 0
		for _, e := range effects {
			if e.DedupKey == a.DedupKey {
				made++
			}
		}
		outcome, finish := "not_happened", server.FinishRequest{Outcome: "failed", StopReason: ledger.StopToolError}
		if made > 0 {
			outcome, finish = "happened", server.FinishRequest{Outcome: "completed"}
		}
		code, err := h.doAs(cs.approverToken, http.MethodPost, "/v1/actions/"+string(a.ID)+"/resolve", nil,
			server.ResolveRequest{Outcome: outcome, Note: "the agent's own effect store says so"}, nil)
		if err != nil || code != http.StatusOK {
			return id, fmt.Errorf("resolve %s as %s answered %d: %v", a.ID, outcome, code, err)
		}
		if r, err = h.run(id); err != nil {
			return id, err
		}
		if r.State != ledger.RunRunning {
			return id, fmt.Errorf("after the verdict %s the run is %s, not running: %s", outcome, r.State, actionStates(r))
		}
		var next server.NextResponse
		if _, err := h.doAs(cs.agentToken, http.MethodGet, "/v1/runs/"+string(id)+"/next", nil, nil, &next); err != nil {
			return id, err
		}
		if len(next.Directives) != 1 || next.Directives[0].Directive != "propose" {
			return id, fmt.Errorf("after the verdict /next says %s, not propose", directives(next))
		}
		if _, err := h.doAs(cs.agentToken, http.MethodPost, "/v1/runs/"+string(id)+"/finish", nil, finish, nil); err != nil {
			return id, err
		}
		return id, nil
	}
}

// awaitDecision waits until recovery recorded a decision of this kind
// about one of the run's actions.
func awaitDecision(h *harness, id ledger.RunID, kind string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		tl, err := h.timeline(id)
		if err == nil {
			for _, e := range tl.Events {
				var d struct{ Decision string }
				if e.Type == "recovery.decision" && json.Unmarshal(e.Data, &d) == nil && d.Decision == kind {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("recovery recorded no %s decision about run %s within %s", kind, id, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stuckAt says where a run that did not settle stands: its state, each
// action's with its attempts, and what /next (asked as the agent, once the
// wait is over) would tell an agent that came back.
func stuckAt(h *harness, cs clientSetup, id ledger.RunID) string {
	r, err := h.run(id)
	if err != nil {
		return "read run: " + err.Error()
	}
	s := "run " + string(r.State) + ", " + actionStates(r)
	var next server.NextResponse
	if _, err := h.doAs(cs.agentToken, http.MethodGet, "/v1/runs/"+string(id)+"/next", nil, nil, &next); err != nil {
		return s + "; /next: " + err.Error()
	}
	return s + "; /next says " + directives(next)
}

// actionStates lists a run's actions as "action ID STATE (attempts STATUS/EFFECT …)".
func actionStates(r server.Run) string {
	var parts []string
	for _, a := range r.Actions {
		var atts []string
		for _, at := range a.Attempts {
			atts = append(atts, string(at.Status)+"/"+string(at.Effect))
		}
		parts = append(parts, fmt.Sprintf("action %s %s (attempts %s)", a.ID, a.State, strings.Join(atts, " ")))
	}
	if len(parts) == 0 {
		return "no action"
	}
	return strings.Join(parts, ", ")
}

// directives lists what /next said: "kind (rationale)" each.
func directives(n server.NextResponse) string {
	var parts []string
	for _, d := range n.Directives {
		parts = append(parts, fmt.Sprintf("%s (%s)", d.Directive, d.Rationale))
	}
	return strings.Join(parts, ", ")
}
