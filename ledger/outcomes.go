package ledger

import (
	"errors"
	"fmt"
)

// ErrOutcomeNotAllowed is wrapped by the CodeInvalid error of a
// combination the outcome table refuses (OutcomeOf): a close no call can
// have had, such as a write that succeeded without taking effect.
var ErrOutcomeNotAllowed = errors.New("not an outcome")

// OutcomeRow is one row of the outcome table: the tool's effect class, how
// the attempt closed and what is established of its effect, and where that
// leaves the action; or, when Refusal is set, why no call ends so.
type OutcomeRow struct {
	Effect  Effect
	Status  AttemptStatus
	Fact    EffectFact
	Action  ActionState // "" when refused
	Refusal string
}

// The statuses an attempt closes with, and the facts of an effect, in the
// table's order.
var (
	closingStatuses = []AttemptStatus{AttemptSucceeded, AttemptFailed, AttemptTimedOut, AttemptCancelled, AttemptUncertain}
	effectFacts     = []EffectFact{EffectHappened, EffectNotHappened, EffectUnknown}
)

// OutcomeOf is the one table of what closing an attempt means for its
// action: a tool of effect class effect whose attempt closes with status,
// its effect being fact once the close is recorded. It answers the
// action's next state, or a CodeInvalid error wrapping
// ErrOutcomeNotAllowed that says why no call ends so.
//
// Every path that closes an attempt derives the action's state from it:
// the engine recording a tool's answer, a client's complete or abandon,
// recovery closing an interrupted attempt (Store.FinishAttempt and
// RecordRecovery's CloseAttempt take no state). Status uncertain is a close
// without the call's answer (interrupted, abandoned): the action is
// succeeded when its effect is established as happened, else uncertain,
// for recovery to decide whether it may be tried again.
func OutcomeOf(effect Effect, status AttemptStatus, fact EffectFact) (ActionState, error) {
	state, why := outcome(effect, status, fact)
	if why != "" {
		return "", Errorf(CodeInvalid, "status %q with effect %q is not an outcome of a %s: %s: %w", status, fact, effect, why, ErrOutcomeNotAllowed)
	}
	return state, nil
}

// OutcomeTable is every row of OutcomeOf's table, in the order
// docs/state-machines.md shows it: writes then reads, by status, by fact.
func OutcomeTable() []OutcomeRow {
	var rows []OutcomeRow
	for _, effect := range []Effect{EffectWrite, EffectRead} {
		for _, status := range closingStatuses {
			for _, fact := range effectFacts {
				state, why := outcome(effect, status, fact)
				rows = append(rows, OutcomeRow{Effect: effect, Status: status, Fact: fact, Action: state, Refusal: why})
			}
		}
	}
	return rows
}

// outcome is OutcomeOf's table: the state, or the reason for a refusal.
func outcome(effect Effect, status AttemptStatus, fact EffectFact) (ActionState, string) {
	if !fact.Valid() {
		return "", fmt.Sprintf("%q is not an effect", fact)
	}
	switch effect {
	case EffectRead:
		return readOutcome(status, fact)
	case EffectWrite:
		return writeOutcome(status, fact)
	}
	return "", fmt.Sprintf("%q is not an effect class", effect)
}

// readOutcome: a read changes nothing, so whatever happened to the call the
// action is settled by its status alone.
func readOutcome(status AttemptStatus, fact EffectFact) (ActionState, string) {
	if fact == EffectHappened {
		return "", "a read does not change the world"
	}
	switch status {
	case AttemptSucceeded:
		return ActionSucceeded, ""
	case AttemptFailed, AttemptTimedOut:
		return ActionFailed, ""
	case AttemptCancelled:
		return ActionCancelled, ""
	case AttemptUncertain:
		return ActionUncertain, "" // interrupted: recovery runs it again
	}
	return "", fmt.Sprintf("%q does not close an attempt", status)
}

// writeOutcome: a write's action follows its effect; an answered call whose
// effect is unknown is uncertain, and a failed call that took effect goes
// to a person.
func writeOutcome(status AttemptStatus, fact EffectFact) (ActionState, string) {
	switch status {
	case AttemptSucceeded:
		if fact != EffectHappened {
			return "", "a write that succeeded must have happened"
		}
		return ActionSucceeded, ""
	case AttemptTimedOut:
		if fact != EffectUnknown {
			return "", "a timeout's effect is unknown"
		}
		return ActionUncertain, ""
	case AttemptFailed, AttemptCancelled:
		switch {
		case fact == EffectHappened:
			return ActionNeedsReview, ""
		case fact == EffectUnknown:
			return ActionUncertain, ""
		case status == AttemptCancelled: // cut short before it took effect
			return ActionCancelled, ""
		}
		return ActionFailed, ""
	case AttemptUncertain:
		if fact == EffectHappened {
			return ActionSucceeded, "" // reconciled
		}
		return ActionUncertain, ""
	}
	return "", fmt.Sprintf("%q does not close an attempt", status)
}
