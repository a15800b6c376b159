package postgres

import (
	"context"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// Writes guarded on a row's version (or, for a budget, on its usage as
// the rules read it): the recovery scan writes the rows it decided on as
// it decided them, in one UPDATE each (sqlrows), instead of a move per
// fact.

func (t *tx) SetBudgetUsed(ctx context.Context, run ledger.RunID, from, to ledger.BudgetUsage) (bool, error) {
	n, err := t.exec(ctx, sqlrows.SetBudgetUsedSQL, to.Attempts, to.Execution.Microseconds(), to.Steps, to.Tokens, to.TokensUnavailable,
		string(run), from.Attempts, from.Execution.Microseconds(), from.Steps, from.Tokens, from.TokensUnavailable)
	return n > 0, wrapErr("set budget used", err)
}

func (t *tx) SetAction(ctx context.Context, a *ledger.Action, from int64) (bool, error) {
	n, err := t.exec(ctx, sqlrows.SetActionSQL, string(a.State), a.AttemptCount, a.Version, sqlrows.Micros(a.UpdatedAt), string(a.ID), from)
	return n > 0, wrapErr("set action", err)
}

func (t *tx) SetAttempt(ctx context.Context, a *ledger.Attempt, from int64) (bool, error) {
	errText, err := sqlrows.AttemptErrorText(a.Error)
	if err != nil {
		return false, wrapErr("set attempt", err)
	}
	n, err := t.exec(ctx, sqlrows.SetAttemptSQL, string(a.Status), string(a.Effect), sqlrows.StrPtr(string(a.EffectObservation)), sqlrows.RawPtr(a.Result),
		errText, sqlrows.MicrosPtr(a.FinishedAt), a.Version, string(a.ID), from)
	return n > 0, wrapErr("set attempt", err)
}
