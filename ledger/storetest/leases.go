package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// tokenHash is a token as leases keep it: its SHA-256 in lowercase hex.
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// testAttemptLeases: the leases of attempts a client executes (the agent
// protocol's part of the Store). A begin is idempotent by key; a
// heartbeat renews the lease, with its token only, up to its maximum; a
// lease that lapsed is listed for recovery and renews no more; a decision
// told to the agent is kept, once, and listed until answered.
func testAttemptLeases(t *testing.T, h Harness) {
	ctx := context.Background()
	b := openStore(t, h)
	run := b.RunningRun(t, "leased", ledger.BudgetLimits{})
	action := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
	tok := tokenHash("the token")
	begin := ledger.BeginAttemptParams{ActionID: action.ID, Key: "begin-1", TokenSHA256: tok,
		Lease: 10 * time.Second, MaxDuration: 15 * time.Second, Actor: "my-agent"}

	first, err := b.Store.BeginAttempt(ctx, begin)
	require.NoError(t, err)
	require.False(t, first.Replayed)
	require.Equal(t, ledger.AttemptStarted, first.Attempt.Status)
	require.Equal(t, b.Clock.Now().UTC().Add(10*time.Second), first.Lease.Until)
	again, err := b.Store.BeginAttempt(ctx, begin)
	require.NoError(t, err)
	require.True(t, again.Replayed, "the same key: the same attempt")
	require.Equal(t, first.Attempt.ID, again.Attempt.ID)

	_, err = b.Store.RenewLease(ctx, ledger.RenewLeaseParams{AttemptID: first.Attempt.ID, TokenSHA256: tokenHash("another")})
	require.ErrorIs(t, err, ledger.ErrForbidden)
	b.Clock.Advance(8 * time.Second)
	renewed, err := b.Store.RenewLease(ctx, ledger.RenewLeaseParams{AttemptID: first.Attempt.ID, TokenSHA256: tok,
		Progress: json.RawMessage(`{"done":1}`)})
	require.NoError(t, err)
	require.Equal(t, first.Lease.MaxUntil, renewed.Until, "never past its maximum")
	got, err := b.Store.FindAttemptLease(ctx, first.Attempt.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, got.Heartbeats)
	require.JSONEq(t, `{"done":1}`, string(got.Progress))

	lapsed, err := b.Store.FindLapsedLeases(ctx, b.Clock.Now(), 0)
	require.NoError(t, err)
	require.Empty(t, lapsed)
	b.Clock.Advance(8 * time.Second)
	lapsed, err = b.Store.FindLapsedLeases(ctx, b.Clock.Now(), 0)
	require.NoError(t, err)
	require.Len(t, lapsed, 1)
	require.Equal(t, first.Attempt.ID, lapsed[0].AttemptID)
	_, err = b.Store.RenewLease(ctx, ledger.RenewLeaseParams{AttemptID: first.Attempt.ID, TokenSHA256: tok})
	require.ErrorIs(t, err, ledger.ErrConflict, "a lapsed lease renews no more")

	_, err = b.Store.FindAgentDecision(ctx, action.ID)
	require.ErrorIs(t, err, ledger.ErrNotFound, "nothing told yet")
	tell := ledger.RecordRecoveryParams{ActionID: action.ID, ActionState: ledger.ActionRunning, AttemptID: first.Attempt.ID,
		Steps:     []ledger.RecoveryStep{{Decision: &ledger.RecoveryDecision{Decision: "query", Rationale: "the lease lapsed"}}},
		TellAgent: &ledger.AgentDecision{DecisionID: "dec-1", Kind: "query"}, Actor: "recovery"}
	res, err := b.Store.RecordRecovery(ctx, tell)
	require.NoError(t, err)
	require.True(t, res.Told)
	require.Len(t, res.Decisions, 1)
	res, err = b.Store.RecordRecovery(ctx, tell)
	require.NoError(t, err)
	require.False(t, res.Told, "told already: nothing recorded")
	require.Empty(t, res.Decisions)

	told, err := b.Store.FindAgentDecision(ctx, action.ID)
	require.NoError(t, err)
	require.Equal(t, "dec-1", told.DecisionID)
	require.False(t, told.Answered)
	pending, err := b.Store.FindAgentDecisions(ctx, ledger.AgentDecisionFilter{DecidedBefore: b.Clock.Now()})
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, action.ID, pending[0].ActionID)
}
