// Package budget decides, from persisted facts alone, whether a run may take
// its next model step, its next attempt, or the action a model just proposed
// (docs/concepts.md, "Budgets and loop policies").
//
// It holds three kinds of check, each a pure function of what the ledger has
// recorded and a now the caller passes in:
//
//   - Policy.BeforeStep, before each model step: max_steps,
//     token_budget_exceeded and max_runtime, from the run's Budget.
//   - Policy.BeforeAttempt, before every attempt (and before a retry chosen by
//     recovery): retry_budget_exhausted and max_runtime.
//   - Policy.Loop, when a model proposes an action: repeated_action,
//     consecutive_errors and no_progress, over the run's history. An error
//     is an action in state failed (its effect established as not
//     happened); progress is an action in state succeeded; an uncertain
//     action is recovery's and never an error. Loop's doc has the rule.
//
// The thresholds are per agent (engine.Agent.Policy); the budgets are per
// run. Each returns a Verdict; the zero Verdict means go on. The checks only
// decide: the engine records the stop, and ledger.Store.StartAttempt enforces
// the attempt budgets again in the transaction that counts the attempt, so a
// race between deciding and recording cannot overspend.
//
// A budget whose usage cannot be counted is never read as unused: once a step
// reported no token usage, a run with a token budget stops.
//
// The package imports only ledger and contracts of the project, does no I/O
// and reads no wall clock.
package budget
