// Package approval decides which actions need a person and carries an
// approval from pending to a decision.
//
// A Policy evaluates the approval rules of package contracts (first match
// wins, in file order) and falls back to the defaults when none matches:
// read actions are approved without a person, write actions wait for one.
// The engine asks it, through Service.Gate, which state a new action enters;
// each Decision names the rule that decided (or the default) and carries the
// digest of the rules in force, defaults included (Policy.RulesDigest), which
// the ledger records with the action.
//
// A Service decides pending approvals for people. It keeps tenants apart (an
// action of another tenant is not found, never forbidden) and enforces
// separation of duties: the principal who submitted a run may not grant its
// actions unless a rule allows it or the service runs in the relaxed
// development mode. The digest binding, the pending state and the expiry are
// checked by ledger.Store.DecideApproval in the same transaction that
// records the decision, so a lost race or a stale digest changes nothing.
//
// The package imports only ledger and contracts of the project. It reads no
// wall clock: expiry uses the Store's clock.
package approval
