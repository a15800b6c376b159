package postgres

import (
	"context"

	"github.com/actionledger/ledger/ledger"
)

// Writes guarded on a row's version (or, for a budget, on its usage as
// the rules read it): the recovery scan writes the rows it decided on as
// it decided them, in one UPDATE each, instead of a move per fact.

const (
	setBudgetUsedSQL = `UPDATE budgets SET attempts_used = ?, execution_used_us = ?, steps_used = ?, tokens_used = ?,
	tokens_unavailable = ?, version = version + 1 WHERE run_id = ? AND attempts_used = ? AND execution_used_us = ?
	AND steps_used = ? AND tokens_used = ? AND tokens_unavailable = ?`
	setActionSQL = `UPDATE actions SET state = ?, attempt_count = ?, version = ?, updated_at = ?
	WHERE id = ? AND version = ?`
	setAttemptSQL = `UPDATE attempts SET status = ?, effect = ?, effect_observation_id = ?, result = ?, error = ?,
	finished_at = ?, version = ? WHERE id = ? AND version = ?`
)

func (t *tx) SetBudgetUsed(ctx context.Context, run ledger.RunID, from, to ledger.BudgetUsage) (bool, error) {
	n, err := t.exec(ctx, setBudgetUsedSQL, to.Attempts, to.Execution.Microseconds(), to.Steps, to.Tokens, to.TokensUnavailable,
		string(run), from.Attempts, from.Execution.Microseconds(), from.Steps, from.Tokens, from.TokensUnavailable)
	return n > 0, wrapErr("set budget used", err)
}

func (t *tx) SetAction(ctx context.Context, a *ledger.Action, from int64) (bool, error) {
	n, err := t.exec(ctx, setActionSQL, string(a.State), a.AttemptCount, a.Version, micros(a.UpdatedAt), string(a.ID), from)
	return n > 0, wrapErr("set action", err)
}

func (t *tx) SetAttempt(ctx context.Context, a *ledger.Attempt, from int64) (bool, error) {
	errText, err := attemptErrorText(a.Error)
	if err != nil {
		return false, wrapErr("set attempt", err)
	}
	n, err := t.exec(ctx, setAttemptSQL, string(a.Status), string(a.Effect), strPtr(string(a.EffectObservation)), rawPtr(a.Result),
		errText, microsPtr(a.FinishedAt), a.Version, string(a.ID), from)
	return n > 0, wrapErr("set attempt", err)
}
