package ledger

import (
	"context"
	"fmt"
)

// actionEdgeOwners names the method that owns an action edge: those edges
// need facts beyond a state change (an attempt row, an approval decision)
// and are refused by TransitionAction.
var actionEdgeOwners = map[[2]ActionState]string{
	{ActionApproved, ActionRunning}:          "StartAttempt",
	{ActionApproved, ActionAwaitingApproval}: "ReaskApproval",
	{ActionAwaitingApproval, ActionApproved}: "DecideApproval",
	{ActionAwaitingApproval, ActionDenied}:   "DecideApproval",
	{ActionAwaitingApproval, ActionExpired}:  "ExpireApprovals",
	{ActionRunning, ActionSucceeded}:         "FinishAttempt",
	{ActionRunning, ActionFailed}:            "FinishAttempt",
	{ActionRunning, ActionUncertain}:         "FinishAttempt",
	{ActionRunning, ActionNeedsReview}:       "FinishAttempt",
	{ActionRunning, ActionCancelled}:         "FinishAttempt",
}

// ActionEdgeOwner returns the Store method that owns the edge from → to, or
// "" if TransitionAction may take it.
func ActionEdgeOwner(from, to ActionState) string { return actionEdgeOwners[[2]ActionState{from, to}] }

// CreateAction implements Store.
func (s *DB) CreateAction(ctx context.Context, p CreateActionParams) (CreateActionResult, error) {
	if err := firstErr(checkText("idempotency key", p.IdempotencyKey, 255), checkText("tool", p.Tool, 128),
		checkText("tool version", p.ToolVersion, 64)); err != nil {
		return CreateActionResult{}, fmt.Errorf("create action: %w", err)
	}
	switch {
	case !p.Effect.Valid():
		return CreateActionResult{}, Errorf(CodeInvalid, "create action: effect must be read or write, not %q", p.Effect)
	case p.Gate != "" && p.Gate != ActionApproved && p.Gate != ActionAwaitingApproval && p.Gate != ActionDenied:
		return CreateActionResult{}, Errorf(CodeInvalid, "create action: gate must be approved, awaiting_approval or denied, not %q", p.Gate)
	case p.ApprovalTTL < 0:
		return CreateActionResult{}, Errorf(CodeInvalid, "create action: approval TTL cannot be negative")
	case p.StartAttempt && p.Gate != ActionApproved:
		return CreateActionResult{}, Errorf(CodeInvalid, "create action: an attempt starts only with gate approved")
	}
	if err := checkGateAudit(p.Gate, p.GateAudit); err != nil {
		return CreateActionResult{}, fmt.Errorf("create action: %w", err)
	}
	args, err := Canonicalize(p.Arguments)
	if err != nil {
		return CreateActionResult{}, fmt.Errorf("create action: arguments: %w", err)
	}
	if len(args) == 0 || args[0] != '{' {
		return CreateActionResult{}, Errorf(CodeInvalid, "create action: arguments must be a JSON object")
	}
	// Both digests are taken here, before the write and its lock: the
	// arguments are canonical now, and the action binds their tree digest
	// in each state the write records it in.
	digest := actionDigest(p.Tool, p.ToolVersion, p.Effect, args)
	argsDigest := docDigest(args)
	var out CreateActionResult
	err = s.inTx(ctx, "create_action", func(tx *txn) error {
		out = CreateActionResult{} // a driver may run the write again
		existing, err := tx.d.GetActionByKey(tx.ctx, p.RunID, p.IdempotencyKey)
		switch {
		case err == nil:
			if existing.ActionDigest != digest {
				return Errorf(CodeConflict, "action key %q of run %s was already used for another action", p.IdempotencyKey, p.RunID)
			}
			out = CreateActionResult{Action: existing, Duplicate: true}
			apr, err := tx.pendingApproval(existing.ID)
			switch {
			case err == nil:
				out.Approval = apr
			case Code(err) != CodeConflict: // conflict: none pending, which is fine
				return err
			}
			return nil
		case Code(err) != CodeNotFound:
			return err
		}
		run, err := tx.findRun(p.RunID)
		if err != nil {
			return err
		}
		if run.State != RunRunning {
			return Errorf(CodeConflict, "run %s is %s: actions are recorded only while it runs", p.RunID, run.State)
		}
		if p.Gate == ActionAwaitingApproval && p.MaxPendingApprovals > 0 {
			// A live run holds a place under the cap for the approval it
			// may ask for: its first pending one takes that place, any
			// more count against the cap like new runs.
			mine, err := tx.d.CountPendingApprovals(tx.ctx, p.RunID)
			if err != nil {
				return err
			}
			if mine > 0 {
				if err := tx.checkPendingCap(run.Tenant, p.MaxPendingApprovals); err != nil {
					return err
				}
			}
		}
		maxSeq, err := tx.d.MaxActionSeq(tx.ctx, p.RunID)
		if err != nil {
			return err
		}
		id := ActionID(tx.newID(PrefixAction))
		action := &Action{
			ID: id, RunID: p.RunID, Tenant: run.Tenant, Seq: maxSeq + 1, IdempotencyKey: p.IdempotencyKey,
			Tool: p.Tool, ToolVersion: p.ToolVersion, Effect: p.Effect, Arguments: args,
			ActionDigest: digest, DedupKey: DedupKeyFor(p.RunID, id), Supersedes: p.Supersedes,
			State: ActionProposed, Version: 1, CreatedAt: tx.now, UpdatedAt: tx.now, Gate: gateOf(p.Gate, p.GateAudit),
		}
		if p.Supersedes != "" {
			old, err := tx.findAction(p.Supersedes)
			if err != nil {
				return err
			}
			if old.RunID != p.RunID {
				return Errorf(CodeInvalid, "action %s belongs to another run", p.Supersedes)
			}
			if err := tx.transitionAction(ActionTransition{ID: old.ID, From: old.State, To: ActionSuperseded, Actor: p.Actor,
				Data: map[string]any{"superseded_by": id}}); err != nil {
				return err
			}
		}
		// A gate that opens no approval (approved, denied) is written with
		// the action: the row starts in the gate's state (its second
		// version) and both events are appended, one UPDATE fewer on the
		// path every auto-approved action takes. When the attempt starts in
		// the same write, the row is inserted once the start's checks have
		// passed, already running (startAttemptOf), rather than inserted
		// approved and moved: the events, and the digests they bind, are
		// those of each state in turn all the same.
		direct := p.Gate == ActionApproved || p.Gate == ActionDenied
		if direct {
			if err := ValidateActionTransition(ActionProposed, p.Gate); err != nil {
				return err
			}
			action.State, action.Version = p.Gate, 2
		}
		if !direct || !p.StartAttempt {
			if err := tx.d.InsertAction(tx.ctx, action); err != nil {
				return err
			}
		}
		data := map[string]any{"tool": p.Tool, "tool_version": p.ToolVersion, "effect": p.Effect,
			"action_digest": digest, "seq": action.Seq}
		if p.Supersedes != "" {
			data["supersedes"] = p.Supersedes
		}
		// The row as inserted is bound by the event of the state it was
		// inserted in: the gate's, when it opens no approval.
		proposed := transitionEvent(p.RunID, "action", string(id), ActionState(""), ActionProposed, p.Actor, data)
		if !direct {
			proposed = proposed.bind(actionContent(action, argsDigest))
		}
		if _, err := tx.appendEvent(proposed); err != nil {
			return err
		}
		// The gate's event says which rule of which rule set chose the
		// state it enters, when the caller audited it.
		var gateData any
		if p.GateAudit != (GateAudit{}) {
			g := GateContentOf(action.Gate)
			gateData = gateEventData{Gate: gateEventGate{Rule: g.Rule, Reason: g.Reason, RulesDigest: g.RulesDigest}}
		}
		switch {
		case direct:
			if _, err := tx.appendEvent(transitionEvent(p.RunID, "action", string(id), ActionProposed, p.Gate, p.Actor, gateData).
				bind(actionContent(action, argsDigest))); err != nil {
				return err
			}
		case p.Gate != "":
			moved, err := tx.moveAction(ActionTransition{ID: id, From: ActionProposed, To: p.Gate,
				ApprovalTTL: p.ApprovalTTL, Actor: p.Actor, Data: gateData}, 0)
			if err != nil {
				return err
			}
			action = moved
		}
		if p.Gate == ActionAwaitingApproval {
			if out.Approval, err = tx.pendingApproval(id); err != nil {
				return err
			}
		}
		if p.Usage != nil {
			u := *p.Usage
			u.RunID = p.RunID
			if run.Budget.Used, err = tx.addUsage(u); err != nil {
				return err
			}
		}
		if p.StartAttempt {
			// startAttempt writes nothing before its checks pass, so a
			// refusal keeps the recorded action and its events intact. The
			// action and the run are as this write has just written them;
			// the action is not stored yet: startAttemptOf inserts it
			// running if the attempt starts, and if it is refused the action
			// is inserted as approved.
			out.Attempt, out.StartErr = tx.startAttemptOf(action, run, p.Actor, &pendingAction{argsDigest: argsDigest})
			if out.StartErr != nil && Code(out.StartErr) == CodeInternal {
				return out.StartErr
			}
			if out.StartErr != nil {
				if err := tx.d.InsertAction(tx.ctx, action); err != nil {
					return err
				}
			}
		}
		// action is the row as this write left it (inserted, moved by its
		// gate, or started), so it is not read back.
		out.Action, out.Chain = action, tx.chainMove(p.RunID)
		return nil
	})
	return out, err
}

// pendingAction is an action CreateAction has built and bound in its
// events but not inserted yet, because its attempt starts in the same
// write: the row is inserted in the state the start leaves it in.
type pendingAction struct {
	argsDigest Digest // the tree digest of its arguments
}

// insertMoved inserts action, which is not stored yet, as move (whose
// From is its state) leaves it, raising its attempt count to at least
// attemptCount, and appends the move's event: what moveAction writes and
// appends for a stored row, without the UPDATE. action becomes the row.
func (tx *txn) insertMoved(action *Action, move ActionTransition, attemptCount int64, argsDigest Digest) error {
	if err := ValidateActionTransition(move.From, move.To); err != nil {
		return err
	}
	if action.State != move.From {
		return Errorf(CodeConflict, "action %s is %s, not %s", action.ID, action.State, move.From)
	}
	moved := *action
	moved.State, moved.Version, moved.UpdatedAt = move.To, action.Version+1, tx.now
	moved.AttemptCount = max(moved.AttemptCount, attemptCount)
	if err := tx.d.InsertAction(tx.ctx, &moved); err != nil {
		return err
	}
	if _, err := tx.appendEvent(transitionEvent(moved.RunID, "action", string(moved.ID), move.From, move.To, move.Actor, move.Data).
		bind(actionContent(&moved, argsDigest))); err != nil {
		return err
	}
	*action = moved
	return nil
}

// gateEventData is the data of an action's gate event: the gate's content
// but its decision, which is the event's to_state.
type gateEventData struct {
	Gate gateEventGate `json:"gate"`
}

type gateEventGate struct {
	Rule        *int64 `json:"rule"` // null: the default decided
	Reason      string `json:"reason"`
	RulesDigest Digest `json:"rules_digest"`
}

// checkGateAudit holds an audit to what CreateActionParams.GateAudit says;
// the zero audit passes.
func checkGateAudit(gate ActionState, a GateAudit) error {
	switch {
	case a == (GateAudit{}):
		return nil
	case gate == "":
		return Errorf(CodeInvalid, "a gate audit needs a gate")
	case !a.RulesDigest.Valid():
		return Errorf(CodeInvalid, "a gate audit needs the rules digest as sha256:<64 hex>, not %q", a.RulesDigest)
	case a.Rule < -1:
		return Errorf(CodeInvalid, "gate rule must be a rule's index or -1 for the default, not %d", a.Rule)
	}
	return checkText("gate reason", a.Reason, MaxGateReasonLength)
}

// TransitionAction implements Store.
func (s *DB) TransitionAction(ctx context.Context, p ActionTransition) (*Action, error) {
	if p.ApprovalTTL < 0 {
		return nil, Errorf(CodeInvalid, "transition action: approval TTL cannot be negative")
	}
	if owner := ActionEdgeOwner(p.From, p.To); owner != "" {
		return nil, Errorf(CodeInvalid, "transition action: %s → %s is taken by %s", p.From, p.To, owner)
	}
	var out *Action
	err := s.inTx(ctx, "transition_action", func(tx *txn) error {
		if err := tx.transitionAction(p); err != nil {
			return err
		}
		var err error
		out, err = tx.findAction(p.ID)
		return err
	})
	return out, err
}

// transitionAction is the one place an action's state changes. Entering
// awaiting_approval opens the approval bound to the action's digest; leaving
// it other than by a decision takes the pending approval with it
// (invalidated).
func (tx *txn) transitionAction(p ActionTransition) error {
	_, err := tx.moveAction(p, 0)
	return err
}

// moveAction is transitionAction that also raises the action's attempt
// count to attemptCount (StartAttempt) and returns the updated action.
func (tx *txn) moveAction(p ActionTransition, attemptCount int64) (*Action, error) {
	if err := ValidateActionTransition(p.From, p.To); err != nil {
		return nil, err
	}
	// The driver hands back the updated row (its run, its digest for an
	// approval, its content for the event) without reading it again.
	action, ok, err := tx.putActionMove(p.ID, p.From, p.To, attemptCount)
	if err != nil {
		return nil, err
	}
	if !ok {
		state := ActionState("")
		if a := tx.known.actionOf(p.ID); a != nil {
			state = a.State
		} else {
			a, err := tx.d.GetAction(tx.ctx, p.ID)
			if err != nil {
				return nil, err
			}
			state = a.State
		}
		return nil, Errorf(CodeConflict, "action %s is %s, not %s", p.ID, state, p.From)
	}
	if _, err := tx.appendEvent(transitionEvent(action.RunID, "action", string(p.ID), p.From, p.To, p.Actor, p.Data).
		bind(ActionContentOf(action))); err != nil {
		return nil, err
	}
	if p.To == ActionAwaitingApproval {
		_, err := tx.openApproval(action, p.ApprovalTTL, p.Actor)
		return action, err
	}
	if p.From == ActionAwaitingApproval && p.To != ActionApproved && p.To != ActionDenied && p.To != ActionExpired {
		apr, err := tx.pendingApproval(p.ID)
		if err != nil {
			return nil, err
		}
		return action, tx.transitionApproval(apr, ApprovalInvalidated, p.Actor, "action "+string(p.To), nil, nil)
	}
	return action, nil
}

// putActionMove moves the action from from to to, raising its attempt
// count to attemptCount, if it is still in from, and returns it after the
// move: as the driver's guarded move hands it back or, for the action the
// write keeps in memory (knownRows), as that copy becomes.
func (tx *txn) putActionMove(id ActionID, from, to ActionState, attemptCount int64) (*Action, bool, error) {
	a := tx.known.actionOf(id)
	if a == nil {
		return tx.d.MoveAction(tx.ctx, id, from, to, attemptCount, tx.now)
	}
	if a.State != from {
		return nil, false, nil
	}
	// What MoveAction's UPDATE does to the row.
	a.State, a.Version, a.UpdatedAt, a.AttemptCount = to, a.Version+1, tx.now, max(a.AttemptCount, attemptCount)
	tx.known.actionDirty = true
	out := *a
	return &out, true, nil
}

func (tx *txn) findAction(id ActionID) (*Action, error) { return tx.d.GetAction(tx.ctx, id) }

// FindActionByID implements Store.
func (s *DB) FindActionByID(ctx context.Context, id ActionID) (*Action, error) {
	return read(ctx, s, "find_action_by_id", func(r Reader) (*Action, error) { return r.GetAction(ctx, id) })
}

// FindActions implements Store.
func (s *DB) FindActions(ctx context.Context, f ActionFilter) ([]*Action, error) {
	return read(ctx, s, "find_actions", func(r Reader) ([]*Action, error) { return r.ListActions(ctx, f) })
}

// gateOf is the gate CreateAction records: nil for the zero audit.
func gateOf(gate ActionState, a GateAudit) *ActionGate {
	if a == (GateAudit{}) {
		return nil
	}
	return &ActionGate{Decision: gate, Rule: a.Rule, Reason: a.Reason, RulesDigest: a.RulesDigest}
}
