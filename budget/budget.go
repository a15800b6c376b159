package budget

import (
	"fmt"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// Default loop-policy thresholds.
const (
	DefaultRepeatLimit       = 2
	DefaultNoProgressWindow  = 10
	DefaultConsecutiveErrors = 3
)

// Policy holds the loop-policy thresholds; zero fields take the defaults.
// A negative field also takes its default: loop policies are a safety net,
// and a threshold that cannot be met would silently switch one off. To make a
// policy lenient, set a large threshold. Its JSON form is
// {"repeat_limit": 2, "no_progress_window": 10, "consecutive_errors": 3},
// every field optional.
//
// The budgets themselves (steps, tokens, attempts, execution time, deadline)
// are not here: they belong to the run and are persisted with it
// (ledger.Budget). The thresholds belong to the agent: an engine holds one
// Policy per agent (engine.Agent.Policy), falling back to its own.
type Policy struct {
	// RepeatLimit: an action whose fingerprint already appears this many
	// times is refused; default 2, so the 3rd identical proposal stops the
	// run.
	RepeatLimit int `json:"repeat_limit,omitempty"`
	// NoProgressWindow: this many consecutive model steps (actions, in any
	// state, superseded ones included) without an action that succeeded
	// stop the run with no_progress; default 10.
	NoProgressWindow int `json:"no_progress_window,omitempty"`
	// ConsecutiveErrors: this many failed actions in a row (state failed,
	// superseded actions left out; any other state breaks the row) stop the
	// run with consecutive_errors; default 3. Policy.Loop says what counts.
	ConsecutiveErrors int `json:"consecutive_errors,omitempty"`
}

// DefaultPolicy returns the policy with every threshold at its default.
func DefaultPolicy() Policy {
	return Policy{
		RepeatLimit:       DefaultRepeatLimit,
		NoProgressWindow:  DefaultNoProgressWindow,
		ConsecutiveErrors: DefaultConsecutiveErrors,
	}
}

// WithDefaults returns p with every zero or negative field replaced by its
// default: the thresholds the checks actually use.
func (p Policy) WithDefaults() Policy {
	d := DefaultPolicy()
	if p.RepeatLimit <= 0 {
		p.RepeatLimit = d.RepeatLimit
	}
	if p.NoProgressWindow <= 0 {
		p.NoProgressWindow = d.NoProgressWindow
	}
	if p.ConsecutiveErrors <= 0 {
		p.ConsecutiveErrors = d.ConsecutiveErrors
	}
	return p
}

// Verdict is a stop decision: a stop reason with a human rationale; the zero
// Verdict means go on. Rationale names the numbers that decided it, so it
// can go into the run's event log as is.
type Verdict struct {
	Stop      ledger.StopReason `json:"stop,omitempty"`
	Rationale string            `json:"rationale,omitempty"`
}

// Stopped reports whether v stops the run.
func (v Verdict) Stopped() bool { return v.Stop != "" }

func stop(reason ledger.StopReason, format string, args ...any) Verdict {
	return Verdict{Stop: reason, Rationale: fmt.Sprintf(format, args...)}
}

// missing is the verdict for a nil run or action: a caller's bug. The checks
// fail closed rather than let a run go on unchecked.
func missing(what string) Verdict {
	return stop(ledger.StopInternalError, "budget: no %s to check", what)
}

// BeforeStep is checked before each model step, from the run's persisted
// budget alone. Unset (zero) limits never stop. The first that applies, in
// this order, decides:
//
//   - max_steps: Used.Steps >= Limits.MaxSteps;
//   - token_budget_exceeded: Used.Tokens >= Limits.MaxTokens, or a token
//     budget is set while Used.TokensUnavailable — a budget that cannot be
//     counted is not treated as unused;
//   - max_runtime: Used.Execution >= Limits.MaxExecution, or now is at or
//     past Budget.Deadline.
//
// A nil run stops with internal_error.
func (p Policy) BeforeStep(run *ledger.Run, now time.Time) Verdict {
	if run == nil {
		return missing("run")
	}
	l, u := run.Budget.Limits, run.Budget.Used
	switch {
	case l.MaxSteps > 0 && u.Steps >= l.MaxSteps:
		return stop(ledger.StopMaxSteps, "run %s used %d of %d steps", run.ID, u.Steps, l.MaxSteps)
	case l.MaxTokens > 0 && u.Tokens >= l.MaxTokens:
		return stop(ledger.StopTokenBudgetExceeded, "run %s used %d of %d tokens", run.ID, u.Tokens, l.MaxTokens)
	}
	if v := p.Tokens(run); v.Stopped() {
		return v // accounting unavailable
	}
	return runtime(run, now)
}

// Tokens is the token budget alone, checked on what a run has used
// including the step at hand: it stops with token_budget_exceeded once the
// tokens used pass MaxTokens, or once a step reported no usage (the budget
// can no longer be vouched for). The agent protocol checks it on every
// proposal, with the proposal's own usage counted, and on every begin,
// so that a step that spent the budget runs no tool. BeforeStep stops the
// next step already at MaxTokens.
func (p Policy) Tokens(run *ledger.Run) Verdict {
	if run == nil {
		return missing("run")
	}
	l, u := run.Budget.Limits, run.Budget.Used
	switch {
	case l.MaxTokens > 0 && u.Tokens > l.MaxTokens:
		return stop(ledger.StopTokenBudgetExceeded, "run %s used %d tokens, over its budget of %d", run.ID, u.Tokens, l.MaxTokens)
	case l.MaxTokens > 0 && u.TokensUnavailable:
		return stop(ledger.StopTokenBudgetExceeded,
			"token accounting unavailable: a step reported no usage; run %s counted at least %d of %d tokens",
			run.ID, u.Tokens, l.MaxTokens)
	}
	return Verdict{}
}

// BeforeAttempt is checked before every attempt, including a retry that
// recovery chooses. Unset (zero) limits never stop. The first that applies,
// in this order, decides:
//
//   - retry_budget_exhausted: action.AttemptCount >= MaxAttemptsPerAction,
//     or Used.Attempts >= MaxAttemptsPerRun;
//   - max_runtime: Used.Execution >= MaxExecution, or now is at or past
//     Budget.Deadline.
//
// These are the checks ledger.Store.StartAttempt repeats in its transaction;
// asking first lets the engine stop the run with the right reason instead of
// meeting a budget_exceeded error. A nil run or action stops with
// internal_error.
func (p Policy) BeforeAttempt(run *ledger.Run, action *ledger.Action, now time.Time) Verdict {
	if run == nil {
		return missing("run")
	}
	if action == nil {
		return missing("action")
	}
	l, u := run.Budget.Limits, run.Budget.Used
	switch {
	case l.MaxAttemptsPerAction > 0 && action.AttemptCount >= l.MaxAttemptsPerAction:
		return stop(ledger.StopRetryBudgetExhausted, "action %s used %d of %d attempts",
			action.ID, action.AttemptCount, l.MaxAttemptsPerAction)
	case l.MaxAttemptsPerRun > 0 && u.Attempts >= l.MaxAttemptsPerRun:
		return stop(ledger.StopRetryBudgetExhausted, "run %s used %d of %d attempts",
			run.ID, u.Attempts, l.MaxAttemptsPerRun)
	}
	return runtime(run, now)
}

// runtime is the max_runtime check both BeforeStep and BeforeAttempt end
// with: the execution-time budget first, then the wall-clock deadline.
func runtime(run *ledger.Run, now time.Time) Verdict {
	b := run.Budget
	switch {
	case b.Limits.MaxExecution > 0 && b.Used.Execution >= b.Limits.MaxExecution:
		return stop(ledger.StopMaxRuntime, "run %s used %s of %s execution time",
			run.ID, b.Used.Execution, b.Limits.MaxExecution)
	case b.Deadline != nil && !now.Before(*b.Deadline):
		return stop(ledger.StopMaxRuntime, "run %s passed its deadline %s (now %s)",
			run.ID, b.Deadline.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
	}
	return Verdict{}
}
