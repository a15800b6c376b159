package budget

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/actionledger/ledger/ledger"
)

// Entry is one action of a run's history with its last attempt; Attempt is
// nil when the action was never attempted (awaiting approval, denied,
// superseded before it ran).
type Entry struct {
	Action  *ledger.Action
	Attempt *ledger.Attempt
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
// The proposed action is not part of history. The first that applies, in this
// order, decides:
//
//   - repeated_action: the proposed fingerprint already occurs RepeatLimit
//     times among the history's actions, whatever their state — superseded,
//     denied and failed ones count, since the model proposed them all;
//   - consecutive_errors: the last ConsecutiveErrors actions' last attempts
//     all have status failed or timed_out; an action never attempted, or one
//     whose last attempt ended any other way, breaks the streak;
//   - no_progress: history holds at least NoProgressWindow actions and none
//     of the last NoProgressWindow is in state succeeded.
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
		fp, err := Fingerprint(e.Action.Tool, e.Action.Arguments)
		if err != nil {
			return Verdict{}, fmt.Errorf("loop: action %s: %w", e.Action.ID, err)
		}
		if fp == proposed {
			seen = append(seen, e.Action.ID)
		}
	}
	if len(seen) >= p.RepeatLimit {
		return stop(ledger.StopRepeatedAction, "%s with the same arguments was already proposed %d times (limit %d): %s",
			proposedTool, len(seen), p.RepeatLimit, joinIDs(seen)), nil
	}

	if n := p.ConsecutiveErrors; len(history) >= n && allFailed(history[len(history)-n:]) {
		last := history[len(history)-n:]
		return stop(ledger.StopConsecutiveErrors, "the last attempts of the last %d actions all failed or timed out: %s",
			n, joinIDs(actionIDs(last))), nil
	}

	if n := p.NoProgressWindow; len(history) >= n && noneSucceeded(history[len(history)-n:]) {
		last := history[len(history)-n:]
		return stop(ledger.StopNoProgress, "none of the last %d actions succeeded: %s … %s",
			n, last[0].Action.ID, last[n-1].Action.ID), nil
	}
	return Verdict{}, nil
}

func allFailed(es []Entry) bool {
	for _, e := range es {
		if e.Attempt == nil {
			return false
		}
		if s := e.Attempt.Status; s != ledger.AttemptFailed && s != ledger.AttemptTimedOut {
			return false
		}
	}
	return true
}

func noneSucceeded(es []Entry) bool {
	for _, e := range es {
		if e.Action.State == ledger.ActionSucceeded {
			return false
		}
	}
	return true
}

func actionIDs(es []Entry) []ledger.ActionID {
	ids := make([]ledger.ActionID, len(es))
	for i, e := range es {
		ids[i] = e.Action.ID
	}
	return ids
}

func joinIDs(ids []ledger.ActionID) string {
	ss := make([]string, len(ids))
	for i, id := range ids {
		ss[i] = string(id)
	}
	return strings.Join(ss, ", ")
}
