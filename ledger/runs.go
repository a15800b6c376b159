package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"gorm.io/gorm"
)

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
	// The guard keeps the sums inside int64: SQLite would silently turn an
	// overflowing INTEGER into a REAL.
	var b budgetRow
	rows, err := tx.query(addUsageSQL, p.Steps, p.Tokens, p.Execution.Microseconds(), p.TokensUnavailable,
		string(p.RunID), math.MaxInt64-p.Steps, math.MaxInt64-p.Tokens, math.MaxInt64-p.Execution.Microseconds())
	err = scanOne(rows, err, "budget of run "+string(p.RunID), func(rows *sql.Rows) error { return rows.Scan(b.targets()...) })
	if Code(err) == CodeNotFound {
		if _, err := tx.findRun(p.RunID); err != nil {
			return BudgetUsage{}, err
		}
		return BudgetUsage{}, Errorf(CodeInvalid, "usage of run %s would overflow", p.RunID)
	}
	if err != nil {
		return BudgetUsage{}, err
	}
	_, err = tx.appendEvent(eventSpec{RunID: p.RunID, Type: "budget.usage", EntityType: "budget",
		EntityID: string(p.RunID), Data: map[string]any{"steps": p.Steps, "tokens": p.Tokens,
			"execution_us": p.Execution.Microseconds(), "tokens_unavailable": p.TokensUnavailable}}.bind(b.content()))
	return b.toBudget(0).Used, err
}

var addUsageSQL = writeStmt(`UPDATE budgets SET steps_used = steps_used + ?, tokens_used = tokens_used + ?,
	execution_used_us = execution_used_us + ?, tokens_unavailable = tokens_unavailable OR ?, version = version + 1
	WHERE run_id = ? AND steps_used <= ? AND tokens_used <= ? AND execution_used_us <= ?
	RETURNING ` + budgetCols)

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
func (s *GormStore) SubmitRun(ctx context.Context, p SubmitRunParams) (SubmitRunResult, error) {
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
	err = s.inTx(ctx, "submit run", func(tx *txn) error {
		var existing runRow
		err := tx.db.Where("tenant = ? AND submitted_by = ? AND idempotency_key = ?", p.Tenant, p.Principal, p.IdempotencyKey).
			Take(&existing).Error
		switch {
		case err == nil:
			if existing.RequestDigest != string(digest) {
				return Errorf(CodeConflict, "idempotency key %q was already used for a different request", p.IdempotencyKey)
			}
			run, err := tx.findRun(RunID(existing.ID))
			out = SubmitRunResult{Run: run, Replayed: true}
			return err
		case !errors.Is(err, gorm.ErrRecordNotFound):
			return err
		}
		if err := tx.checkPendingCap(p.Tenant, p.MaxPendingApprovals); err != nil {
			return err
		}
		row := runRow{
			ID: tx.newID(PrefixRun), Tenant: p.Tenant, IdempotencyKey: p.IdempotencyKey,
			RequestDigest: string(digest), SubmittedBy: p.Principal, Agent: p.Agent, Input: string(input),
			State: string(RunQueued), Version: 1, CreatedAt: micros(tx.now), UpdatedAt: micros(tx.now),
		}
		if err := tx.db.Create(&row).Error; err != nil {
			return err
		}
		l := p.Budgets
		b := budgetRow{
			RunID: row.ID, MaxAttemptsPerAction: l.MaxAttemptsPerAction, MaxAttemptsPerRun: l.MaxAttemptsPerRun,
			MaxExecutionUs: l.MaxExecution.Microseconds(), MaxSteps: l.MaxSteps, MaxTokens: l.MaxTokens,
			Version: 1,
		}
		if l.DeadlineAfter > 0 {
			at := micros(tx.now) + l.DeadlineAfter.Microseconds()
			b.DeadlineAt = &at
		}
		if err := tx.db.Create(&b).Error; err != nil {
			return err
		}
		created := row.toRun(&b)
		if _, err := tx.appendEvent(transitionEvent(RunID(row.ID), "run", row.ID, RunState(""), RunQueued, p.Principal,
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
		run, err := tx.findRun(RunID(row.ID))
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
	var waiting int
	rows, err := tx.query(pendingCapSQL, tenant, string(ApprovalPending), capN, tenant, string(RunQueued), string(RunRunning), capN)
	if err := scanOne(rows, err, "pending approvals", func(rows *sql.Rows) error { return rows.Scan(&waiting) }); err != nil {
		return err
	}
	if waiting >= capN {
		return Errorf(CodeBudgetExceeded, "tenant %s has %d approvals pending or runs that may ask for one, its cap: no new run until people decide some",
			tenant, capN)
	}
	return nil
}

var pendingCapSQL = writeStmt(`SELECT
	(SELECT COUNT(*) FROM (SELECT 1 FROM approvals WHERE tenant = ? AND state = ? LIMIT ?)) +
	(SELECT COUNT(*) FROM (SELECT 1 FROM runs WHERE tenant = ? AND state IN (?, ?) LIMIT ?))`)

// TransitionRun implements Store.
func (s *GormStore) TransitionRun(ctx context.Context, p RunTransition) (*Run, error) {
	var run *Run
	err := s.inTx(ctx, "transition run", func(tx *txn) error {
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
	var row runRow
	rows, err := tx.query(moveRunSQL, string(p.To), strPtr(string(p.StopReason)), micros(tx.now), string(p.ID), string(p.From))
	err = scanOne(rows, err, "run "+string(p.ID), func(rows *sql.Rows) error { return rows.Scan(row.contentTargets()...) })
	if Code(err) == CodeNotFound {
		return tx.staleState(&runRow{}, "run", string(p.ID), string(p.From))
	}
	if err != nil {
		return err
	}
	data := p.Data
	if p.StopReason != "" && data == nil {
		data = map[string]any{"stop_reason": p.StopReason}
	}
	_, err = tx.appendEvent(transitionEvent(p.ID, "run", string(p.ID), p.From, p.To, p.Actor, data).
		bind(RunContentOf(row.toRun(nil))).bind(p.also...))
	return err
}

// moveRunSQL hands back the run's content, which its event binds.
var moveRunSQL = writeStmt(`UPDATE runs SET state = ?, stop_reason = ?, version = version + 1, updated_at = ?
	WHERE id = ? AND state = ? RETURNING ` + runContentCols)

// staleState explains a guarded UPDATE that matched no row: the object is
// missing (CodeNotFound) or no longer in the expected state (CodeConflict).
func (tx *txn) staleState(model any, entity, id, from string) error {
	var state string
	err := tx.db.Model(model).Select("state").Where("id = ?", id).Take(&state).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Errorf(CodeNotFound, "%s %s not found", entity, id)
	}
	if err != nil {
		return err
	}
	return Errorf(CodeConflict, "%s %s is %s, not %s", entity, id, state, from)
}

func (tx *txn) findRun(id RunID) (*Run, error) {
	rows, err := tx.query(findRunSQL, string(id))
	run, err := scanRun(rows, err, id)
	if err == nil {
		if h := tx.heads[id]; h != nil { // events of this write not yet on the run row
			run.EventSeq, run.EventHash = h.seq, h.hash
		}
	}
	return run, err
}

// findRunSQL reads a run with its budget: it runs on every step of every
// run, so one query, scanned by hand, not two through reflection.
var findRunSQL = writeStmt(`SELECT ` + runBudgetCols + `
FROM runs r JOIN budgets b ON b.run_id = r.id WHERE r.id = ?`)

// scanRun scans the answer of findRunSQL.
func scanRun(rows *sql.Rows, err error, id RunID) (*Run, error) {
	var (
		r runRow
		b budgetRow
	)
	err = scanOne(rows, err, "run "+string(id), func(rows *sql.Rows) error { return rows.Scan(runBudgetTargets(&r, &b)...) })
	if err != nil {
		return nil, err
	}
	b.RunID = r.ID
	return r.toRun(&b), nil
}

// FindRunByID implements Store.
func (s *GormStore) FindRunByID(ctx context.Context, id RunID) (*Run, error) {
	rows, err := s.rs.query(ctx, findRunSQL.sql, string(id))
	run, err := scanRun(rows, err, id)
	if err != nil {
		return nil, wrapErr("find run", err)
	}
	return run, nil
}

// FindRuns implements Store.
func (s *GormStore) FindRuns(ctx context.Context, f RunFilter) ([]*Run, error) {
	q := s.r.WithContext(ctx).Model(&runRow{})
	if f.Tenant != nil {
		q = q.Where("tenant = ?", *f.Tenant)
	}
	if f.State != nil {
		q = q.Where("state = ?", *f.State)
	}
	if f.SubmittedBy != nil {
		q = q.Where("submitted_by = ?", *f.SubmittedBy)
	}
	if f.AfterID != nil {
		q = q.Where("id > ?", *f.AfterID)
	}
	if len(f.NotAgents) > 0 {
		q = q.Where("agent NOT IN ?", f.NotAgents)
	}
	if f.Limit > 0 {
		q = q.Limit(f.Limit)
	}
	var rows []runRow
	if err := q.Order("id").Find(&rows).Error; err != nil {
		return nil, wrapErr("find runs", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = rows[i].ID
	}
	var budgets []budgetRow
	if err := s.r.WithContext(ctx).Where("run_id IN ?", ids).Find(&budgets).Error; err != nil {
		return nil, wrapErr("find runs: budgets", err)
	}
	byRun := make(map[string]*budgetRow, len(budgets))
	for i := range budgets {
		byRun[budgets[i].RunID] = &budgets[i]
	}
	out := make([]*Run, len(rows))
	for i := range rows {
		out[i] = rows[i].toRun(byRun[rows[i].ID])
	}
	return out, nil
}

// AddUsage implements Store.
func (s *GormStore) AddUsage(ctx context.Context, p AddUsageParams) (*Budget, error) {
	if p.Steps < 0 || p.Tokens < 0 || p.Execution < 0 {
		return nil, Errorf(CodeInvalid, "add usage: usage cannot be negative")
	}
	var out *Budget
	err := s.inTx(ctx, "add usage", func(tx *txn) error {
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
