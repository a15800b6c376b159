// Package simulator is a deterministic agent and a tool simulator for tests,
// the demo, the CLI and the fault matrix.
//
// The agent, practice-cards, turns a Markdown study document into practice
// cards: its model (PracticeCardsModel) proposes one cards.write action and
// then a final answer, and it derives every step from the run's history
// alone, so a restart asks the same question and gets the same answer.
// ScriptedModel replays a fixed list of steps for tests that need other
// shapes of run.
//
// The tools (Tool) keep their side effects in an EffectStore: a SQLite file
// of their own, never the ledger's, so that counting effects there is
// evidence independent of what the ledger believes. Every Execute call is
// recorded there too. A Tool's guarantees (query, dedup, cancel), its dedup
// retention and its query visibility come from its descriptor and may be
// overridden by a Config, so the same tool can run under every combination
// of guarantees. A Config may also hold a fault plan: errors, hangs, slow
// calls and crashes before or after the effect. Crash faults kill the
// process; they exist only where whoever starts the process configures a
// fault plan, and nothing reachable from the network can set one.
//
// A Config also configures the agent itself: whether a failed write goes
// back to its model, which then retries it, and its loop-policy thresholds,
// so that a run can be shown stopping with each loop policy.
//
// It imports ledger, contracts, budget and engine of this project, and the
// database/sql driver github.com/mattn/go-sqlite3; never GORM (only package
// ledger owns it) and never Echo.
package simulator
