package ledger_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// legal lists every legal edge as "from>to", written out here independently
// of the tables in states.go so that a change to either shows up.
func legal(edges ...string) map[string]bool {
	m := map[string]bool{}
	for _, e := range edges {
		m[e] = true
	}
	return m
}

// checkAllPairs runs validate on every (from, to) pair of states and wants
// success exactly for the legal edges.
func checkAllPairs[S ~string](t *testing.T, states []S, want map[string]bool, validate func(from, to S) error) {
	t.Helper()
	seen := 0
	for _, from := range states {
		for _, to := range states {
			edge := fmt.Sprintf("%s>%s", from, to)
			t.Run(edge, func(t *testing.T) {
				err := validate(from, to)
				if want[edge] {
					require.NoError(t, err)
					seen++
					return
				}
				require.ErrorIs(t, err, ledger.ErrInvalid)
				require.Contains(t, err.Error(), "illegal")
			})
		}
	}
	require.Equal(t, len(want), seen, "every listed edge is legal")
	// Unknown states are refused, never silently allowed.
	require.ErrorIs(t, validate(states[0], S("bogus")), ledger.ErrInvalid)
	require.ErrorIs(t, validate(S("bogus"), states[0]), ledger.ErrInvalid)
}

func TestRunTransitions(t *testing.T) {
	want := legal(
		"queued>running", "queued>stopping", "queued>stopped", "queued>failed",
		"running>awaiting_approval", "running>needs_review", "running>stopping",
		"running>completed", "running>stopped", "running>failed",
		"awaiting_approval>running", "awaiting_approval>stopping", "awaiting_approval>stopped", "awaiting_approval>failed",
		"needs_review>running", "needs_review>stopping", "needs_review>stopped", "needs_review>failed",
		"stopping>stopped", "stopping>failed",
	)
	// The run validator also needs the right stop reason for terminal
	// targets; give it one so this test is about the edges alone.
	reasonFor := map[ledger.RunState]ledger.StopReason{
		ledger.RunCompleted: ledger.StopCompleted, ledger.RunStopped: ledger.StopUserCancelled, ledger.RunFailed: ledger.StopInternalError,
	}
	checkAllPairs(t, ledger.RunStates(), want, func(from, to ledger.RunState) error {
		return ledger.ValidateRunTransition(from, to, reasonFor[to])
	})
}

func TestRunStopReasons(t *testing.T) {
	for _, r := range ledger.StopReasons() {
		for _, to := range []ledger.RunState{ledger.RunCompleted, ledger.RunStopped, ledger.RunFailed} {
			t.Run(string(r)+">"+string(to), func(t *testing.T) {
				err := ledger.ValidateRunTransition(ledger.RunRunning, to, r)
				if r.TerminalState() == to {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, ledger.ErrInvalid)
				}
			})
		}
	}
	t.Run("terminal needs a reason", func(t *testing.T) {
		require.ErrorIs(t, ledger.ValidateRunTransition(ledger.RunRunning, ledger.RunStopped, ""), ledger.ErrInvalid)
	})
	t.Run("non-terminal takes none", func(t *testing.T) {
		require.ErrorIs(t, ledger.ValidateRunTransition(ledger.RunQueued, ledger.RunRunning, ledger.StopCompleted), ledger.ErrInvalid)
	})
	t.Run("unknown reason", func(t *testing.T) {
		require.ErrorIs(t, ledger.ValidateRunTransition(ledger.RunRunning, ledger.RunStopped, "bored"), ledger.ErrInvalid)
	})
	t.Run("serialized lowercase and mapped", func(t *testing.T) {
		for _, r := range ledger.StopReasons() {
			require.Equal(t, strings.ToLower(string(r)), string(r))
			require.True(t, r.TerminalState().Terminal())
		}
		require.Equal(t, ledger.RunCompleted, ledger.StopCompleted.TerminalState())
		require.Equal(t, ledger.RunFailed, ledger.StopToolError.TerminalState())
		require.Equal(t, ledger.RunStopped, ledger.StopApprovalDenied.TerminalState())
	})
}

func TestActionTransitions(t *testing.T) {
	want := legal(
		"proposed>approved", "proposed>awaiting_approval", "proposed>denied", "proposed>cancelled", "proposed>superseded",
		"awaiting_approval>approved", "awaiting_approval>denied", "awaiting_approval>expired",
		"awaiting_approval>cancelled", "awaiting_approval>superseded",
		"approved>running", "approved>cancelled", "approved>superseded", "approved>succeeded", "approved>needs_review", "approved>awaiting_approval",
		"running>succeeded", "running>failed", "running>uncertain", "running>needs_review", "running>cancelled",
		"uncertain>succeeded", "uncertain>approved", "uncertain>needs_review", "uncertain>failed",
		"needs_review>succeeded", "needs_review>failed", "needs_review>abandoned",
	)
	checkAllPairs(t, ledger.ActionStates(), want, ledger.ValidateActionTransition)
}

func TestAttemptTransitions(t *testing.T) {
	want := legal("started>succeeded", "started>failed", "started>timed_out", "started>cancelled", "started>uncertain")
	checkAllPairs(t, ledger.AttemptStatuses(), want, ledger.ValidateAttemptTransition)
}

func TestEffectTransitions(t *testing.T) {
	want := legal("unknown>happened", "unknown>not_happened")
	checkAllPairs(t, ledger.EffectFacts(), want, ledger.ValidateEffectTransition)
}

func TestApprovalTransitions(t *testing.T) {
	want := legal("pending>granted", "pending>denied", "pending>expired", "pending>invalidated")
	checkAllPairs(t, ledger.ApprovalStates(), want, ledger.ValidateApprovalTransition)
}

func TestCancellationTransitions(t *testing.T) {
	want := legal("requested>accepted", "accepted>stopping", "stopping>stopped",
		"requested>too_late", "accepted>too_late", "stopping>too_late")
	checkAllPairs(t, ledger.CancellationStates(), want, ledger.ValidateCancellationTransition)
}

// TestRunCanMoveTo: CanMoveTo answers from the run table itself, so a run
// waiting for an approval is not moved to review (no such edge).
func TestRunCanMoveTo(t *testing.T) {
	for _, from := range ledger.RunStates() {
		for _, to := range ledger.RunStates() {
			ok := ledger.ValidateRunTransition(from, to, "") == nil || ledger.ValidateRunTransition(from, to, ledger.StopUserCancelled) == nil ||
				ledger.ValidateRunTransition(from, to, ledger.StopInternalError) == nil || ledger.ValidateRunTransition(from, to, ledger.StopCompleted) == nil
			require.Equal(t, ok, from.CanMoveTo(to), "%s → %s", from, to)
		}
	}
	require.True(t, ledger.RunRunning.CanMoveTo(ledger.RunNeedsReview))
	require.False(t, ledger.RunAwaitingApproval.CanMoveTo(ledger.RunNeedsReview))
}
