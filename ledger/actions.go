package ledger

import (
	"context"
	"database/sql"
	"fmt"
)

// actionEdgeOwners names the method that owns an action edge: those edges
// need facts beyond a state change (an attempt row, an approval decision)
// and are refused by TransitionAction.
var actionEdgeOwners = map[[2]ActionState]string{
	{ActionApproved, ActionRunning}:          "StartAttempt",
	{ActionAwaitingApproval, ActionApproved}: "DecideApproval",
	{ActionAwaitingApproval, ActionDenied}:   "DecideApproval",
	{ActionAwaitingApproval, ActionExpired}:  "ExpireApprovals",
	{ActionRunning, ActionSucceeded}:         "FinishAttempt",
	{ActionRunning, ActionFailed}:            "FinishAttempt",
	{ActionRunning, ActionUncertain}:         "FinishAttempt",
	{ActionRunning, ActionNeedsReview}:       "FinishAttempt",
}

// ActionEdgeOwner returns the Store method that owns the edge from → to, or
// "" if TransitionAction may take it.
func ActionEdgeOwner(from, to ActionState) string { return actionEdgeOwners[[2]ActionState{from, to}] }

// CreateAction implements Store.
func (s *GormStore) CreateAction(ctx context.Context, p CreateActionParams) (CreateActionResult, error) {
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
	digest, err := ActionDigest(ActionDigestInput{Tool: p.Tool, ToolVersion: p.ToolVersion, Effect: p.Effect, Arguments: args})
	if err != nil {
		return CreateActionResult{}, fmt.Errorf("create action: %w", err)
	}
	var out CreateActionResult
	err = s.inTx(ctx, "create action", func(tx *txn) error {
		var existing actionRow
		rows, err := tx.query(findActionByKeySQL, string(p.RunID), p.IdempotencyKey)
		err = scanOne(rows, err, "action", func(rows *sql.Rows) error { return scanAction(rows, &existing) })
		switch {
		case err == nil:
			if existing.ActionDigest != string(digest) {
				return Errorf(CodeConflict, "action key %q of run %s was already used for another action", p.IdempotencyKey, p.RunID)
			}
			out = CreateActionResult{Action: existing.toAction(), Duplicate: true}
			apr, err := tx.pendingApproval(ActionID(existing.ID))
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
		var maxSeq int64
		rows, err = tx.query(maxActionSeqSQL, string(p.RunID))
		if err := scanOne(rows, err, "action seq", func(rows *sql.Rows) error { return rows.Scan(&maxSeq) }); err != nil {
			return err
		}
		id := ActionID(tx.newID(PrefixAction))
		row := actionRow{
			ID: string(id), RunID: string(p.RunID), Tenant: run.Tenant, Seq: maxSeq + 1, IdempotencyKey: p.IdempotencyKey,
			Tool: p.Tool, ToolVersion: p.ToolVersion, Effect: string(p.Effect), Arguments: string(args),
			ActionDigest: string(digest), DedupKey: DedupKeyFor(p.RunID, id), Supersedes: strPtr(string(p.Supersedes)),
			State: string(ActionProposed), Version: 1, CreatedAt: micros(tx.now), UpdatedAt: micros(tx.now),
		}
		row.setGate(p.Gate, p.GateAudit)
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
		// path every auto-approved action takes.
		direct := p.Gate == ActionApproved || p.Gate == ActionDenied
		if direct {
			if err := ValidateActionTransition(ActionProposed, p.Gate); err != nil {
				return err
			}
			row.State, row.Version = string(p.Gate), 2
		}
		if _, err := tx.exec(insertActionSQL, row.ID, row.RunID, row.Tenant, row.Seq, row.IdempotencyKey, row.Tool,
			row.ToolVersion, row.Effect, row.Arguments, row.ActionDigest, row.DedupKey, row.Supersedes, row.State,
			row.AttemptCount, row.Version, row.CreatedAt, row.UpdatedAt, row.GateDecision, row.GateRule, row.GateReason,
			row.RulesDigest); err != nil {
			return err
		}
		data := map[string]any{"tool": p.Tool, "tool_version": p.ToolVersion, "effect": p.Effect,
			"action_digest": digest, "seq": row.Seq}
		if p.Supersedes != "" {
			data["supersedes"] = p.Supersedes
		}
		// The row as inserted is bound by the event of the state it was
		// inserted in: the gate's, when it opens no approval.
		proposed := transitionEvent(p.RunID, "action", string(id), ActionState(""), ActionProposed, p.Actor, data)
		if !direct {
			proposed = proposed.bind(ActionContentOf(row.toAction()))
		}
		if _, err := tx.appendEvent(proposed); err != nil {
			return err
		}
		// The gate's event says which rule of which rule set chose the
		// state it enters, when the caller audited it.
		var gateData any
		if p.GateAudit != (GateAudit{}) {
			g := GateContentOf(row.gate())
			gateData = gateEventData{Gate: gateEventGate{Rule: g.Rule, Reason: g.Reason, RulesDigest: g.RulesDigest}}
		}
		switch {
		case direct:
			if _, err := tx.appendEvent(transitionEvent(p.RunID, "action", string(id), ActionProposed, p.Gate, p.Actor, gateData).
				bind(ActionContentOf(row.toAction()))); err != nil {
				return err
			}
		case p.Gate != "":
			if err := tx.transitionAction(ActionTransition{ID: id, From: ActionProposed, To: p.Gate,
				ApprovalTTL: p.ApprovalTTL, Actor: p.Actor, Data: gateData}); err != nil {
				return err
			}
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
			// action and the run are as this write has just written them.
			out.Attempt, out.StartErr = tx.startAttemptOf(row.toAction(), run, p.Actor)
			if out.StartErr != nil && Code(out.StartErr) == CodeInternal {
				return out.StartErr
			}
		}
		out.Action, err = tx.findAction(id)
		return err
	})
	return out, err
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
func (s *GormStore) TransitionAction(ctx context.Context, p ActionTransition) (*Action, error) {
	if p.ApprovalTTL < 0 {
		return nil, Errorf(CodeInvalid, "transition action: approval TTL cannot be negative")
	}
	if owner := ActionEdgeOwner(p.From, p.To); owner != "" {
		return nil, Errorf(CodeInvalid, "transition action: %s → %s is taken by %s", p.From, p.To, owner)
	}
	var out *Action
	err := s.inTx(ctx, "transition action", func(tx *txn) error {
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
// count to attemptCount (StartAttempt) and returns the updated row.
func (tx *txn) moveAction(p ActionTransition, attemptCount int64) (*actionRow, error) {
	if err := ValidateActionTransition(p.From, p.To); err != nil {
		return nil, err
	}
	// RETURNING hands back the updated row (its run, its digest for an
	// approval, its content for the event) without reading it again.
	var row actionRow
	rows, err := tx.query(moveActionSQL, string(p.To), micros(tx.now), attemptCount, string(p.ID), string(p.From))
	err = scanOne(rows, err, "action "+string(p.ID), func(rows *sql.Rows) error { return scanAction(rows, &row) })
	if Code(err) == CodeNotFound {
		return nil, tx.staleState(&actionRow{}, "action", string(p.ID), string(p.From))
	}
	if err != nil {
		return nil, err
	}
	if _, err := tx.appendEvent(transitionEvent(RunID(row.RunID), "action", string(p.ID), p.From, p.To, p.Actor, p.Data).
		bind(ActionContentOf(row.toAction()))); err != nil {
		return nil, err
	}
	if p.To == ActionAwaitingApproval {
		_, err := tx.openApproval(&row, p.ApprovalTTL, p.Actor)
		return &row, err
	}
	if p.From == ActionAwaitingApproval && p.To != ActionApproved && p.To != ActionDenied && p.To != ActionExpired {
		apr, err := tx.pendingApproval(p.ID)
		if err != nil {
			return nil, err
		}
		return &row, tx.transitionApproval(apr, ApprovalInvalidated, p.Actor, "action "+string(p.To), nil)
	}
	return &row, nil
}

var (
	findActionSQL      = writeStmt(`SELECT ` + actionCols + ` FROM actions WHERE id = ?`)
	findActionByKeySQL = writeStmt(`SELECT ` + actionCols + ` FROM actions WHERE run_id = ? AND idempotency_key = ?`)
	maxActionSeqSQL    = writeStmt(`SELECT COALESCE(MAX(seq), 0) FROM actions WHERE run_id = ?`)
	insertActionSQL    = writeStmt(`INSERT INTO actions (` + actionCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	moveActionSQL      = writeStmt(`UPDATE actions SET state = ?, version = version + 1, updated_at = ?,
	attempt_count = max(attempt_count, ?) WHERE id = ? AND state = ? RETURNING ` + actionCols)
)

func (tx *txn) findAction(id ActionID) (*Action, error) {
	rows, err := tx.query(findActionSQL, string(id))
	return scanActionOf(rows, err, id)
}

// scanActionOf scans the answer of findActionSQL.
func scanActionOf(rows *sql.Rows, err error, id ActionID) (*Action, error) {
	var r actionRow
	if err := scanOne(rows, err, "action "+string(id), func(rows *sql.Rows) error { return scanAction(rows, &r) }); err != nil {
		return nil, err
	}
	return r.toAction(), nil
}

// FindActionByID implements Store.
func (s *GormStore) FindActionByID(ctx context.Context, id ActionID) (*Action, error) {
	rows, err := s.rs.query(ctx, findActionSQL.sql, string(id))
	a, err := scanActionOf(rows, err, id)
	if err != nil {
		return nil, wrapErr("find action", err)
	}
	return a, nil
}

// FindActions implements Store.
func (s *GormStore) FindActions(ctx context.Context, f ActionFilter) ([]*Action, error) {
	var w where
	if f.RunID != nil {
		w.eq("run_id", string(*f.RunID))
	}
	if f.Tenant != nil {
		w.eq("tenant", *f.Tenant)
	}
	if f.State != nil {
		w.eq("state", string(*f.State))
	}
	rows, err := s.rs.query(ctx, w.query(`SELECT `+actionCols+` FROM actions`, "run_id, seq", f.Limit), w.args...)
	if err != nil {
		return nil, wrapErr("find actions", err)
	}
	defer rows.Close()
	out := []*Action{}
	for rows.Next() {
		var r actionRow
		if err := scanAction(rows, &r); err != nil {
			return nil, wrapErr("find actions", err)
		}
		out = append(out, r.toAction())
	}
	if err := rows.Err(); err != nil {
		return nil, wrapErr("find actions", err)
	}
	return out, nil
}
