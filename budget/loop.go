package budget

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/actionledger/ledger/ledger"
)

// Entry is one action of a run's history with its last attempt; Attempt is
// nil when the action was never attempted (awaiting approval, denied,
// superseded before it ran). The loop policies decide from the action alone
// (its tool, arguments and state); Attempt is carried for callers that show
// the history, as a model does.
type Entry struct {
	Action  *ledger.Action
	Attempt *ledger.Attempt
	// Fingerprint, if set, is Fingerprint(Action.Tool, Action.Arguments),
	// which a caller that keeps a run's history from step to step takes
	// once per action; Loop takes it when it is empty.
	Fingerprint ledger.Digest
}

// Fingerprint identifies a call for the repeated-action policy: the sha256
// digest of the canonical JSON of {"tool": tool, "arguments": arguments}.
// It leaves out everything that differs between two proposals of the same
// call — the action and call ids, the idempotency key — and also the tool
// version and effect, so a call repeated across a tool upgrade is still a
// repeat. Key order, whitespace and number spelling do not matter (RFC 8785).
//
// Empty arguments or an empty tool are refused (ledger.CodeInvalid), as is
// JSON that ledger.CheckJSON refuses (duplicate keys, nesting too deep).
func Fingerprint(tool string, arguments json.RawMessage) (ledger.Digest, error) {
	if tool == "" {
		return "", ledger.Errorf(ledger.CodeInvalid, "fingerprint: tool is required")
	}
	if len(arguments) == 0 {
		return "", ledger.Errorf(ledger.CodeInvalid, "fingerprint: arguments are required")
	}
	// Canonicalize first: CanonicalJSON's json.Marshal would accept
	// duplicate keys inside a RawMessage and keep whichever JCS keeps.
	args, err := ledger.Canonicalize(arguments)
	if err != nil {
		return "", fmt.Errorf("fingerprint: arguments: %w", err)
	}
	toolJSON, err := ledger.CanonicalJSON(tool)
	if err != nil {
		return "", fmt.Errorf("fingerprint: tool: %w", err)
	}
	// The canonical form of {"tool": tool, "arguments": args}, written
	// directly: args is canonical already and "arguments" sorts first, so
	// marshalling the pair and canonicalizing it again (as the policy runs
	// over the whole history on every step) would only give these bytes back.
	// TestFingerprintIsDigestOfPair holds it to that general path.
	doc := make([]byte, 0, len(args)+len(toolJSON)+len(`{"arguments":,"tool":}`))
	doc = append(append(append(append(append(doc, `{"arguments":`...), args...), `,"tool":`...), toolJSON...), '}')
	return ledger.DigestCanonical(doc), nil
}

// Loop is checked when the model proposes an action, over the run's history
// so far: every action the run recorded, oldest first, with its last attempt.
// The proposed action is not part of history. The same check serves a
// built-in agent's model step and a client's proposal. The first that
// applies, in this order, decides:
//
//   - repeated_action: the proposed fingerprint already occurs RepeatLimit
//     times among the history's actions, whatever their state — superseded,
//     denied and failed ones count, since the model proposed them all;
//   - consecutive_errors: the last ConsecutiveErrors actions, superseded ones
//     left out, are all in state failed;
//   - no_progress: history holds at least NoProgressWindow actions and none
//     of the last NoProgressWindow is in state succeeded.
//
// What counts as an error is an action in state failed: its call failed and
// its effect is established as not happened — by the tool's answer, a query
// or a person's verdict. Every other state breaks a streak of errors: an
// action that succeeded; one denied, expired, cancelled or abandoned, which
// a person or a rule ended, not a tool; and one still unsettled (uncertain,
// running, in review, awaiting approval), whose outcome is recovery's or a
// person's to establish, never an error by default — a timed-out call whose
// effect recovery then finds to have happened is a success. A superseded
// action neither counts nor breaks: it was replaced before it ran, and its
// replacement's outcome is the one that counts.
//
// What counts as progress is an action in state succeeded, nothing else: a
// window of model steps each of which failed, was refused, was abandoned or
// was superseded made none. So for a built-in agent, whose history between
// model steps holds only succeeded and failed actions, no_progress fires
// before consecutive_errors only when NoProgressWindow is the smaller.
//
// Consecutive errors come before no progress because, when both hold, they
// say more about why. An error (ledger.CodeInvalid) means the proposal or a
// recorded action could not be fingerprinted, or an entry has no action.
func (p Policy) Loop(history []Entry, proposedTool string, proposedArgs json.RawMessage) (Verdict, error) {
	p = p.WithDefaults()
	proposed, err := Fingerprint(proposedTool, proposedArgs)
	if err != nil {
		return Verdict{}, fmt.Errorf("loop: proposed action: %w", err)
	}
	var seen []ledger.ActionID
	for i, e := range history {
		if e.Action == nil {
			return Verdict{}, ledger.Errorf(ledger.CodeInvalid, "loop: history entry %d has no action", i)
		}
		fp := e.Fingerprint
		if fp == "" {
			if fp, err = Fingerprint(e.Action.Tool, e.Action.Arguments); err != nil {
				return Verdict{}, fmt.Errorf("loop: action %s: %w", e.Action.ID, err)
			}
		}
		if fp == proposed {
			seen = append(seen, e.Action.ID)
		}
	}
	if len(seen) >= p.RepeatLimit {
		return stop(ledger.StopRepeatedAction, "%s with the same arguments was already proposed %d times (limit %d): %s",
			proposedTool, len(seen), p.RepeatLimit, joinIDs(seen)), nil
	}

	if streak := lastErrors(history, p.ConsecutiveErrors); len(streak) == p.ConsecutiveErrors {
		return stop(ledger.StopConsecutiveErrors, "the last %d actions all failed (limit %d): %s",
			len(streak), p.ConsecutiveErrors, joinIDs(streak)), nil
	}

	if n := p.NoProgressWindow; len(history) >= n && noneSucceeded(history[len(history)-n:]) {
		last := history[len(history)-n:]
		return stop(ledger.StopNoProgress, "none of the last %d actions succeeded: %s … %s",
			n, last[0].Action.ID, last[n-1].Action.ID), nil
	}
	return Verdict{}, nil
}

// lastErrors returns the ids of the failed actions at the end of history,
// oldest first, superseded ones left out, at most n of them: fewer than n
// means the streak is shorter.
func lastErrors(history []Entry, n int) []ledger.ActionID {
	var ids []ledger.ActionID
	for i := len(history) - 1; i >= 0 && len(ids) < n; i-- {
		a := history[i].Action
		if a.State == ledger.ActionSuperseded {
			continue
		}
		if a.State != ledger.ActionFailed {
			break // the streak ends here
		}
		ids = append(ids, a.ID)
	}
	slices.Reverse(ids)
	return ids
}

func noneSucceeded(es []Entry) bool {
	for _, e := range es {
		if e.Action.State == ledger.ActionSucceeded {
			return false
		}
	}
	return true
}

func joinIDs(ids []ledger.ActionID) string {
	ss := make([]string, len(ids))
	for i, id := range ids {
		ss[i] = string(id)
	}
	return strings.Join(ss, ", ")
}
