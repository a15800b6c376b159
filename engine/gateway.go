package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// The front end of callers attached to this process (DriverGateway: the
// MCP gateway). A caller's tool call is proposed on the one propose path
// (ProposeCall); while a person decides, the caller waits, which is its
// front end's business; the engine makes the call while the caller is
// attached, under the run's lease (RunCall), through call.go as for a
// built-in agent; and the front end records that the outcome reached the
// caller (Delivered). A call repeated after a crash, with no step key of
// its own, joins the action whose outcome never reached the caller instead
// of making the call again (ProposeCall).

// OpenRunParams names the run of a caller of a gateway agent.
type OpenRunParams struct {
	Agent     string
	Tenant    string
	Principal string
	// Key names the caller's run across processes (1–200 printable ASCII
	// characters): while the run of Key lives, every call of Key is an
	// action of it; once it has ended, the next call opens the next run.
	Key string
	// Input is the runs' input: the same for every run of Key.
	Input json.RawMessage
}

// OpenRun returns the live run of p.Key, submitting it (running: a front
// end takes its steps) if there is none, or the next one if the last has
// ended.
func (e *Engine) OpenRun(ctx context.Context, p OpenRunParams) (*ledger.Run, error) {
	agent, ok := e.agents[p.Agent]
	if !ok || agent.Driver != DriverGateway {
		return nil, fmt.Errorf("engine: open run: %q is no gateway agent", p.Agent)
	}
	if len(agent.Tenants) > 0 && !slices.Contains(agent.Tenants, p.Tenant) {
		return nil, ledger.Errorf(ledger.CodeForbidden, "tenant %s may not use agent %s", p.Tenant, p.Agent)
	}
	if len(p.Key) > 200 || !ledger.ValidIdempotencyKey(p.Key) {
		return nil, ledger.Errorf(ledger.CodeInvalid, "a run key must be 1–200 printable ASCII characters")
	}
	e.callsMu.Lock()
	known := e.runGens[p.Key]
	e.callsMu.Unlock()
	if known.run != "" {
		// The key's run as this process last opened it: a read, while it
		// lives, instead of a submit.
		if run, err := e.store.FindRunByID(ctx, known.run); err == nil && !run.State.Terminal() {
			return run, nil
		}
	}
	gen := max(known.gen, 1)
	for range maxRunGenerationsRead {
		key := p.Key
		if gen > 1 {
			key = fmt.Sprintf("%s#%d", p.Key, gen)
		}
		res, err := e.store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: p.Tenant, IdempotencyKey: key, Principal: p.Principal,
			Agent: p.Agent, Input: p.Input, Start: true})
		if err != nil {
			return nil, fmt.Errorf("open run %s: %w", key, err)
		}
		if !res.Run.State.Terminal() {
			e.callsMu.Lock()
			e.runGens[p.Key] = runGen{gen: gen, run: res.Run.ID}
			e.callsMu.Unlock()
			return res.Run, nil
		}
		gen++
	}
	return nil, fmt.Errorf("open run %s: %d ended runs read in a row", p.Key, maxRunGenerationsRead)
}

// runGen is the generation of a gateway run key last opened, and its run.
type runGen struct {
	gen int
	run ledger.RunID
}

// maxRunGenerationsRead bounds the ended runs of one key OpenRun reads
// past at once (a process that starts reads from the first).
const maxRunGenerationsRead = 10000

// GatewayRun reads a run the caller may make calls in: of a gateway agent,
// its tenant's, submitted by its principal. Any other is not found, so a
// run's id tells another caller nothing.
func (e *Engine) GatewayRun(ctx context.Context, c Caller, id ledger.RunID) (*ledger.Run, error) {
	run, _, err := e.gatewayRun(ctx, c, id)
	return run, err
}

func (e *Engine) gatewayRun(ctx context.Context, c Caller, id ledger.RunID) (*ledger.Run, *registeredAgent, error) {
	run, err := e.store.FindRunByID(ctx, id)
	if ledger.Code(err) == ledger.CodeNotFound {
		return nil, nil, ledger.Errorf(ledger.CodeNotFound, "run %s not found", id)
	}
	if err != nil {
		return nil, nil, err
	}
	agent, ok := e.agents[run.Agent]
	if !ok || agent.Driver != DriverGateway || run.Tenant != c.Tenant || run.SubmittedBy != c.Principal {
		return nil, nil, ledger.Errorf(ledger.CodeNotFound, "run %s not found", id)
	}
	return run, agent, nil
}

// GatewayAction reads an action of a run the caller may make calls in;
// any other is not found.
func (e *Engine) GatewayAction(ctx context.Context, c Caller, id ledger.ActionID) (*ledger.Action, error) {
	a, err := e.store.FindActionByID(ctx, id)
	if err == nil {
		_, _, err = e.gatewayRun(ctx, c, a.RunID)
	}
	if ledger.Code(err) == ledger.CodeNotFound {
		return nil, ledger.Errorf(ledger.CodeNotFound, "action %s not found", id)
	}
	return a, err
}

// CallProposal is one tool call of a caller attached to a gateway.
type CallProposal struct {
	Caller Caller
	Run    ledger.RunID
	// StepKey is the caller's own idempotency key for the call (1–250
	// printable ASCII characters), or "":
	// then the call joins the run's last action of the same tool and
	// arguments while that action is not terminal, or while an outcome of
	// it never reached the caller (Delivered), and is a new action
	// otherwise.
	StepKey   string
	Tool      string
	Arguments json.RawMessage
	// MaxPendingApprovals is as ProposeParams'.
	MaxPendingApprovals int
}

// ProposeCall records a caller's call through the one propose path: the
// action (Duplicate when the call joined one), with the approval it waits
// for. Refusals are *ProtocolError or ledger errors, as Propose's.
func (e *Engine) ProposeCall(ctx context.Context, p CallProposal) (ledger.CreateActionResult, error) {
	run, agent, err := e.gatewayRun(ctx, p.Caller, p.Run)
	if err != nil {
		return ledger.CreateActionResult{}, err
	}
	actions, err := e.store.FindActions(ctx, ledger.ActionFilter{RunID: &run.ID})
	if err != nil {
		return ledger.CreateActionResult{}, err
	}
	key := p.StepKey
	if key == "" {
		canon, err := ledger.Canonicalize(p.Arguments)
		if err != nil {
			return ledger.CreateActionResult{}, ledger.Errorf(ledger.CodeInvalid, "arguments: %v", err)
		}
		var join *ledger.Action
		if key, join, err = e.callKey(ctx, actions, p.Tool, canon); err != nil {
			return ledger.CreateActionResult{}, err
		}
		if join != nil {
			res, err, _ := e.replayProposal(ctx, []*ledger.Action{join}, proposal{stepKey: join.IdempotencyKey, tool: p.Tool,
				arguments: canon, supersedes: join.Supersedes})
			return res, err
		}
	} else if len(key) > 250 || !ledger.ValidIdempotencyKey(key) {
		return ledger.CreateActionResult{}, ledger.Errorf(ledger.CodeInvalid, "the idempotency key must be 1–250 printable ASCII characters")
	} else {
		key = "key:" + key
	}
	res, _, err := e.propose(ctx, proposal{run: run, agent: agent, actions: actions, stepKey: key, tool: p.Tool, arguments: p.Arguments,
		usage: ledger.AddUsageParams{RunID: run.ID, Steps: 1, TokensUnavailable: true}, actor: p.Caller.Principal,
		maxPendingApprovals: p.MaxPendingApprovals})
	return res, err
}

// callKey is the step key of a call that brought none: the action it
// joins (the run's last of that tool and canonical arguments, while it is
// not terminal or an outcome of it never reached the caller), or the key
// of a new action, numbered by the calls of the same tool and arguments
// before it, so that the same call made twice at once is one action.
func (e *Engine) callKey(ctx context.Context, actions []*ledger.Action, tool string, canon json.RawMessage) (string, *ledger.Action, error) {
	digest := ledger.DigestCanonical(canon)
	n := 0
	var last *ledger.Action
	for _, a := range actions {
		if a.Tool == tool && string(a.Arguments) == string(canon) {
			n++
			if a.State != ledger.ActionSuperseded {
				last = a
			}
		}
	}
	if last != nil {
		join, err := e.undelivered(ctx, last)
		if err != nil {
			return "", nil, err
		}
		if join {
			return "", last, nil
		}
	}
	return fmt.Sprintf("call:%s:%s:%d", tool, digest, n+1), nil, nil
}

// undelivered reports whether a caller's repeated call should join a: it
// is not terminal, or it is a write that had an attempt whose outcome
// never reached the caller. A terminal action without attempts (denied,
// expired) is not joined: the repeated call asks again; nor is a read.
func (e *Engine) undelivered(ctx context.Context, a *ledger.Action) (bool, error) {
	if !a.State.Terminal() {
		return true, nil
	}
	if a.AttemptCount == 0 || a.Effect == ledger.EffectRead {
		// A read that ended is read again: it took no effect to protect,
		// and its delivery is not recorded.
		return false, nil
	}
	obs, err := e.store.FindObservations(ctx, ledger.ObservationFilter{ActionID: &a.ID})
	if err != nil {
		return false, err
	}
	return !slices.ContainsFunc(obs, func(o *ledger.Observation) bool { return o.Source == ledger.ObservedDelivered }), nil
}

// RunCall carries an action of a caller's run as far as the engine can
// while the caller is attached: under the run's lease, an approved action
// gets its attempt (the tool called with its dedup key and the lease's
// fencing token, the outcome recorded through the outcome table), and a
// running or uncertain one, which a process that crashed left, its
// recovery. It answers the action as it stands then: succeeded or failed
// with its last attempt's outcome, or still waiting (for a person, for its
// recovery), or ended with its run. It waits at most wait for the run's
// lease while another call of the run holds it.
func (e *Engine) RunCall(ctx context.Context, c Caller, id ledger.ActionID, wait time.Duration) (*ledger.Action, error) {
	a, err := e.GatewayAction(ctx, c, id)
	if err != nil {
		return nil, err
	}
	stop := e.leases.keep(ctx)
	defer stop()
	ttl := time.Duration(0)
	if tool, ok := e.gatewayTool(a.Tool); ok {
		// Long enough for the call and its margin: no renewal before it.
		ttl = e.callTimeout(tool) + 2*e.leases.margin()
	}
	wctx, release, err := e.holdRun(ctx, a.RunID, wait, ttl)
	if err != nil {
		return nil, err
	}
	defer release()
	var v runView
	for range 4 {
		run, err := e.store.FindRunByID(wctx, a.RunID)
		if err != nil {
			return nil, err
		}
		if a, err = e.store.FindActionByID(wctx, id); err != nil {
			return nil, err
		}
		agent := e.agents[run.Agent]
		if run.State != ledger.RunRunning {
			return a, nil // ended, stopping or in review: no attempt begins
		}
		var more bool
		switch a.State {
		case ledger.ActionApproved:
			v.at(run)
			more, err = e.attempt(wctx, run, agent, a, &v)
		case ledger.ActionRunning, ledger.ActionUncertain:
			more, err = e.recover(wctx, run, a)
		default:
			return a, nil
		}
		if err != nil {
			return nil, err
		}
		if !more {
			break
		}
	}
	return e.store.FindActionByID(ctx, id)
}

// gatewayTool is a gateway agent's tool of that name.
func (e *Engine) gatewayTool(name string) (registeredTool, bool) {
	for _, a := range e.agents {
		if t, ok := a.tools[name]; ok && a.Driver == DriverGateway {
			return t, true
		}
	}
	return registeredTool{}, false
}

// holdRun claims run's lease for a caller's call (for ttl, at least the
// engine's), waiting up to wait while another holds it, and answers the
// context to work under and the release. The lease is claimed and worked
// under one lock: no pool pass can take it as idle in between.
func (e *Engine) holdRun(ctx context.Context, run ledger.RunID, wait, ttl time.Duration) (context.Context, func(), error) {
	var live []ledger.RunState
	for _, st := range ledger.RunStates() {
		if !st.Terminal() {
			live = append(live, st)
		}
	}
	deadline := e.now().Add(wait)
	pause := 10 * time.Millisecond
	for {
		wctx, end, ok, err := e.leases.claimWork(ctx, run, live, ttl)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			return wctx, func() {
				end()
				e.leases.release(ctx, run)
			}, nil
		}
		if !e.now().Before(deadline) {
			return nil, nil, ledger.Errorf(ledger.CodeConflict, "run %s is busy: another call of it, or its recovery, holds it", run)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// LastAttempt is the last attempt of an action, nil if it has none.
func (e *Engine) LastAttempt(ctx context.Context, id ledger.ActionID) (*ledger.Attempt, error) {
	atts, err := e.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &id})
	if err != nil || len(atts) == 0 {
		return nil, err
	}
	return atts[len(atts)-1], nil
}

// Delivered records that the outcome of attempt reached the caller the
// engine made the call for (ledger.ObservedDelivered), with detail saying
// how; a call repeated after this is a new action.
func (e *Engine) Delivered(ctx context.Context, attempt ledger.AttemptID, detail json.RawMessage) error {
	_, _, err := e.store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: attempt, Source: ledger.ObservedDelivered,
		Effect: ledger.EffectUnknown, Detail: detail, Actor: "engine"})
	if err != nil {
		return fmt.Errorf("record delivery of %s: %w", attempt, err)
	}
	return nil
}
