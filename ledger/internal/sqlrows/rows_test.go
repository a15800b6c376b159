package sqlrows_test

import (
	"reflect"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// TestColumnListsMatchTheirTargets holds each column list to its Scan
// targets: as many, the same names in the same order (a field's name is
// its column's, in CamelCase).
func TestColumnListsMatchTheirTargets(t *testing.T) {
	var (
		run          sqlrows.Run
		budget       sqlrows.Budget
		action       sqlrows.Action
		attempt      sqlrows.Attempt
		joined       sqlrows.JoinedAttempt
		approval     sqlrows.Approval
		cancellation sqlrows.Cancellation
		observation  sqlrows.Observation
		lease        sqlrows.Lease
		decision     sqlrows.Decision
		signature    sqlrows.Signature
		runLease     sqlrows.RunLease
	)
	for name, c := range map[string]struct {
		cols    string
		targets []any
	}{
		"run":          {sqlrows.RunCols, run.Targets()},
		"run content":  {sqlrows.RunContentCols, run.ContentTargets()},
		"budget":       {sqlrows.BudgetCols, budget.Targets()},
		"run budget":   {sqlrows.RunBudgetCols, sqlrows.RunBudgetTargets(&run, &budget)},
		"action":       {sqlrows.ActionCols, action.Targets()},
		"attempt":      {sqlrows.AttemptCols, attempt.Targets()},
		"joined":       {sqlrows.JoinedAttemptCols, joined.Targets()},
		"approval":     {sqlrows.ApprovalCols, approval.Targets()},
		"cancellation": {sqlrows.CancellationCols, cancellation.Targets()},
		"observation":  {sqlrows.ObservationCols, observation.Targets()},
		"lease":        {sqlrows.LeaseCols, lease.Targets()},
		"decision":     {sqlrows.DecisionCols, decision.Targets()},
		"signature":    {sqlrows.SignatureCols, signature.Targets()},
		"run lease":    {sqlrows.RunLeaseCols, runLease.Targets()},
	} {
		t.Run(name, func(t *testing.T) {
			cols := columns(c.cols)
			require.Len(t, c.targets, len(cols), "%s: %d columns, %d targets", name, len(cols), len(c.targets))
		})
	}
	// Where a list holds a row's every column, it follows the row's
	// fields, named alike, and so do the targets.
	row(t, &run, sqlrows.RunCols, run.Targets())
	row(t, &budget, sqlrows.BudgetCols, budget.Targets())
	row(t, &action, sqlrows.ActionCols, action.Targets())
	row(t, &attempt, sqlrows.AttemptCols, attempt.Targets())
	row(t, &approval, sqlrows.ApprovalCols, approval.Targets())
	row(t, &cancellation, sqlrows.CancellationCols, cancellation.Targets())
	row(t, &observation, sqlrows.ObservationCols, observation.Targets())
	row(t, &lease, sqlrows.LeaseCols, lease.Targets())
	row(t, &decision, sqlrows.DecisionCols, decision.Targets())
	row(t, &signature, sqlrows.SignatureCols, signature.Targets())
}

// row checks that cols are the snake_case names of the fields of *ptr, in
// order, and targets the fields' addresses.
func row(t *testing.T, ptr any, cols string, targets []any) {
	t.Helper()
	v := reflect.ValueOf(ptr).Elem()
	var names []string
	for i := range v.NumField() {
		names = append(names, snake(v.Type().Field(i).Name))
		// The same pointer, not one to an equal value.
		require.True(t, v.Field(i).Addr().Interface() == targets[i], "%s: target %d is not %s", v.Type().Name(), i, v.Type().Field(i).Name)
	}
	require.Equal(t, columns(cols), names, v.Type().Name())
}

// columns splits a column list at its commas outside parentheses.
func columns(cols string) []string {
	var (
		out   []string
		depth int
		start int
	)
	for i, r := range cols {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(cols[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(cols[start:]))
}

// snake is a field's name as its column's: RunID run_id, TokenSHA256
// token_sha256.
func snake(name string) string {
	var b strings.Builder
	rs := []rune(name)
	for i, r := range rs {
		if unicode.IsUpper(r) && i > 0 && (unicode.IsLower(rs[i-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1]))) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}
