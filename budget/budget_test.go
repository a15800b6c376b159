package budget_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/ledger"
)

var (
	t0       = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	deadline = t0.Add(time.Hour)
)

func newRun(l ledger.BudgetLimits, u ledger.BudgetUsage, dl *time.Time) *ledger.Run {
	return &ledger.Run{ID: "run_1", State: ledger.RunRunning,
		Budget: ledger.Budget{Limits: l, Used: u, Deadline: dl}}
}

func TestVerdictStopped(t *testing.T) {
	require.False(t, budget.Verdict{}.Stopped())
	require.True(t, budget.Verdict{Stop: ledger.StopMaxSteps}.Stopped())
}

func TestBeforeStep(t *testing.T) {
	tests := []struct {
		name      string
		limits    ledger.BudgetLimits
		used      ledger.BudgetUsage
		deadline  *time.Time
		now       time.Time
		want      ledger.StopReason
		rationale string // a substring of the rationale when stopped
	}{
		{name: "UnsetLimitsNeverStop", now: t0,
			used: ledger.BudgetUsage{Attempts: 1e6, Execution: 1e6 * time.Hour, Steps: 1e6, Tokens: 1e12, TokensUnavailable: true}},
		{name: "UnusedBudget", now: t0, deadline: &deadline,
			limits: ledger.BudgetLimits{MaxSteps: 5, MaxTokens: 100, MaxExecution: time.Minute}},

		{name: "StepsOneBelow", now: t0, limits: ledger.BudgetLimits{MaxSteps: 5}, used: ledger.BudgetUsage{Steps: 4}},
		{name: "StepsAtLimit", now: t0, limits: ledger.BudgetLimits{MaxSteps: 5}, used: ledger.BudgetUsage{Steps: 5},
			want: ledger.StopMaxSteps, rationale: "run run_1 used 5 of 5 steps"},
		{name: "StepsPastLimit", now: t0, limits: ledger.BudgetLimits{MaxSteps: 5}, used: ledger.BudgetUsage{Steps: 7},
			want: ledger.StopMaxSteps, rationale: "used 7 of 5 steps"},

		{name: "TokensOneBelow", now: t0, limits: ledger.BudgetLimits{MaxTokens: 100}, used: ledger.BudgetUsage{Tokens: 99}},
		{name: "TokensAtLimit", now: t0, limits: ledger.BudgetLimits{MaxTokens: 100}, used: ledger.BudgetUsage{Tokens: 100},
			want: ledger.StopTokenBudgetExceeded, rationale: "run run_1 used 100 of 100 tokens"},
		{name: "TokensUnavailableWithBudget", now: t0, limits: ledger.BudgetLimits{MaxTokens: 100},
			used: ledger.BudgetUsage{Tokens: 10, TokensUnavailable: true},
			want: ledger.StopTokenBudgetExceeded, rationale: "token accounting unavailable: a step reported no usage"},
		{name: "TokensUnavailableZeroCounted", now: t0, limits: ledger.BudgetLimits{MaxTokens: 100},
			used: ledger.BudgetUsage{TokensUnavailable: true},
			want: ledger.StopTokenBudgetExceeded, rationale: "token accounting unavailable"},
		{name: "TokensUnavailableWithoutBudget", now: t0, limits: ledger.BudgetLimits{MaxSteps: 5},
			used: ledger.BudgetUsage{Tokens: 10, TokensUnavailable: true}},
		{name: "TokensExceededAndUnavailable", now: t0, limits: ledger.BudgetLimits{MaxTokens: 100},
			used: ledger.BudgetUsage{Tokens: 150, TokensUnavailable: true},
			want: ledger.StopTokenBudgetExceeded, rationale: "used 150 of 100 tokens"},

		{name: "ExecutionOneBelow", now: t0, limits: ledger.BudgetLimits{MaxExecution: time.Minute},
			used: ledger.BudgetUsage{Execution: time.Minute - time.Microsecond}},
		{name: "ExecutionAtLimit", now: t0, limits: ledger.BudgetLimits{MaxExecution: time.Minute},
			used: ledger.BudgetUsage{Execution: time.Minute},
			want: ledger.StopMaxRuntime, rationale: "run run_1 used 1m0s of 1m0s execution time"},

		{name: "DeadlineOneMicrosecondBefore", deadline: &deadline, now: deadline.Add(-time.Microsecond)},
		{name: "DeadlineAtNow", deadline: &deadline, now: deadline,
			want: ledger.StopMaxRuntime, rationale: "passed its deadline 2026-03-01T13:00:00Z"},
		{name: "DeadlinePast", deadline: &deadline, now: deadline.Add(time.Second),
			want: ledger.StopMaxRuntime, rationale: "passed its deadline"},
		{name: "DeadlineInOtherZone", deadline: &deadline, now: deadline.In(time.FixedZone("X", 5*3600)),
			want: ledger.StopMaxRuntime, rationale: "passed its deadline"},

		{name: "StepsBeforeTokens", now: deadline, deadline: &deadline,
			limits: ledger.BudgetLimits{MaxSteps: 1, MaxTokens: 1}, used: ledger.BudgetUsage{Steps: 1, Tokens: 1},
			want: ledger.StopMaxSteps, rationale: "steps"},
		{name: "TokensBeforeRuntime", now: deadline, deadline: &deadline,
			limits: ledger.BudgetLimits{MaxTokens: 1}, used: ledger.BudgetUsage{Tokens: 1},
			want: ledger.StopTokenBudgetExceeded, rationale: "tokens"},
		{name: "AttemptBudgetsIgnored", now: t0,
			limits: ledger.BudgetLimits{MaxAttemptsPerRun: 1}, used: ledger.BudgetUsage{Attempts: 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := budget.DefaultPolicy().BeforeStep(newRun(tt.limits, tt.used, tt.deadline), tt.now)
			require.Equal(t, tt.want, v.Stop, v.Rationale)
			require.Equal(t, tt.want != "", v.Stopped())
			if tt.want == "" {
				require.Empty(t, v.Rationale)
				return
			}
			require.Contains(t, v.Rationale, tt.rationale)
		})
	}
}

func TestBeforeStepNilRun(t *testing.T) {
	v := budget.Policy{}.BeforeStep(nil, t0)
	require.Equal(t, ledger.StopInternalError, v.Stop)
	require.Contains(t, v.Rationale, "no run")
}

func TestBeforeAttempt(t *testing.T) {
	tests := []struct {
		name      string
		limits    ledger.BudgetLimits
		used      ledger.BudgetUsage
		attempts  int64 // of the action
		deadline  *time.Time
		now       time.Time
		want      ledger.StopReason
		rationale string
	}{
		{name: "UnsetLimitsNeverStop", now: t0, attempts: 1e6,
			used: ledger.BudgetUsage{Attempts: 1e6, Execution: 1e6 * time.Hour}},
		{name: "FirstAttempt", now: t0, deadline: &deadline,
			limits: ledger.BudgetLimits{MaxAttemptsPerAction: 1, MaxAttemptsPerRun: 1, MaxExecution: time.Minute}},

		{name: "ActionOneBelow", now: t0, limits: ledger.BudgetLimits{MaxAttemptsPerAction: 3}, attempts: 2,
			used: ledger.BudgetUsage{Attempts: 2}},
		{name: "ActionAtLimit", now: t0, limits: ledger.BudgetLimits{MaxAttemptsPerAction: 3}, attempts: 3,
			used: ledger.BudgetUsage{Attempts: 3},
			want: ledger.StopRetryBudgetExhausted, rationale: "action act_1 used 3 of 3 attempts"},

		{name: "RunOneBelow", now: t0, limits: ledger.BudgetLimits{MaxAttemptsPerRun: 10}, attempts: 1,
			used: ledger.BudgetUsage{Attempts: 9}},
		{name: "RunAtLimit", now: t0, limits: ledger.BudgetLimits{MaxAttemptsPerRun: 10}, attempts: 1,
			used: ledger.BudgetUsage{Attempts: 10},
			want: ledger.StopRetryBudgetExhausted, rationale: "run run_1 used 10 of 10 attempts"},
		{name: "ActionBeforeRun", now: t0, limits: ledger.BudgetLimits{MaxAttemptsPerAction: 2, MaxAttemptsPerRun: 2},
			attempts: 2, used: ledger.BudgetUsage{Attempts: 2},
			want: ledger.StopRetryBudgetExhausted, rationale: "action act_1 used 2 of 2 attempts"},

		{name: "ExecutionOneBelow", now: t0, limits: ledger.BudgetLimits{MaxExecution: time.Minute},
			used: ledger.BudgetUsage{Execution: time.Minute - time.Microsecond}},
		{name: "ExecutionAtLimit", now: t0, limits: ledger.BudgetLimits{MaxExecution: time.Minute},
			used: ledger.BudgetUsage{Execution: time.Minute},
			want: ledger.StopMaxRuntime, rationale: "used 1m0s of 1m0s execution time"},

		{name: "DeadlineOneMicrosecondBefore", deadline: &deadline, now: deadline.Add(-time.Microsecond)},
		{name: "DeadlineAtNow", deadline: &deadline, now: deadline,
			want: ledger.StopMaxRuntime, rationale: "passed its deadline 2026-03-01T13:00:00Z"},

		{name: "RetryBudgetBeforeRuntime", deadline: &deadline, now: deadline,
			limits: ledger.BudgetLimits{MaxAttemptsPerRun: 1}, used: ledger.BudgetUsage{Attempts: 1},
			want: ledger.StopRetryBudgetExhausted, rationale: "run run_1 used 1 of 1 attempts"},
		{name: "StepAndTokenBudgetsIgnored", now: t0,
			limits: ledger.BudgetLimits{MaxSteps: 1, MaxTokens: 1},
			used:   ledger.BudgetUsage{Steps: 3, Tokens: 3, TokensUnavailable: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			action := &ledger.Action{ID: "act_1", RunID: "run_1", AttemptCount: tt.attempts}
			v := budget.DefaultPolicy().BeforeAttempt(newRun(tt.limits, tt.used, tt.deadline), action, tt.now)
			require.Equal(t, tt.want, v.Stop, v.Rationale)
			if tt.want == "" {
				require.False(t, v.Stopped())
				return
			}
			require.Contains(t, v.Rationale, tt.rationale)
		})
	}
}

func TestBeforeAttemptNil(t *testing.T) {
	run := newRun(ledger.BudgetLimits{}, ledger.BudgetUsage{}, nil)
	v := budget.Policy{}.BeforeAttempt(nil, &ledger.Action{ID: "act_1"}, t0)
	require.Equal(t, ledger.StopInternalError, v.Stop)
	v = budget.Policy{}.BeforeAttempt(run, nil, t0)
	require.Equal(t, ledger.StopInternalError, v.Stop)
	require.Contains(t, v.Rationale, "no action")
}

func TestPolicyDefaults(t *testing.T) {
	def := budget.DefaultPolicy()
	require.Equal(t, budget.Policy{RepeatLimit: 2, NoProgressWindow: 10, ConsecutiveErrors: 3}, def)

	tests := []struct {
		name string
		in   budget.Policy
		want budget.Policy
	}{
		{name: "Zero", in: budget.Policy{}, want: def},
		{name: "Negative", in: budget.Policy{RepeatLimit: -1, NoProgressWindow: -5, ConsecutiveErrors: -3}, want: def},
		{name: "PartlySet", in: budget.Policy{NoProgressWindow: 4},
			want: budget.Policy{RepeatLimit: 2, NoProgressWindow: 4, ConsecutiveErrors: 3}},
		{name: "AllSet", in: budget.Policy{RepeatLimit: 1, NoProgressWindow: 2, ConsecutiveErrors: 5},
			want: budget.Policy{RepeatLimit: 1, NoProgressWindow: 2, ConsecutiveErrors: 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.in.WithDefaults())
		})
	}
}

func TestPolicyJSON(t *testing.T) {
	p := budget.Policy{RepeatLimit: 5, NoProgressWindow: 7, ConsecutiveErrors: 2}
	data, err := json.Marshal(p)
	require.NoError(t, err)
	require.JSONEq(t, `{"repeat_limit":5,"no_progress_window":7,"consecutive_errors":2}`, string(data))
	var back budget.Policy
	require.NoError(t, json.Unmarshal(data, &back))
	require.Equal(t, p, back)

	data, err = json.Marshal(budget.Policy{})
	require.NoError(t, err)
	require.JSONEq(t, `{}`, string(data), "an unset threshold is absent: the engine's or the default applies")
}
