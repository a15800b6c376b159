package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// ErrKeyReused matches, with errors.Is, a submission refused because its
// request identity (tenant, principal, idempotency key) was used for a
// different request. Other conflicts of a submit (a write that kept losing
// to concurrent ones) do not match it.
var ErrKeyReused = errors.New("idempotency key reused")

// idempotencyKeyPattern is the API's key: 1–255 printable ASCII characters.
var idempotencyKeyPattern = regexp.MustCompile(`^[\x20-\x7e]{1,255}$`)

// ValidIdempotencyKey reports whether k is 1–255 printable ASCII characters.
func ValidIdempotencyKey(k string) bool { return idempotencyKeyPattern.MatchString(k) }

// checkText refuses an empty, overlong, non-UTF-8 or control-character
// string for a name-like field (tenant, agent, tool, principal, key).
func checkText(field, s string, maxLen int) error {
	switch {
	case s == "":
		return Errorf(CodeInvalid, "%s is required", field)
	case len(s) > maxLen:
		return Errorf(CodeInvalid, "%s is longer than %d bytes", field, maxLen)
	case !utf8.ValidString(s):
		return Errorf(CodeInvalid, "%s is not valid UTF-8", field)
	case strings.ContainsFunc(s, unicode.IsControl):
		return Errorf(CodeInvalid, "%s contains control characters", field)
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// check refuses negative limits; zero means no limit.
func (l BudgetLimits) check() error {
	if l.MaxAttemptsPerAction < 0 || l.MaxAttemptsPerRun < 0 || l.MaxExecution < 0 || l.MaxSteps < 0 || l.MaxTokens < 0 || l.DeadlineAfter < 0 {
		return Errorf(CodeInvalid, "budget limits cannot be negative")
	}
	return nil
}

// addUsage adds usage to a run's budget, records it as an event and
// returns the run's usage after it.
func (tx *txn) addUsage(p AddUsageParams) (BudgetUsage, error) {
	if p.Steps < 0 || p.Tokens < 0 || p.Execution < 0 {
		return BudgetUsage{}, Errorf(CodeInvalid, "usage cannot be negative")
	}
	b, ok, err := tx.d.AddUsage(tx.ctx, p.RunID, BudgetUsage{Steps: p.Steps, Tokens: p.Tokens, Execution: p.Execution,
		TokensUnavailable: p.TokensUnavailable})
	if err != nil {
		return BudgetUsage{}, err
	}
	if !ok {
		if _, err := tx.findRun(p.RunID); err != nil {
			return BudgetUsage{}, err
		}
		return BudgetUsage{}, Errorf(CodeInvalid, "usage of run %s would overflow", p.RunID)
	}
	_, err = tx.appendEvent(eventSpec{RunID: p.RunID, Type: "budget.usage", EntityType: "budget",
		EntityID: string(p.RunID), Data: map[string]any{"steps": p.Steps, "tokens": p.Tokens,
			"execution_us": p.Execution.Microseconds(), "tokens_unavailable": p.TokensUnavailable}}.bind(BudgetContentOf(p.RunID, *b)))
	return b.Used, err
}

// requestDigestInput is what a run's request digest covers.
type requestDigestInput struct {
	Agent   string          `json:"agent"`
	Input   json.RawMessage `json:"input"`
	Budgets BudgetLimits    `json:"budgets"`
}

// RequestDigest returns the digest that identifies a submission's content.
func RequestDigest(p SubmitRunParams) (Digest, error) {
	if len(p.Input) == 0 {
		return "", Errorf(CodeInvalid, "request digest: input is required")
	}
	return DigestOf(requestDigestInput{Agent: p.Agent, Input: p.Input, Budgets: p.Budgets})
}

// SubmitRun implements Store.
func (s *DB) SubmitRun(ctx context.Context, p SubmitRunParams) (SubmitRunResult, error) {
	if err := firstErr(
		checkText("tenant", p.Tenant, 128),
		checkText("agent", p.Agent, 64),
		checkText("principal", p.Principal, 256),
		p.Budgets.check(),
	); err != nil {
		return SubmitRunResult{}, fmt.Errorf("submit run: %w", err)
	}
	if !ValidIdempotencyKey(p.IdempotencyKey) {
		return SubmitRunResult{}, Errorf(CodeInvalid, "submit run: idempotency key must be 1–255 printable ASCII characters")
	}
	if p.MaxPendingApprovals < 0 {
		return SubmitRunResult{}, Errorf(CodeInvalid, "submit run: the pending approvals cap cannot be negative")
	}
	input, err := Canonicalize(p.Input)
	if err != nil {
		return SubmitRunResult{}, fmt.Errorf("submit run: input: %w", err)
	}
	digest, err := RequestDigest(p)
	if err != nil {
		return SubmitRunResult{}, fmt.Errorf("submit run: %w", err)
	}
	var out SubmitRunResult
	err = s.inTx(ctx, "submit_run", func(tx *txn) error {
		existing, err := tx.d.GetRunByRequest(tx.ctx, p.Tenant, p.Principal, p.IdempotencyKey)
		switch {
		case err == nil:
			if existing.RequestDigest != digest {
				return &Error{Code: CodeConflict, Err: ErrKeyReused,
					Message: fmt.Sprintf("idempotency key %q was already used for a different request", p.IdempotencyKey)}
			}
			run, err := tx.findRun(existing.ID)
			out = SubmitRunResult{Run: run, Replayed: true}
			return err
		case Code(err) != CodeNotFound:
			return err
		}
		if err := tx.checkPendingCap(p.Tenant, p.MaxPendingApprovals); err != nil {
			return err
		}
		l := p.Budgets // as stored: in microseconds
		l.MaxExecution, l.DeadlineAfter = l.MaxExecution.Truncate(time.Microsecond), l.DeadlineAfter.Truncate(time.Microsecond)
		created := &Run{
			ID: RunID(tx.newID(PrefixRun)), Tenant: p.Tenant, IdempotencyKey: p.IdempotencyKey,
			RequestDigest: digest, SubmittedBy: p.Principal, Agent: p.Agent, Input: input,
			State: RunQueued, Version: 1, CreatedAt: tx.now, UpdatedAt: tx.now,
			Budget: Budget{Limits: l},
		}
		if l.DeadlineAfter > 0 {
			at := tx.now.Add(l.DeadlineAfter)
			created.Budget.Deadline = &at
		}
		if err := tx.d.InsertRun(tx.ctx, created); err != nil {
			return err
		}
		if _, err := tx.appendEvent(transitionEvent(created.ID, "run", string(created.ID), RunState(""), RunQueued, p.Principal,
			map[string]any{"agent": p.Agent, "request_digest": digest, "idempotency_key": p.IdempotencyKey}).
			bind(RunContentOf(created), BudgetContentOf(created.ID, created.Budget))); err != nil {
			return err
		}
		if p.Start {
			if err := tx.transitionRun(RunTransition{ID: created.ID, From: RunQueued, To: RunRunning, Actor: p.Principal,
				Data: map[string]any{"cause": "a client drives the run"}}); err != nil {
				return err
			}
		}
		run, err := tx.findRun(created.ID)
		out = SubmitRunResult{Run: run}
		return err
	})
	return out, err
}

// checkPendingCap refuses a new run of a tenant whose pending approvals and
// queued or running runs (each may ask for one at its next step) have
// reached the cap; 0 is no cap. Counting those runs keeps a burst of
// submits from outrunning the cap before the engine opens their
// approvals. It counts no further than the cap, so a flood costs the
// cap's size at most, on the tenant's (tenant, state, id) indexes.
func (tx *txn) checkPendingCap(tenant string, capN int) error {
	if capN <= 0 {
		return nil
	}
	waiting, err := tx.d.CountWaiting(tx.ctx, tenant, capN)
	if err != nil {
		return err
	}
	if waiting >= capN {
		return Errorf(CodeBudgetExceeded, "tenant %s has %d approvals pending or runs that may ask for one, its cap: no new run until people decide some",
			tenant, capN)
	}
	return nil
}

// TransitionRun implements Store.
func (s *DB) TransitionRun(ctx context.Context, p RunTransition) (*Run, error) {
	var run *Run
	err := s.inTx(ctx, "transition_run", func(tx *txn) error {
		if err := tx.transitionRun(p); err != nil {
			return err
		}
		var err error
		run, err = tx.findRun(p.ID)
		return err
	})
	return run, err
}

// transitionRun is the one place a run's state changes.
func (tx *txn) transitionRun(p RunTransition) error {
	if err := ValidateRunTransition(p.From, p.To, p.StopReason); err != nil {
		return err
	}
	run, ok, err := tx.d.MoveRun(tx.ctx, p.ID, p.From, p.To, p.StopReason, tx.now)
	if err != nil {
		return err
	}
	if !ok {
		return tx.staleRun(p.ID, p.From)
	}
	data := p.Data
	if p.StopReason != "" && data == nil {
		data = map[string]any{"stop_reason": p.StopReason}
	}
	_, err = tx.appendEvent(transitionEvent(p.ID, "run", string(p.ID), p.From, p.To, p.Actor, data).
		bind(RunContentOf(run)).bind(p.also...))
	return err
}

// staleRun explains a guarded move of a run that matched no row: the run
// is missing (CodeNotFound) or no longer in from (CodeConflict).
func (tx *txn) staleRun(id RunID, from RunState) error {
	run, err := tx.d.GetRun(tx.ctx, id)
	if err != nil {
		return err
	}
	return Errorf(CodeConflict, "run %s is %s, not %s", id, run.State, from)
}

func (tx *txn) findRun(id RunID) (*Run, error) {
	run, err := tx.d.GetRun(tx.ctx, id)
	if err == nil {
		if h := tx.heads[id]; h != nil { // events of this write not yet on the run row
			run.EventSeq, run.EventHash = h.seq, h.hash
		} else { // the head as this write found it: its first event need not read it again
			if tx.heads == nil {
				tx.heads = map[RunID]*chainHead{}
			}
			tx.heads[id] = &chainHead{base: run.EventSeq, seq: run.EventSeq, hash: run.EventHash}
		}
	}
	return run, err
}

// chainMove is how this write has moved run's chain head so far; zero if
// it has not read it.
func (tx *txn) chainMove(run RunID) ChainMove {
	if h := tx.heads[run]; h != nil {
		return ChainMove{From: h.base, To: h.seq}
	}
	return ChainMove{}
}

// FindRunByID implements Store.
func (s *DB) FindRunByID(ctx context.Context, id RunID) (*Run, error) {
	return read(ctx, s, "find_run_by_id", func(r Reader) (*Run, error) { return r.GetRun(ctx, id) })
}

// FindRuns implements Store.
func (s *DB) FindRuns(ctx context.Context, f RunFilter) ([]*Run, error) {
	runs, err := read(ctx, s, "find_runs", func(r Reader) ([]*Run, error) { return r.ListRuns(ctx, f) })
	if err != nil {
		return nil, err
	}
	if len(runs) == 0 {
		return nil, nil
	}
	return runs, nil
}

// AddUsage implements Store.
func (s *DB) AddUsage(ctx context.Context, p AddUsageParams) (*Budget, error) {
	if p.Steps < 0 || p.Tokens < 0 || p.Execution < 0 {
		return nil, Errorf(CodeInvalid, "add usage: usage cannot be negative")
	}
	var out *Budget
	err := s.inTx(ctx, "add_usage", func(tx *txn) error {
		if _, err := tx.addUsage(p); err != nil {
			return err
		}
		run, err := tx.findRun(p.RunID)
		if err != nil {
			return err
		}
		out = &run.Budget
		return nil
	})
	return out, err
}
