package server

import (
	"context"
	"fmt"

	"github.com/actionledger/ledger/ledger"
)

// The conversions from ledger facts to wire types. Arguments pass through
// the Redactor on their way out; nothing else of an action is secret.

func runSummary(r *ledger.Run) RunSummary {
	return RunSummary{ID: r.ID, Tenant: r.Tenant, Agent: r.Agent, State: r.State, StopReason: r.StopReason,
		SubmittedBy: r.SubmittedBy, CreatedAt: r.CreatedAt}
}

func submitResponse(r *ledger.Run, clientDriven bool) SubmitResponse {
	// The state at acceptance, whatever the run is in now: a replay
	// answers byte for byte as the first request did. A client-driven
	// run is accepted running.
	state := ledger.RunQueued
	if clientDriven {
		state = ledger.RunRunning
	}
	return SubmitResponse{
		ID: r.ID, Tenant: r.Tenant, Agent: r.Agent,
		State:         state,
		RequestDigest: r.RequestDigest,
		CreatedAt:     r.CreatedAt,
		Links:         map[string]string{"self": runPath(r.ID)},
	}
}

func runPath(id ledger.RunID) string { return "/v1/runs/" + string(id) }

func approvalView(a *ledger.Approval) Approval {
	return Approval{ID: a.ID, ActionID: a.ActionID, RunID: a.RunID, ActionDigest: a.ActionDigest, State: a.State,
		DecidedBy: a.DecidedBy, Reason: a.Reason, RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt, DecidedAt: a.DecidedAt,
		ExecuteBy: a.ExecuteBy, StaleAt: a.StaleAt, StaleReason: a.StaleReason}
}

func attemptView(a *ledger.Attempt) Attempt {
	return Attempt{ID: a.ID, No: a.No, Status: a.Status, Effect: a.Effect, EffectObservation: a.EffectObservation,
		Error: a.Error, StartedAt: a.StartedAt, FinishedAt: a.FinishedAt}
}

func cancellationView(c *ledger.Cancellation) *Cancellation {
	if c == nil {
		return nil
	}
	return &Cancellation{ID: c.ID, State: c.State, RequestedBy: c.RequestedBy, Reason: c.Reason, RequestedAt: c.RequestedAt,
		AcceptedAt: c.AcceptedAt, StoppingAt: c.StoppingAt, StoppedAt: c.StoppedAt, TooLateAt: c.TooLateAt}
}

// gateView is the action's gate on the wire; nil for none.
func gateView(g *ledger.ActionGate) *ActionGate {
	if g == nil {
		return nil
	}
	v := &ActionGate{Decision: g.Decision, Reason: g.Reason, RulesDigest: g.RulesDigest}
	if g.Rule >= 0 {
		rule := g.Rule
		v.Rule = &rule
	}
	return v
}

// actionView builds an action with its redacted arguments and the given
// attempts and approvals (nil becomes an empty list).
func (s *Server) actionView(a *ledger.Action, atts []*ledger.Attempt, aprs []*ledger.Approval) (Action, error) {
	args, err := s.redactor.RedactArguments(a.Tool, a.Arguments)
	if err != nil {
		return Action{}, fmt.Errorf("redact action %s: %w", a.ID, err)
	}
	v := Action{ID: a.ID, RunID: a.RunID, Seq: a.Seq, Tool: a.Tool, ToolVersion: a.ToolVersion, Effect: a.Effect,
		State: a.State, Version: a.Version, ActionDigest: a.ActionDigest, Arguments: args, DedupKey: a.DedupKey, Supersedes: a.Supersedes,
		CreatedAt: a.CreatedAt, Attempts: []Attempt{}, Approvals: []Approval{}, Gate: gateView(a.Gate)}
	for _, t := range atts {
		v.Attempts = append(v.Attempts, attemptView(t))
	}
	for _, p := range aprs {
		v.Approvals = append(v.Approvals, approvalView(p))
	}
	return v, nil
}

// loadAction builds one action with its attempts and approvals.
func (s *Server) loadAction(ctx context.Context, a *ledger.Action) (Action, error) {
	atts, err := s.store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
	if err != nil {
		return Action{}, fmt.Errorf("attempts of %s: %w", a.ID, err)
	}
	aprs, err := s.store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &a.ID})
	if err != nil {
		return Action{}, fmt.Errorf("approvals of %s: %w", a.ID, err)
	}
	return s.actionView(a, atts, aprs)
}

// loadRunView builds a run with its actions, their attempts and
// approvals, and its cancellation: four queries, whatever the size.
func (s *Server) loadRunView(ctx context.Context, r *ledger.Run) (Run, error) {
	actions, err := s.store.FindActions(ctx, ledger.ActionFilter{RunID: &r.ID})
	if err != nil {
		return Run{}, fmt.Errorf("actions of %s: %w", r.ID, err)
	}
	atts, err := s.store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &r.ID})
	if err != nil {
		return Run{}, fmt.Errorf("attempts of %s: %w", r.ID, err)
	}
	aprs, err := s.store.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &r.ID})
	if err != nil {
		return Run{}, fmt.Errorf("approvals of %s: %w", r.ID, err)
	}
	cancel, err := s.store.FindCancellation(ctx, r.ID)
	switch {
	case ledger.Code(err) == ledger.CodeNotFound:
		cancel = nil
	case err != nil:
		return Run{}, fmt.Errorf("cancellation of %s: %w", r.ID, err)
	}
	attsBy := map[ledger.ActionID][]*ledger.Attempt{}
	for _, t := range atts {
		attsBy[t.ActionID] = append(attsBy[t.ActionID], t)
	}
	aprsBy := map[ledger.ActionID][]*ledger.Approval{}
	for _, p := range aprs {
		aprsBy[p.ActionID] = append(aprsBy[p.ActionID], p)
	}
	v := Run{ID: r.ID, Tenant: r.Tenant, Agent: r.Agent, State: r.State, StopReason: r.StopReason,
		SubmittedBy: r.SubmittedBy, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Budget: budgetView(r.Budget),
		Cancellation: cancellationView(cancel), Actions: make([]Action, 0, len(actions))}
	for _, a := range actions {
		av, err := s.actionView(a, attsBy[a.ID], aprsBy[a.ID])
		if err != nil {
			return Run{}, err
		}
		v.Actions = append(v.Actions, av)
	}
	return v, nil
}
