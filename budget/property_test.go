package budget_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/ledger"
)

// TestLoopDistinctSuccessesNeverStop: a history of distinct actions that all
// succeeded, shorter than the no-progress window, never stops, whatever the
// thresholds and whether the proposal is new or repeats one action once
// (which only a RepeatLimit of 1 refuses).
func TestLoopDistinctSuccessesNeverStop(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := budget.Policy{
			RepeatLimit:       rapid.IntRange(-1, 5).Draw(t, "repeat_limit"),
			NoProgressWindow:  rapid.IntRange(-1, 30).Draw(t, "no_progress_window"),
			ConsecutiveErrors: rapid.IntRange(-1, 5).Draw(t, "consecutive_errors"),
		}
		eff := p.WithDefaults()
		n := rapid.IntRange(0, eff.NoProgressWindow-1).Draw(t, "history_len")
		tools := []string{"docs.search", "cards.write", "mail.send", "payments.refund"}

		history := make([]budget.Entry, n)
		for i := range history {
			tool := rapid.SampledFrom(tools).Draw(t, "tool")
			extra := rapid.MapOf(rapid.StringMatching(`[a-z]{1,6}`), rapid.Int()).Draw(t, "extra")
			extra["seq"] = i // keeps every action distinct
			args, err := json.Marshal(extra)
			if err != nil {
				t.Fatal(err)
			}
			a := &ledger.Action{ID: ledger.ActionID(fmt.Sprintf("act_%d", i)), Tool: tool, Arguments: args,
				State: ledger.ActionSucceeded, AttemptCount: 1}
			history[i] = budget.Entry{Action: a, Attempt: &ledger.Attempt{ActionID: a.ID, No: 1, Status: ledger.AttemptSucceeded}}
		}

		tool, args := "docs.search", json.RawMessage(`{"seq":-1}`)
		if n > 0 && eff.RepeatLimit > 1 && rapid.Bool().Draw(t, "propose_repeat") {
			a := history[rapid.IntRange(0, n-1).Draw(t, "repeat_of")].Action
			tool, args = a.Tool, a.Arguments
		}

		v, err := p.Loop(history, tool, args)
		if err != nil {
			t.Fatalf("loop: %v", err)
		}
		if v.Stopped() {
			t.Fatalf("stopped a healthy history of %d under %+v: %s: %s", n, eff, v.Stop, v.Rationale)
		}
	})
}

// TestFingerprintIgnoresLayout: re-encoding the same object with its keys in
// another order and other whitespace never changes its fingerprint.
func TestFingerprintIgnoresLayout(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		obj := rapid.MapOfN(rapid.StringMatching(`[a-zA-Z0-9_]{1,8}`),
			rapid.OneOf(rapid.Map(rapid.Int(), func(i int) any { return i }),
				rapid.Map(rapid.String(), func(s string) any { return s }),
				rapid.Map(rapid.Bool(), func(b bool) any { return b })), 0, 8).Draw(t, "arguments")
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		encode := func(order []int, space string) json.RawMessage {
			parts := make([]string, len(order))
			for i, j := range order {
				k, _ := json.Marshal(keys[j])
				v, _ := json.Marshal(obj[keys[j]])
				parts[i] = string(k) + space + ":" + space + string(v)
			}
			return json.RawMessage("{" + space + strings.Join(parts, space+","+space) + space + "}")
		}
		identity := make([]int, len(keys))
		for i := range identity {
			identity[i] = i
		}
		shuffled := rapid.Permutation(identity).Draw(t, "order")
		space := rapid.SampledFrom([]string{"", " ", "\n", "\t ", "\r\n  "}).Draw(t, "space")

		a, err := budget.Fingerprint("tool", encode(identity, ""))
		if err != nil {
			t.Fatal(err)
		}
		b, err := budget.Fingerprint("tool", encode(shuffled, space))
		if err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Fatalf("fingerprints differ: %s vs %s", a, b)
		}
	})
}
