package postgres_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// Guarded moves change the row only from the state named, and say so.

func TestMoveRun(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	at := t0.Add(time.Second)
	f.write(t, func(tx ledger.Tx) error {
		run, moved, err := tx.MoveRun(ctx, "run_1", ledger.RunQueued, ledger.RunRunning, "", at)
		require.NoError(t, err)
		require.True(t, moved)
		want := newRun("run_1")
		want.State, want.Version, want.UpdatedAt, want.Budget = ledger.RunRunning, 2, at, ledger.Budget{}
		require.Equal(t, want, run, "the run after the move, without its budget")

		run, moved, err = tx.MoveRun(ctx, "run_1", ledger.RunQueued, ledger.RunFailed, "tool_error", at)
		require.NoError(t, err)
		require.False(t, moved, "not queued any more")
		require.Nil(t, run)
		_, moved, err = tx.MoveRun(ctx, "run_none", ledger.RunQueued, ledger.RunRunning, "", at)
		require.NoError(t, err)
		require.False(t, moved)

		run, moved, err = tx.MoveRun(ctx, "run_1", ledger.RunRunning, ledger.RunFailed, "tool_error", at)
		require.NoError(t, err)
		require.True(t, moved)
		require.Equal(t, ledger.StopReason("tool_error"), run.StopReason)
		require.Equal(t, int64(3), run.Version)
		return nil
	})
	got, err := f.d.Reader().GetRun(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, ledger.RunFailed, got.State)
}

func TestBudgetWrites(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	f.write(t, func(tx ledger.Tx) error {
		b, ok, err := tx.AddUsage(ctx, "run_1", ledger.BudgetUsage{Steps: 1, Tokens: 50, Execution: time.Millisecond})
		require.NoError(t, err)
		require.True(t, ok)
		want := newRun("run_1").Budget
		want.Used.Steps, want.Used.Tokens, want.Used.Execution = 3, 350, 2500*time.Microsecond
		require.Equal(t, &want, b, "the budget after it, deadline both ways")

		_, ok, err = tx.AddUsage(ctx, "run_1", ledger.BudgetUsage{Tokens: math.MaxInt64 - 349})
		require.NoError(t, err)
		require.False(t, ok, "the sum would pass MaxInt64")
		_, ok, err = tx.AddUsage(ctx, "run_none", ledger.BudgetUsage{Steps: 1})
		require.NoError(t, err)
		require.False(t, ok, "no budget")
		b, ok, err = tx.AddUsage(ctx, "run_1", ledger.BudgetUsage{Tokens: math.MaxInt64 - 350})
		require.NoError(t, err)
		require.True(t, ok, "up to MaxInt64 exactly")
		require.Equal(t, int64(math.MaxInt64), b.Used.Tokens)

		require.NoError(t, tx.CountAttempt(ctx, "run_1"))
		requireCode(t, ledger.CodeNotFound, tx.CountAttempt(ctx, "run_none"))
		return nil
	})
	f.write(t, func(tx ledger.Tx) error {
		b, err := tx.SpendExecution(ctx, "run_1", 3*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, 5500*time.Microsecond, b.Used.Execution)
		require.Equal(t, int64(2), b.Used.Attempts)
		require.Equal(t, time.Hour, b.Limits.DeadlineAfter)
		_, err = tx.SpendExecution(ctx, "run_none", time.Millisecond)
		requireCode(t, ledger.CodeNotFound, err)
		return nil
	})
	var version int64
	require.NoError(t, f.raw.QueryRow(`SELECT version FROM budgets WHERE run_id = 'run_1'`).Scan(&version))
	require.Equal(t, int64(5), version, "each write raised the budget's version")
}

func TestMoveAction(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	at := t0.Add(time.Second)
	f.write(t, func(tx ledger.Tx) error {
		a, moved, err := tx.MoveAction(ctx, "act_1", ledger.ActionProposed, ledger.ActionApproved, 0, at)
		require.NoError(t, err)
		require.True(t, moved)
		require.Equal(t, ledger.ActionApproved, a.State)
		require.Equal(t, int64(2), a.Version)
		require.Equal(t, at, a.UpdatedAt)
		require.Zero(t, a.AttemptCount)

		a, moved, err = tx.MoveAction(ctx, "act_1", ledger.ActionApproved, ledger.ActionRunning, 4, at)
		require.NoError(t, err)
		require.True(t, moved)
		require.Equal(t, int64(4), a.AttemptCount, "raised to the count given")
		a, moved, err = tx.MoveAction(ctx, "act_1", ledger.ActionRunning, ledger.ActionFailed, 1, at)
		require.NoError(t, err)
		require.True(t, moved)
		require.Equal(t, int64(4), a.AttemptCount, "never lowered")

		a, moved, err = tx.MoveAction(ctx, "act_1", ledger.ActionRunning, ledger.ActionSucceeded, 0, at)
		require.NoError(t, err)
		require.False(t, moved)
		require.Nil(t, a)
		return nil
	})
}

func TestAttemptMoves(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	end := t0.Add(time.Minute)
	f.write(t, func(tx ledger.Tx) error {
		return tx.InsertObservation(ctx, &ledger.Observation{ID: "obs_1", RunID: "run_1", ActionID: "act_1", AttemptID: "att_1",
			Source: ledger.ObservedResult, Effect: ledger.EffectHappened, ObservedAt: t0})
	})
	f.write(t, func(tx ledger.Tx) error {
		a := newAttempt("att_1", "act_1", "run_1", 1)
		a.Status, a.Result, a.FinishedAt = ledger.AttemptSucceeded, []byte(`{"id":9}`), &end
		a.Error = &ledger.AttemptError{Code: "c", Message: "m"}
		done, err := tx.FinishAttempt(ctx, a)
		require.NoError(t, err)
		require.True(t, done)
		a.Status = ledger.AttemptFailed
		done, err = tx.FinishAttempt(ctx, a)
		require.NoError(t, err)
		require.False(t, done, "finished already")

		set, err := tx.SetAttemptEffect(ctx, "att_1", ledger.EffectHappened, "obs_1")
		require.NoError(t, err)
		require.True(t, set)
		set, err = tx.SetAttemptEffect(ctx, "att_1", ledger.EffectNotHappened, "obs_1")
		require.NoError(t, err)
		require.False(t, set, "the effect is known already")
		return nil
	})
	got, err := f.d.Reader().GetAttempt(ctx, "att_1")
	require.NoError(t, err)
	require.Equal(t, ledger.AttemptSucceeded, got.Status)
	require.Equal(t, ledger.EffectHappened, got.Effect)
	require.Equal(t, ledger.ObservationID("obs_1"), got.EffectObservation)
	require.Equal(t, `{"id":9}`, string(got.Result))
	require.Equal(t, &ledger.AttemptError{Code: "c", Message: "m"}, got.Error)
	require.Equal(t, &end, got.FinishedAt)
	require.Equal(t, int64(3), got.Version)
}

func TestMoveApproval(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	apr := &ledger.Approval{ID: "apr_1", ActionID: "act_1", RunID: "run_1", Tenant: "acme", ActionDigest: digest("act_1"),
		State: ledger.ApprovalPending, Version: 1, RequestedAt: t0}
	apr2 := *apr
	apr2.ID, apr2.State, apr2.DecidedAt, apr2.DecidedBy = "apr_2", ledger.ApprovalGranted, &t0, "dave"
	at := t0.Add(time.Second)
	f.write(t, func(tx ledger.Tx) error {
		require.NoError(t, tx.InsertApproval(ctx, apr))
		require.NoError(t, tx.InsertApproval(ctx, &apr2))
		got, moved, err := tx.MoveApproval(ctx, "apr_1", ledger.ApprovalPending, ledger.ApprovalGranted, at, "looks fine", "carol", nil)
		require.NoError(t, err)
		require.True(t, moved)
		require.Equal(t, "carol", got.DecidedBy)
		require.Equal(t, "looks fine", got.Reason)
		require.Equal(t, &at, got.DecidedAt)
		require.Equal(t, int64(2), got.Version)

		_, moved, err = tx.MoveApproval(ctx, "apr_1", ledger.ApprovalPending, ledger.ApprovalDenied, at, "", "eve", nil)
		require.NoError(t, err)
		require.False(t, moved)

		// No decider given: the one recorded stays; no reason is NULL.
		got, moved, err = tx.MoveApproval(ctx, "apr_2", ledger.ApprovalGranted, ledger.ApprovalInvalidated, at, "", "", nil)
		require.NoError(t, err)
		require.True(t, moved)
		require.Equal(t, "dave", got.DecidedBy)
		require.Empty(t, got.Reason)
		return nil
	})
	var reason *string
	require.NoError(t, f.raw.QueryRow(`SELECT reason FROM approvals WHERE id = 'apr_2'`).Scan(&reason))
	require.Nil(t, reason)
}

func TestMoveCancellation(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	times := map[ledger.CancellationState]time.Time{}
	f.write(t, func(tx ledger.Tx) error {
		require.NoError(t, tx.InsertCancellation(ctx, &ledger.Cancellation{ID: "cnc_1", RunID: "run_1", Tenant: "acme",
			State: ledger.CancelRequested, RequestedBy: "alice", Version: 1, RequestedAt: t0}))
		from := ledger.CancelRequested
		for i, to := range []ledger.CancellationState{ledger.CancelAccepted, ledger.CancelStopping, ledger.CancelStopped} {
			at := t0.Add(time.Duration(i+1) * time.Second)
			times[to] = at
			moved, err := tx.MoveCancellation(ctx, "run_1", from, to, at)
			require.NoError(t, err)
			require.True(t, moved, "%s → %s", from, to)
			moved, err = tx.MoveCancellation(ctx, "run_1", from, to, at)
			require.NoError(t, err)
			require.False(t, moved, "again from %s", from)
			from = to
		}
		_, err := tx.MoveCancellation(ctx, "run_1", ledger.CancelStopped, ledger.CancelRequested, t0)
		requireCode(t, ledger.CodeInvalid, err)
		return nil
	})
	c, err := f.d.Reader().GetCancellation(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, ledger.CancelStopped, c.State)
	require.Equal(t, int64(4), c.Version)
	require.Equal(t, times[ledger.CancelAccepted], *c.AcceptedAt)
	require.Equal(t, times[ledger.CancelStopping], *c.StoppingAt)
	require.Equal(t, times[ledger.CancelStopped], *c.StoppedAt)
	require.Nil(t, c.TooLateAt)

	// too_late records its own time (and the CHECK wants it).
	r2 := newRun("run_2")
	r2.IdempotencyKey = "k2"
	f.write(t, func(tx ledger.Tx) error {
		require.NoError(t, tx.InsertRun(ctx, r2))
		require.NoError(t, tx.InsertCancellation(ctx, &ledger.Cancellation{ID: "cnc_2", RunID: "run_2", Tenant: "acme",
			State: ledger.CancelAccepted, RequestedBy: "alice", Version: 1, RequestedAt: t0}))
		moved, err := tx.MoveCancellation(ctx, "run_2", ledger.CancelAccepted, ledger.CancelTooLate, t0)
		require.NoError(t, err)
		require.True(t, moved)
		return nil
	})
	c, err = f.d.Reader().GetCancellation(ctx, "run_2")
	require.NoError(t, err)
	require.Equal(t, &t0, c.TooLateAt)
}

func TestAnswerAgentDecisionAndChainHead(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	f.write(t, func(tx ledger.Tx) error {
		require.NoError(t, tx.PutAgentDecision(ctx, &ledger.AgentDecision{ActionID: "act_1", DecisionID: "dec_1", Kind: "query", DecidedAt: t0}))
		ok, err := tx.AnswerAgentDecision(ctx, "act_1", "dec_0")
		require.NoError(t, err)
		require.False(t, ok, "not the current decision")
		ok, err = tx.AnswerAgentDecision(ctx, "act_1", "dec_1")
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = tx.AnswerAgentDecision(ctx, "act_1", "dec_1")
		require.NoError(t, err)
		require.False(t, ok, "answered already")

		ok, err = tx.MoveChainHead(ctx, "run_1", 0, 1, "sha256:one")
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = tx.MoveChainHead(ctx, "run_1", 0, 1, "sha256:fork")
		require.NoError(t, err)
		require.False(t, ok, "the head moved")
		seq, hash, err := tx.ChainHead(ctx, "run_1")
		require.NoError(t, err)
		require.Equal(t, int64(1), seq)
		require.Equal(t, "sha256:one", hash)
		return nil
	})
	d, err := f.d.Reader().GetAgentDecision(ctx, "act_1")
	require.NoError(t, err)
	require.True(t, d.Answered)
}

func TestTxReadsItsOwnWrites(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.write(t, func(tx ledger.Tx) error {
		require.NoError(t, tx.InsertRun(ctx, newRun("run_1")))
		got, err := tx.GetRun(ctx, "run_1")
		require.NoError(t, err)
		require.Equal(t, newRun("run_1"), got)
		// Not committed yet: the pool does not see it.
		_, err = f.d.Reader().GetRun(ctx, "run_1")
		requireCode(t, ledger.CodeNotFound, err)
		return nil
	})
}
