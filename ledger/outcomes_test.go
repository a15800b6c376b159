package ledger_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// TestOutcomeTable enumerates every (effect class, status, fact) an attempt
// can close with against a list written here independently of the table:
// "" is a refusal.
func TestOutcomeTable(t *testing.T) {
	const (
		W, R                      = ledger.EffectWrite, ledger.EffectRead
		ok, failed, timeout, canc = ledger.AttemptSucceeded, ledger.AttemptFailed, ledger.AttemptTimedOut, ledger.AttemptCancelled
		unc                       = ledger.AttemptUncertain
		hap, not, unk             = ledger.EffectHappened, ledger.EffectNotHappened, ledger.EffectUnknown
		refused                   = ledger.ActionState("")
	)
	want := map[[3]string]ledger.ActionState{}
	row := func(e ledger.Effect, s ledger.AttemptStatus, f ledger.EffectFact, to ledger.ActionState) {
		want[[3]string{string(e), string(s), string(f)}] = to
	}
	// A write follows its effect.
	row(W, ok, hap, ledger.ActionSucceeded)
	row(W, ok, not, refused) // succeeded without taking effect
	row(W, ok, unk, refused)
	row(W, failed, hap, ledger.ActionNeedsReview)
	row(W, failed, not, ledger.ActionFailed)
	row(W, failed, unk, ledger.ActionUncertain)
	row(W, timeout, hap, refused) // a timeout cannot know
	row(W, timeout, not, refused)
	row(W, timeout, unk, ledger.ActionUncertain)
	row(W, canc, hap, ledger.ActionNeedsReview)
	row(W, canc, not, ledger.ActionCancelled)
	row(W, canc, unk, ledger.ActionUncertain)
	row(W, unc, hap, ledger.ActionSucceeded) // closed without an answer, effect established: reconciled
	row(W, unc, not, ledger.ActionUncertain) // recovery decides whether to try again
	row(W, unc, unk, ledger.ActionUncertain)
	// A read changes nothing: its status settles it.
	for _, f := range []ledger.EffectFact{not, unk} {
		row(R, ok, f, ledger.ActionSucceeded)
		row(R, failed, f, ledger.ActionFailed)
		row(R, timeout, f, ledger.ActionFailed)
		row(R, canc, f, ledger.ActionCancelled)
		row(R, unc, f, ledger.ActionUncertain)
	}
	for _, s := range []ledger.AttemptStatus{ok, failed, timeout, canc, unc} {
		row(R, s, hap, refused)
	}
	require.Len(t, want, 30)

	rows := ledger.OutcomeTable()
	require.Len(t, rows, len(want), "one row per combination")
	for _, r := range rows {
		name := fmt.Sprintf("%s/%s/%s", r.Effect, r.Status, r.Fact)
		exp, listed := want[[3]string{string(r.Effect), string(r.Status), string(r.Fact)}]
		require.True(t, listed, name)
		got, err := ledger.OutcomeOf(r.Effect, r.Status, r.Fact)
		if exp == refused {
			require.Error(t, err, name)
			require.True(t, errors.Is(err, ledger.ErrOutcomeNotAllowed), name)
			require.Equal(t, ledger.CodeInvalid, ledger.Code(err), name)
			require.NotEmpty(t, r.Refusal, name)
			require.Contains(t, err.Error(), r.Refusal, name)
			continue
		}
		require.NoError(t, err, name)
		require.Equal(t, exp, got, name)
		require.Equal(t, exp, r.Action, name)
		// Every state the table sends an action to is an edge from running.
		require.NoError(t, ledger.ValidateActionTransition(ledger.ActionRunning, got), name)
	}

	for _, bad := range [][3]string{{"write", "started", "unknown"}, {"write", "ok", "happened"}, {"write", "failed", "maybe"}, {"exec", "failed", "unknown"}} {
		_, err := ledger.OutcomeOf(ledger.Effect(bad[0]), ledger.AttemptStatus(bad[1]), ledger.EffectFact(bad[2]))
		require.ErrorIs(t, err, ledger.ErrOutcomeNotAllowed, "%v", bad)
	}
}

// TestOutcomeTableDocumented: docs/state-machines.md shows the table as the
// code has it (outcomeTableMarkdown), between its markers.
func TestOutcomeTableDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/state-machines.md")
	require.NoError(t, err)
	const begin, end = "<!-- outcome table: begin -->\n", "<!-- outcome table: end -->"
	text := string(doc)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	require.True(t, i >= 0 && j > i, "docs/state-machines.md lacks the outcome table's markers")
	want := outcomeTableMarkdown()
	require.Equal(t, want, text[i+len(begin):j],
		"docs/state-machines.md's outcome table differs from the code's: paste this between its markers:\n%s", want)
}

// outcomeTableMarkdown is ledger.OutcomeTable as docs/state-machines.md
// shows it: one line per effect class and status, the facts in columns.
func outcomeTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| tool | attempt status | effect `happened` | effect `not_happened` | effect `unknown` |\n")
	b.WriteString("|---|---|---|---|---|\n")
	rows := ledger.OutcomeTable()
	const facts = 3 // happened, not_happened, unknown: the table's order
	for i := 0; i < len(rows); i += facts {
		fmt.Fprintf(&b, "| %s | `%s` |", rows[i].Effect, rows[i].Status)
		for _, r := range rows[i : i+facts] {
			if r.Refusal != "" {
				fmt.Fprintf(&b, " refused: %s |", r.Refusal)
			} else {
				fmt.Fprintf(&b, " `%s` |", r.Action)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
