package recovery

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/actionledger/ledger/ledger"
)

// Outcome is a person's verdict on an action in review.
type Outcome string

// Outcomes of a review.
const (
	// OutcomeHappened: the effect took place; the action succeeded.
	OutcomeHappened Outcome = "happened"
	// OutcomeNotHappened: the effect did not take place; the action failed
	// and the run fails with tool_error, as for a tool error.
	OutcomeNotHappened Outcome = "not_happened"
	// OutcomeAbandon: stop here whatever happened; the run stops with
	// user_cancelled.
	OutcomeAbandon Outcome = "abandon"
)

// ResolveParams is a person settling an action in review.
type ResolveParams struct {
	Tenant    string
	Principal string
	ActionID  ledger.ActionID
	Outcome   Outcome
	Note      string
	// RedactFunc, if set, hides secrets in Note once it has passed its
	// checks, before it is stored: a person's free text may hold one, and
	// the observation and event that keep it cannot be edited later.
	// Engine.Resolve sets it to the engine's keyed redactor; nil keeps the
	// note as given.
	RedactFunc func(string) string
}

// MaxNoteLength bounds a resolution note, in characters.
const MaxNoteLength = 2000

// Resolve settles an action in needs_review: the person's verdict is
// recorded as an observation on the action's last attempt (source person),
// the action moves to succeeded, failed or abandoned, and the run leaves
// needs_review (back to running, for the engine to go on or stop) once no
// other action of it waits for review — all in one transaction
// (Store.SettleReview). Errors: CodeInvalid for a bad
// outcome or note, CodeNotFound for an unknown or another tenant's action,
// CodeConflict if the action is not in review.
func Resolve(ctx context.Context, store ledger.Store, p ResolveParams) (*ledger.Action, error) {
	var to ledger.ActionState
	var effect ledger.EffectFact
	switch p.Outcome {
	case OutcomeHappened:
		to, effect = ledger.ActionSucceeded, ledger.EffectHappened
	case OutcomeNotHappened:
		to, effect = ledger.ActionFailed, ledger.EffectNotHappened
	case OutcomeAbandon:
		to, effect = ledger.ActionAbandoned, ledger.EffectUnknown
	default:
		return nil, ledger.Errorf(ledger.CodeInvalid, "resolve: outcome must be happened, not_happened or abandon, not %q", p.Outcome)
	}
	if p.Principal == "" {
		return nil, ledger.Errorf(ledger.CodeInvalid, "resolve: principal is required")
	}
	if len([]rune(p.Note)) > MaxNoteLength {
		return nil, ledger.Errorf(ledger.CodeInvalid, "resolve: note is longer than %d characters", MaxNoteLength)
	}
	if p.RedactFunc != nil {
		p.Note = p.RedactFunc(p.Note)
	}
	a, err := store.FindActionByID(ctx, p.ActionID)
	switch {
	case ledger.Code(err) == ledger.CodeNotFound, err == nil && a.Tenant != p.Tenant:
		return nil, ledger.Errorf(ledger.CodeNotFound, "action %s not found", p.ActionID)
	case err != nil:
		return nil, fmt.Errorf("resolve: %w", err)
	}
	detail, err := json.Marshal(map[string]string{"outcome": string(p.Outcome), "note": p.Note, "by": p.Principal})
	if err != nil {
		return nil, fmt.Errorf("resolve: %w", err)
	}
	a, err = store.SettleReview(ctx, ledger.SettleReviewParams{ActionID: a.ID, To: to, Effect: effect, Detail: detail,
		Actor: p.Principal, Data: map[string]any{"outcome": p.Outcome, "note": p.Note}})
	if err != nil {
		return nil, fmt.Errorf("resolve: %w", err)
	}
	return a, nil
}
