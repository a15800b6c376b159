package budget_test

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/ledger"
)

func TestFingerprint(t *testing.T) {
	fp := func(tool, args string) ledger.Digest {
		t.Helper()
		d, err := budget.Fingerprint(tool, json.RawMessage(args))
		require.NoError(t, err)
		require.True(t, d.Valid(), d)
		return d
	}
	base := fp("cards.write", `{"deck":"go","card":{"front":"a","back":"b"},"n":1}`)

	t.Run("KeyOrderAndWhitespace", func(t *testing.T) {
		require.Equal(t, base, fp("cards.write", "{ \"n\" : 1,\n\t\"card\":{\"back\":\"b\", \"front\":\"a\"}, \"deck\":\"go\" }"))
	})
	t.Run("NumberSpelling", func(t *testing.T) {
		require.Equal(t, base, fp("cards.write", `{"deck":"go","card":{"front":"a","back":"b"},"n":1.0}`))
		require.Equal(t, base, fp("cards.write", `{"deck":"go","card":{"front":"a","back":"b"},"n":1e0}`))
	})
	t.Run("OtherTool", func(t *testing.T) {
		require.NotEqual(t, base, fp("cards.delete", `{"deck":"go","card":{"front":"a","back":"b"},"n":1}`))
	})
	t.Run("OtherArguments", func(t *testing.T) {
		require.NotEqual(t, base, fp("cards.write", `{"deck":"go","card":{"front":"a","back":"c"},"n":1}`))
		require.NotEqual(t, base, fp("cards.write", `{"deck":"go","card":{"front":"a","back":"b"},"n":"1"}`))
		require.NotEqual(t, base, fp("cards.write", `{"deck":"go","card":{"front":"a","back":"b"}}`))
	})
	t.Run("NotAmbiguousAcrossToolAndArguments", func(t *testing.T) {
		require.NotEqual(t, fp("a", `"b"`), fp("ab", `""`))
	})
	t.Run("SameAcrossActionIDs", func(t *testing.T) {
		a := ledger.Action{ID: "act_1", RunID: "run_1", IdempotencyKey: "step-1", DedupKey: "run_1/act_1",
			Tool: "cards.write", ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"x":1,"y":2}`)}
		b := ledger.Action{ID: "act_2", RunID: "run_1", IdempotencyKey: "step-7", DedupKey: "run_1/act_2",
			Tool: "cards.write", ToolVersion: "2", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"y":2, "x":1}`)}
		require.Equal(t, fp(a.Tool, string(a.Arguments)), fp(b.Tool, string(b.Arguments)))
	})

	for _, tt := range []struct {
		name, tool, args string
	}{
		{"EmptyTool", "", `{}`},
		{"EmptyArguments", "t", ``},
		{"InvalidJSON", "t", `{"x":`},
		{"DuplicateKey", "t", `{"x":1,"x":2}`},
		{"TrailingData", "t", `{} {}`},
	} {
		t.Run("Err"+tt.name, func(t *testing.T) {
			_, err := budget.Fingerprint(tt.tool, json.RawMessage(tt.args))
			require.Error(t, err)
			require.Equal(t, ledger.CodeInvalid, ledger.Code(err))
		})
	}
}

// seq numbers the actions the tests make; atomic so a parallel test could
// share it.
var seq atomic.Int64

// act makes an action with a fresh id, so equal fingerprints never come from
// equal ids.
func act(tool, args string, state ledger.ActionState) *ledger.Action {
	return &ledger.Action{ID: ledger.ActionID(fmt.Sprintf("act_%03d", seq.Add(1))), RunID: "run_1", Tool: tool,
		ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(args), State: state}
}

// entry pairs a with a last attempt of the given status; "" for none.
func entry(a *ledger.Action, status ledger.AttemptStatus) budget.Entry {
	e := budget.Entry{Action: a}
	if status != "" {
		e.Attempt = &ledger.Attempt{ID: "att_" + ledger.AttemptID(a.ID), ActionID: a.ID, No: 1, Status: status}
	}
	return e
}

// distinct returns n actions with distinct fingerprints, in the given state
// and with last attempts of the given status.
func distinct(n int, state ledger.ActionState, status ledger.AttemptStatus) []budget.Entry {
	es := make([]budget.Entry, n)
	for i := range es {
		es[i] = entry(act("docs.search", fmt.Sprintf(`{"q":"distinct %d"}`, seq.Load()), state), status)
	}
	return es
}

func concat(parts ...[]budget.Entry) []budget.Entry {
	var out []budget.Entry
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func repeat(n int, tool, args string, state ledger.ActionState, status ledger.AttemptStatus) []budget.Entry {
	es := make([]budget.Entry, n)
	for i := range es {
		es[i] = entry(act(tool, args, state), status)
	}
	return es
}

const (
	send     = "mail.send"
	sendArgs = `{"to":"a@example.com","body":"hi"}`
)

func TestLoop(t *testing.T) {
	var (
		ok         = func(n int) []budget.Entry { return distinct(n, ledger.ActionSucceeded, ledger.AttemptSucceeded) }
		failed     = func(n int) []budget.Entry { return distinct(n, ledger.ActionFailed, ledger.AttemptFailed) }
		timedOut   = func(n int) []budget.Entry { return distinct(n, ledger.ActionFailed, ledger.AttemptTimedOut) }
		denied     = func(n int) []budget.Entry { return distinct(n, ledger.ActionDenied, "") }
		superseded = func(n int) []budget.Entry { return distinct(n, ledger.ActionSuperseded, "") }
	)
	tests := []struct {
		name      string
		policy    budget.Policy
		history   []budget.Entry
		tool      string // send when empty
		args      string // sendArgs when empty
		want      ledger.StopReason
		rationale string
	}{
		{name: "EmptyHistory"},
		{name: "Healthy", history: ok(5)},

		{name: "RepeatOneBelow", history: concat(ok(1), repeat(1, send, sendArgs, ledger.ActionSucceeded, ledger.AttemptSucceeded))},
		{name: "RepeatAtLimit", history: concat(repeat(1, send, sendArgs, ledger.ActionSucceeded, ledger.AttemptSucceeded), ok(3),
			repeat(1, send, `{"body":"hi", "to":"a@example.com"}`, ledger.ActionSucceeded, ledger.AttemptSucceeded)),
			want: ledger.StopRepeatedAction, rationale: "mail.send with the same arguments was already proposed 2 times (limit 2)"},
		{name: "RepeatCountsSuperseded", history: repeat(2, send, sendArgs, ledger.ActionSuperseded, ""),
			want: ledger.StopRepeatedAction, rationale: "already proposed 2 times"},
		{name: "RepeatCountsEveryState", history: concat(repeat(1, send, sendArgs, ledger.ActionDenied, ""),
			repeat(1, send, sendArgs, ledger.ActionAwaitingApproval, "")),
			want: ledger.StopRepeatedAction},
		{name: "RepeatOtherToolDoesNotCount", history: repeat(2, "mail.draft", sendArgs, ledger.ActionSucceeded, ledger.AttemptSucceeded)},
		{name: "RepeatOtherArgumentsDoNotCount", history: repeat(2, send, `{"to":"b@example.com","body":"hi"}`,
			ledger.ActionSucceeded, ledger.AttemptSucceeded)},
		{name: "RepeatLimitOne", policy: budget.Policy{RepeatLimit: 1},
			history: repeat(1, send, sendArgs, ledger.ActionSucceeded, ledger.AttemptSucceeded),
			want:    ledger.StopRepeatedAction, rationale: "already proposed 1 times (limit 1)"},
		{name: "RepeatLimitThreeOneBelow", policy: budget.Policy{RepeatLimit: 3},
			history: repeat(2, send, sendArgs, ledger.ActionSucceeded, ledger.AttemptSucceeded)},

		{name: "ErrorsOneBelow", history: concat(ok(2), failed(2))},
		{name: "ErrorsAtLimit", history: concat(ok(2), failed(1), timedOut(1), failed(1)),
			want: ledger.StopConsecutiveErrors, rationale: "the last 3 actions all failed (limit 3)"},
		{name: "ErrorsOnlyHistory", history: failed(3), want: ledger.StopConsecutiveErrors},
		{name: "ErrorsResetBySuccess", history: concat(failed(2), ok(1), failed(2))},
		{name: "ErrorsResetByDenied", history: concat(failed(2), denied(1), failed(2))},
		{name: "ErrorsResetByExpired", history: concat(failed(2), distinct(1, ledger.ActionExpired, ""), failed(2))},
		{name: "ErrorsResetByCancelled", history: concat(failed(2),
			distinct(1, ledger.ActionCancelled, ledger.AttemptCancelled), failed(2))},
		{name: "ErrorsResetByAbandoned", history: concat(failed(2),
			distinct(1, ledger.ActionAbandoned, ledger.AttemptTimedOut), failed(2))},
		// An uncertain action is recovery's, never an error, whatever its
		// last attempt said.
		{name: "ErrorsResetByUncertain", history: concat(failed(2),
			distinct(1, ledger.ActionUncertain, ledger.AttemptTimedOut), failed(2))},
		{name: "ErrorsResetByInReview", history: concat(failed(2),
			distinct(1, ledger.ActionNeedsReview, ledger.AttemptFailed), failed(2))},
		// A timed-out call whose effect recovery found to have happened is
		// a success: the action's state decides, not the attempt's status.
		{name: "ErrorsResetByReconciledTimeout", history: concat(failed(2),
			distinct(1, ledger.ActionSucceeded, ledger.AttemptTimedOut), failed(2))},
		{name: "ErrorsCountFailedAfterTimeout", history: concat(ok(1), timedOut(3)),
			want: ledger.StopConsecutiveErrors},
		{name: "ErrorsCountFailedWhateverTheAttempt", history: concat(ok(1), failed(2),
			distinct(1, ledger.ActionFailed, ledger.AttemptUncertain)), want: ledger.StopConsecutiveErrors},
		{name: "ErrorsSkipSuperseded", history: concat(ok(1), failed(1), superseded(2), failed(2)),
			want: ledger.StopConsecutiveErrors},
		{name: "ErrorsSupersededAloneIsNoStreak", history: concat(failed(2), superseded(3))},
		{name: "ErrorsAfterResetAtLimit", history: concat(failed(2), ok(1), failed(3)), want: ledger.StopConsecutiveErrors},
		{name: "ErrorsCustomLimit", policy: budget.Policy{ConsecutiveErrors: 5}, history: failed(4)},
		{name: "ErrorsCustomLimitReached", policy: budget.Policy{ConsecutiveErrors: 5}, history: failed(5),
			want: ledger.StopConsecutiveErrors, rationale: "last 5 actions"},

		{name: "NoProgressOneBelow", history: denied(9)},
		{name: "NoProgressAtWindow", history: denied(10),
			want: ledger.StopNoProgress, rationale: "none of the last 10 actions succeeded"},
		{name: "NoProgressWindowSlides", history: concat(ok(1), denied(10)), want: ledger.StopNoProgress},
		{name: "NoProgressSuccessInWindow", history: concat(denied(5), ok(1), denied(4))},
		{name: "NoProgressCountsAttemptSucceededOnlyByActionState",
			history: distinct(10, ledger.ActionNeedsReview, ledger.AttemptSucceeded), want: ledger.StopNoProgress},
		{name: "NoProgressCountsSuperseded", history: concat(failed(1), superseded(9)),
			want: ledger.StopNoProgress},
		{name: "NoProgressCountsEveryUnsuccessfulState", history: concat(failed(2), denied(2),
			distinct(2, ledger.ActionExpired, ""), distinct(2, ledger.ActionCancelled, ""), distinct(2, ledger.ActionAbandoned, "")),
			want: ledger.StopNoProgress},
		{name: "NoProgressCustomWindow", policy: budget.Policy{NoProgressWindow: 4}, history: concat(ok(3), denied(4)),
			want: ledger.StopNoProgress, rationale: "last 4 actions"},

		{name: "RepeatBeforeErrors", history: repeat(3, send, sendArgs, ledger.ActionFailed, ledger.AttemptFailed),
			want: ledger.StopRepeatedAction},
		{name: "ErrorsBeforeNoProgress", history: failed(10), want: ledger.StopConsecutiveErrors},
		{name: "NoProgressBeforeErrorsWhenWindowIsSmaller", policy: budget.Policy{NoProgressWindow: 2, ConsecutiveErrors: 4},
			history: failed(3), want: ledger.StopNoProgress, rationale: "none of the last 2 actions succeeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool, args := tt.tool, tt.args
			if tool == "" {
				tool = send
			}
			if args == "" {
				args = sendArgs
			}
			v, err := tt.policy.Loop(tt.history, tool, json.RawMessage(args))
			require.NoError(t, err)
			require.Equal(t, tt.want, v.Stop, v.Rationale)
			if tt.want == "" {
				require.False(t, v.Stopped())
				require.Empty(t, v.Rationale)
				return
			}
			require.Contains(t, v.Rationale, tt.rationale)
		})
	}
}

func TestLoopRationaleNamesActions(t *testing.T) {
	h := repeat(2, send, sendArgs, ledger.ActionSuperseded, "")
	v, err := budget.DefaultPolicy().Loop(h, send, json.RawMessage(sendArgs))
	require.NoError(t, err)
	require.Contains(t, v.Rationale, string(h[0].Action.ID)+", "+string(h[1].Action.ID))

	h = distinct(10, ledger.ActionDenied, "")
	v, err = budget.DefaultPolicy().Loop(h, send, json.RawMessage(sendArgs))
	require.NoError(t, err)
	require.Contains(t, v.Rationale, string(h[0].Action.ID)+" … "+string(h[9].Action.ID))

	// The errors are named oldest first; a superseded action between them
	// is not one of them.
	h = concat(distinct(1, ledger.ActionFailed, ledger.AttemptFailed), distinct(1, ledger.ActionSuperseded, ""),
		distinct(2, ledger.ActionFailed, ledger.AttemptFailed))
	v, err = budget.DefaultPolicy().Loop(h, send, json.RawMessage(sendArgs))
	require.NoError(t, err)
	require.Equal(t, ledger.StopConsecutiveErrors, v.Stop)
	require.Equal(t, "the last 3 actions all failed (limit 3): "+string(h[0].Action.ID)+", "+string(h[2].Action.ID)+", "+string(h[3].Action.ID),
		v.Rationale)
}

func TestLoopDefaultsForZeroPolicy(t *testing.T) {
	// The zero Policy must stop exactly where DefaultPolicy does.
	histories := map[string][]budget.Entry{
		"repeat2":      repeat(2, send, sendArgs, ledger.ActionSucceeded, ledger.AttemptSucceeded),
		"repeat1":      repeat(1, send, sendArgs, ledger.ActionSucceeded, ledger.AttemptSucceeded),
		"errors3":      distinct(3, ledger.ActionFailed, ledger.AttemptFailed),
		"errors2":      distinct(2, ledger.ActionFailed, ledger.AttemptFailed),
		"noProgress10": distinct(10, ledger.ActionDenied, ""),
		"noProgress9":  distinct(9, ledger.ActionDenied, ""),
	}
	for name, h := range histories {
		t.Run(name, func(t *testing.T) {
			want, err := budget.DefaultPolicy().Loop(h, send, json.RawMessage(sendArgs))
			require.NoError(t, err)
			got, err := budget.Policy{}.Loop(h, send, json.RawMessage(sendArgs))
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

func TestLoopErrors(t *testing.T) {
	good := distinct(2, ledger.ActionSucceeded, ledger.AttemptSucceeded)
	tests := []struct {
		name    string
		history []budget.Entry
		tool    string
		args    string
		msg     string
	}{
		{name: "ProposedArgumentsInvalid", history: good, tool: send, args: `{"to":`, msg: "loop: proposed action"},
		{name: "ProposedArgumentsEmpty", history: good, tool: send, args: ``, msg: "arguments are required"},
		{name: "ProposedToolEmpty", history: good, tool: "", args: `{}`, msg: "tool is required"},
		{name: "HistoryEntryWithoutAction", history: concat(good, []budget.Entry{{}}), tool: send, args: sendArgs,
			msg: "history entry 2 has no action"},
		{name: "HistoryArgumentsInvalid", history: concat(good, []budget.Entry{entry(
			&ledger.Action{ID: "act_bad", Tool: send, Arguments: json.RawMessage(`{"a":1,"a":2}`)}, "")}),
			tool: send, args: sendArgs, msg: "loop: action act_bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := budget.DefaultPolicy().Loop(tt.history, tt.tool, json.RawMessage(tt.args))
			require.Error(t, err)
			require.Equal(t, ledger.CodeInvalid, ledger.Code(err))
			require.Contains(t, err.Error(), tt.msg)
			require.Equal(t, budget.Verdict{}, v)
		})
	}
}

// TestLoopTakesGivenFingerprints: an entry that carries its fingerprint is
// not fingerprinted again (a caller that keeps the history from step to
// step takes each once), and gives the verdict its arguments would.
func TestLoopTakesGivenFingerprints(t *testing.T) {
	fp, err := budget.Fingerprint(send, json.RawMessage(sendArgs))
	require.NoError(t, err)
	h := repeat(2, send, sendArgs, ledger.ActionSucceeded, ledger.AttemptSucceeded)
	want, err := budget.DefaultPolicy().Loop(h, send, json.RawMessage(sendArgs))
	require.NoError(t, err)
	require.Equal(t, ledger.StopRepeatedAction, want.Stop)
	for i := range h {
		h[i].Fingerprint = fp
		// Arguments no fingerprint can be taken of: the given one is used.
		h[i].Action.Arguments = json.RawMessage(`{"a":1,"a":2}`)
	}
	got, err := budget.DefaultPolicy().Loop(h, send, json.RawMessage(sendArgs))
	require.NoError(t, err)
	require.Equal(t, want, got)
}
