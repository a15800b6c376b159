package recovery

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// Kind is what recovery does about an action.
type Kind string

// Decisions. Continue, Reconcile, Stop, Review and Wait are final for this
// pass; Query and Cancel are probes: ask the tool, then Decide again with
// the answer in Facts.
const (
	// Continue: run (or re-run) the action: start an attempt, within budget.
	Continue Kind = "continue"
	// Reconcile: the tool says the effect happened; record it and move on
	// without calling the tool again.
	Reconcile Kind = "reconcile"
	// Stop: a budget forbids another attempt and the effect is known not to
	// have happened; the run stops with StopReason.
	Stop Kind = "stop"
	// Review: the effect is unknown; a person decides.
	Review Kind = "review"
	// Wait: nothing to do yet (approval pending, a query too early to
	// trust, a failed query to ask again later).
	Wait Kind = "wait"
	// Query: ask the tool about the dedup key.
	Query Kind = "query"
	// Cancel: ask the tool to cancel the dedup key.
	Cancel Kind = "cancel"
	// Cancelled: the run is being cancelled and this action's attempt is
	// established not to have taken effect: the action is cancelled.
	Cancelled Kind = "cancelled"
)

// Kinds lists every decision kind, final ones first (for metrics that
// show each kind from the start).
func Kinds() []Kind {
	return []Kind{Continue, Reconcile, Stop, Review, Wait, Query, Cancel, Cancelled}
}

// Tool is what recovery knows of a tool: its guarantees and the windows of
// docs/recovery.md.
type Tool struct {
	Guarantees contracts.Guarantees
	// DedupRetention is how long the tool honours a dedup key; 0: forever.
	DedupRetention time.Duration
	// QueryVisibility is how long after a call a query may still miss it.
	QueryVisibility time.Duration
	// DecisionTimeout is how long a decision told to an agent (a query, a
	// cancel or a resend of a client's tool) may go unanswered before a
	// person is asked instead; 0: forever. Only a client's tool has one.
	DecisionTimeout time.Duration
}

// ToolFor returns the recovery view of a tool descriptor.
func ToolFor(d contracts.ToolDescriptor) Tool {
	return Tool{Guarantees: d.Guarantees, DedupRetention: d.DedupRetention(), QueryVisibility: d.QueryVisibility()}
}

// QueryAnswer is a tool's answer to a query by dedup key; Err is a failed
// query (which is never an answer).
type QueryAnswer struct {
	Effect ledger.EffectFact
	Err    error
}

// CancelAnswer is a tool's answer to a cancel by dedup key.
type CancelAnswer struct {
	Confirmed bool
	Err       error
}

// Facts is everything a decision is made from. Decide does no I/O.
type Facts struct {
	Action *ledger.Action
	// Attempt is the action's last attempt; nil if none was recorded.
	Attempt *ledger.Attempt
	Tool    Tool
	// Retry is the budget verdict on one more attempt ("" allows it).
	Retry ledger.StopReason
	// RetryRationale explains Retry.
	RetryRationale string
	// Cancelling is set once the run's cancel was accepted.
	Cancelling bool
	Now        time.Time
	// Query and Cancel hold the tool's answers once asked in this pass.
	Query  *QueryAnswer
	Cancel *CancelAnswer
	// QueryFailures counts failed queries about this attempt so far,
	// including Query if it failed; MaxQueryFailures is the recovery
	// budget for them (0: 3).
	QueryFailures    int
	MaxQueryFailures int
	// Told is the decision the action's agent was last told and has not
	// answered (a client's tool; nil if none): Decide hands the action to
	// a person once it has gone unanswered for Tool.DecisionTimeout.
	Told *ledger.AgentDecision
}

// Decision is what to do and why.
type Decision struct {
	Kind       Kind
	StopReason ledger.StopReason // with Stop
	// Effect is the effect fact the decision rests on, when a probe
	// established one (happened or not_happened).
	Effect    ledger.EffectFact
	Rationale string
	// ID names the facts a decision told to an agent rests on
	// (DecisionID); set only for a client's tool's query and cancel.
	ID string
}

// Decide is the decision table of docs/recovery.md as one pure function.
// Principles it never breaks: a missing or failed answer is never read as
// "did not happen"; a write whose effect is unknown is never retried unless
// the tool dedups within its window; a spent budget stops only what is
// known not to have happened, and hands the unknown to a person.
func Decide(f Facts) Decision {
	a := f.Action
	switch a.State {
	case ledger.ActionProposed, ledger.ActionAwaitingApproval:
		return Decision{Kind: Wait, Rationale: "waiting for approval; it expires when its TTL passes"}
	case ledger.ActionApproved:
		if d, ok := unanswered(f, ResendDecisionID(f)); ok {
			return d
		}
		if f.Cancelling && f.Attempt != nil && f.Attempt.Effect == ledger.EffectUnknown && f.Action.Effect != ledger.EffectRead {
			return Decision{Kind: Review, Rationale: "cancel accepted before the action was tried again, but the effect of its earlier attempt is unknown: a person decides"}
		}
		if f.Cancelling {
			return Decision{Kind: Cancelled, Effect: ledger.EffectNotHappened, Rationale: "cancel accepted before the action started: it never runs"}
		}
		if f.Retry != "" {
			return Decision{Kind: Stop, StopReason: f.Retry, Rationale: "approved but no attempt allowed: " + f.RetryRationale}
		}
		return Decision{Kind: Continue, Rationale: "approved, no attempt in flight: start one"}
	case ledger.ActionRunning, ledger.ActionUncertain:
		return decideUncertain(f)
	default:
		return Decision{Kind: Wait, Rationale: fmt.Sprintf("action is %s: nothing for recovery to do", a.State)}
	}
}

// decideUncertain covers an attempt started with no outcome, or finished
// with an unknown effect (a timeout, an interrupted call).
func decideUncertain(f Facts) Decision {
	g := f.Tool.Guarantees
	if f.Attempt != nil && f.Attempt.Effect != ledger.EffectUnknown {
		return afterEffect(f, f.Attempt.Effect, "the attempt's effect is already established as "+string(f.Attempt.Effect))
	}
	if f.Action.Effect == ledger.EffectRead {
		// A read changes nothing: whatever the call did, doing it again
		// is safe, and there is no effect for a person to establish.
		return afterEffect(f, ledger.EffectNotHappened, "a read carries no effect")
	}
	if f.Told != nil {
		for _, k := range []Kind{Query, Cancel} {
			if d, ok := unanswered(f, DecisionID(f, k)); ok {
				return d
			}
		}
	}
	// A run being cancelled: a cancel-capable tool is cancelled first, then
	// its effect established by query where possible.
	if f.Cancelling && g.Cancel && f.Cancel == nil {
		return Decision{Kind: Cancel, Rationale: "cancel accepted and the tool can cancel: cancel by dedup key first"}
	}
	if f.Cancel != nil && f.Cancel.Err == nil && f.Cancel.Confirmed {
		return afterEffect(f, ledger.EffectNotHappened, "the tool confirmed the cancel: the effect did not and will not happen")
	}
	if g.Query {
		return decideByQuery(f)
	}
	if g.Dedup && !f.Cancelling {
		if f.Tool.DedupRetention > 0 && f.Attempt != nil && f.Now.Sub(f.Attempt.StartedAt) > f.Tool.DedupRetention {
			return Decision{Kind: Review, Rationale: fmt.Sprintf("effect unknown; the tool dedups but only for %s, and the attempt started %s ago: a resend could act twice",
				f.Tool.DedupRetention, f.Now.Sub(f.Attempt.StartedAt).Round(time.Millisecond))}
		}
		if f.Retry != "" {
			return Decision{Kind: Review, Rationale: "effect unknown and no attempt left to resend with the dedup key: " + f.RetryRationale}
		}
		return Decision{Kind: Continue, Rationale: "effect unknown, the tool cannot be queried but dedups: resend with the same dedup key"}
	}
	if g.Cancel && !f.Cancelling {
		switch {
		case f.Cancel == nil:
			return Decision{Kind: Cancel, Rationale: "effect unknown, the tool can neither be queried nor dedup, but can cancel: cancel by dedup key"}
		case f.Cancel.Err != nil:
			return Decision{Kind: Review, Rationale: "effect unknown and the cancel failed: " + errText(f.Cancel.Err)}
		default: // not confirmed
			return Decision{Kind: Review, Rationale: "effect unknown and the tool did not confirm the cancel"}
		}
	}
	if f.Cancel != nil {
		return Decision{Kind: Review, Rationale: "cancel accepted; the tool did not confirm the cancel and cannot be queried: effect unknown, a person decides"}
	}
	return Decision{Kind: Review, Rationale: "effect unknown and the tool can neither be queried, dedup nor cancel: a person decides"}
}

func decideByQuery(f Facts) Decision {
	maxFailures := f.MaxQueryFailures
	if maxFailures <= 0 {
		maxFailures = 3
	}
	if f.Query == nil {
		if f.Attempt != nil && f.Tool.QueryVisibility > 0 {
			if age := f.Now.Sub(f.Attempt.StartedAt); age < f.Tool.QueryVisibility {
				return Decision{Kind: Wait, Rationale: fmt.Sprintf("the tool's queries may miss a call for %s and the attempt started %s ago: ask later",
					f.Tool.QueryVisibility, age.Round(time.Millisecond))}
			}
		}
		return Decision{Kind: Query, Rationale: "effect unknown and the tool can be queried: query by dedup key"}
	}
	q := f.Query
	switch {
	case q.Err != nil && f.QueryFailures >= maxFailures:
		return Decision{Kind: Review, Rationale: fmt.Sprintf("the query failed %d times (last: %s): recovery budget spent, a person decides", f.QueryFailures, errText(q.Err))}
	case q.Err != nil:
		return Decision{Kind: Wait, Rationale: fmt.Sprintf("the query failed (%s), attempt %d of %d: ask again later", errText(q.Err), f.QueryFailures, maxFailures)}
	case q.Effect == ledger.EffectHappened:
		return afterEffect(f, ledger.EffectHappened, "the query found the effect")
	case q.Effect == ledger.EffectNotHappened:
		return afterEffect(f, ledger.EffectNotHappened, "the query found no effect after its visibility delay")
	default:
		return Decision{Kind: Review, Rationale: "the tool answered the query with 'unknown': a person decides"}
	}
}

// ResendDecisionID names a resend an agent is told: a new attempt of an
// approved action whose last attempt's effect is unknown, with the same
// dedup key. It rests on the action and that attempt only, so that it
// stays the same until the agent begins the new attempt; "" when the
// action is no such resend.
func ResendDecisionID(f Facts) string {
	if f.Action.State != ledger.ActionApproved || f.Action.Effect == ledger.EffectRead || f.Attempt == nil || f.Attempt.Effect != ledger.EffectUnknown {
		return ""
	}
	return resendID(f.Action.ID, f.Attempt.ID)
}

func resendID(action ledger.ActionID, attempt ledger.AttemptID) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00resend", action, attempt))
	return "dec_" + hex.EncodeToString(h[:])[:32]
}

// Overdue reports whether the decision told has gone unanswered for the
// tool's decision timeout at now: what hands its action to a person.
func Overdue(told ledger.AgentDecision, tool Tool, now time.Time) bool {
	return !told.Answered && tool.DecisionTimeout > 0 && now.Sub(told.DecidedAt) >= tool.DecisionTimeout
}

// unanswered is the review of an action whose agent was told the decision
// id and has not answered it within the tool's decision timeout; false if
// that is not so.
func unanswered(f Facts, id string) (Decision, bool) {
	t := f.Told
	if t == nil || id == "" || t.DecisionID != id || !Overdue(*t, f.Tool, f.Now) {
		return Decision{}, false
	}
	waited := f.Now.Sub(t.DecidedAt)
	return Decision{Kind: Review, Rationale: fmt.Sprintf("the agent was told to %s %s ago and has not done so within the tool's decision timeout (%s): effect unknown, a person decides",
		toldVerb(t.Kind), waited.Round(time.Millisecond), f.Tool.DecisionTimeout)}, true
}

func toldVerb(kind string) string {
	switch Kind(kind) {
	case Query:
		return "query its tool"
	case Cancel:
		return "cancel the call"
	default:
		return "send the call again"
	}
}

// afterEffect decides once the effect is established.
func afterEffect(f Facts, e ledger.EffectFact, why string) Decision {
	switch {
	case e == ledger.EffectHappened:
		return Decision{Kind: Reconcile, Effect: e, Rationale: why + ": record it, do not call the tool again"}
	case f.Cancelling:
		return Decision{Kind: Cancelled, Effect: e, Rationale: why + "; cancel accepted: the action is cancelled"}
	case f.Retry != "":
		return Decision{Kind: Stop, Effect: e, StopReason: f.Retry, Rationale: why + "; no attempt left: " + f.RetryRationale}
	default:
		return Decision{Kind: Continue, Effect: e, Rationale: why + ": retry under the same approval"}
	}
}

// maxErrText is the most of a tool's error text a rationale quotes; the
// whole text is kept in the observation of the failed probe.
const maxErrText = 1000

// errText is a tool's error as a rationale quotes it: on one line (control
// characters and runs of white space as one space, since the ledger takes
// a rationale as one line of text) and at most maxErrText bytes.
func errText(err error) string {
	s := strings.Join(strings.Fields(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(err.Error(), "\uFFFD"))), " ")
	if len(s) <= maxErrText {
		return s
	}
	cut := maxErrText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
