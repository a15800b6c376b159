package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// pathTo finds a shortest path of legal edges from start to goal, using the
// package's own validator as the graph. nil if goal is start.
func pathTo[S ~string](states []S, start, goal S, legal func(from, to S) bool) [][2]S {
	prev := map[S]S{}
	seen := map[S]bool{start: true}
	queue := []S{start}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == goal {
			break
		}
		for _, next := range states {
			if !seen[next] && legal(cur, next) {
				seen[next], prev[next] = true, cur
				queue = append(queue, next)
			}
		}
	}
	var path [][2]S
	for s := goal; s != start; s = prev[s] {
		path = append([][2]S{{prev[s], s}}, path...)
	}
	return path
}

var reasonFor = map[ledger.RunState]ledger.StopReason{
	ledger.RunCompleted: ledger.StopCompleted, ledger.RunStopped: ledger.StopUserCancelled, ledger.RunFailed: ledger.StopInternalError,
}

// testStoreRunTransitions drives every (from, to) pair of run states through
// the Store: legal edges commit with their event and a bumped version;
// illegal ones are refused and change nothing.
func testStoreRunTransitions(t *testing.T, h Harness) {
	b := openStore(t, h)
	ctx := context.Background()
	legal := func(from, to ledger.RunState) bool {
		return ledger.ValidateRunTransition(from, to, reasonFor[to]) == nil
	}
	n := 0
	for _, from := range ledger.RunStates() {
		for _, to := range ledger.RunStates() {
			t.Run(fmt.Sprintf("%s>%s", from, to), func(t *testing.T) {
				n++
				run := b.SubmitRun(t, fmt.Sprintf("run-%d", n), ledger.BudgetLimits{})
				for _, e := range pathTo(ledger.RunStates(), ledger.RunQueued, from, legal) {
					var err error
					run, err = b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: e[0], To: e[1], StopReason: reasonFor[e[1]]})
					require.NoError(t, err)
				}
				require.Equal(t, from, run.State)
				got, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: from, To: to, StopReason: reasonFor[to], Actor: "t"})
				after, ferr := b.Store.FindRunByID(ctx, run.ID)
				require.NoError(t, ferr)
				if !legal(from, to) {
					require.ErrorIs(t, err, ledger.ErrInvalid)
					require.Equal(t, run.State, after.State)
					require.Equal(t, run.Version, after.Version)
					require.Equal(t, run.EventSeq, after.EventSeq, "a refused transition writes no event")
					return
				}
				require.NoError(t, err)
				require.Equal(t, to, got.State)
				require.Equal(t, reasonFor[to], got.StopReason)
				require.Equal(t, run.Version+1, got.Version)
				require.Equal(t, run.EventSeq+1, got.EventSeq)
				events, err := b.Store.FindEvents(ctx, run.ID)
				require.NoError(t, err)
				last := events[len(events)-1]
				require.Equal(t, "run."+string(to), last.Type)
				require.Equal(t, string(from), last.FromState)
			})
		}
	}
	t.Run("stale from is a conflict", func(t *testing.T) {
		run := b.RunningRun(t, "stale", ledger.BudgetLimits{})
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning})
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.Contains(t, err.Error(), "is running, not queued")
	})
	t.Run("unknown run", func(t *testing.T) {
		_, err := b.Store.TransitionRun(ctx, ledger.RunTransition{ID: "run_nope", From: ledger.RunQueued, To: ledger.RunRunning})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

// actionFixture is one action in a running run, with what the edge
// executors need.
type actionFixture struct {
	b       *bundle
	action  *ledger.Action
	attempt *ledger.Attempt
}

// apply takes the edge from → to with the method that owns it.
func (f *actionFixture) apply(t *testing.T, from, to ledger.ActionState) error {
	t.Helper()
	ctx := context.Background()
	s := f.b.Store
	var err error
	switch ledger.ActionEdgeOwner(from, to) {
	case "StartAttempt":
		f.attempt, err = s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: f.action.ID})
	case "DecideApproval":
		d := ledger.DecisionGrant
		if to == ledger.ActionDenied {
			d = ledger.DecisionDeny
		}
		_, err = s.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: f.action.ID, ActionDigest: f.action.ActionDigest,
			Decision: d, Principal: "bob"})
	case "ExpireApprovals":
		f.b.Clock.Advance(2 * time.Hour)
		var expired []*ledger.Approval
		expired, err = s.ExpireApprovals(ctx)
		if err == nil && !slices.ContainsFunc(expired, func(a *ledger.Approval) bool { return a.ActionID == f.action.ID }) {
			err = fmt.Errorf("approval of %s not expired", f.action.ID)
		}
	case "ReaskApproval":
		_, err = s.ReaskApproval(ctx, ledger.ReaskApprovalParams{ActionID: f.action.ID, Reason: "asked again", ApprovalTTL: time.Hour})
	case "FinishAttempt":
		// The close whose outcome (ledger.OutcomeOf) takes a write there.
		close := map[ledger.ActionState][2]string{ledger.ActionSucceeded: {"succeeded", "happened"},
			ledger.ActionFailed: {"failed", "not_happened"}, ledger.ActionUncertain: {"uncertain", "unknown"},
			ledger.ActionNeedsReview: {"failed", "happened"}, ledger.ActionCancelled: {"cancelled", "not_happened"}}[to]
		_, err = s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: f.attempt.ID, Status: ledger.AttemptStatus(close[0]),
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectFact(close[1])}})
	default:
		_, err = s.TransitionAction(ctx, ledger.ActionTransition{ID: f.action.ID, From: from, To: to, ApprovalTTL: time.Hour})
	}
	if err == nil {
		f.action, err = s.FindActionByID(ctx, f.action.ID)
	}
	return err
}

func testStoreActionTransitions(t *testing.T, h Harness) {
	b := openStore(t, h)
	ctx := context.Background()
	legal := func(from, to ledger.ActionState) bool { return ledger.ValidateActionTransition(from, to) == nil }
	n := 0
	for _, from := range ledger.ActionStates() {
		for _, to := range ledger.ActionStates() {
			t.Run(fmt.Sprintf("%s>%s", from, to), func(t *testing.T) {
				n++
				run := b.RunningRun(t, fmt.Sprintf("run-%d", n), ledger.BudgetLimits{})
				f := &actionFixture{b: b, action: b.Action(t, run.ID, "step-1", "").Action}
				for _, e := range pathTo(ledger.ActionStates(), ledger.ActionProposed, from, legal) {
					require.NoError(t, f.apply(t, e[0], e[1]), "reach %s via %s>%s", from, e[0], e[1])
				}
				require.Equal(t, from, f.action.State)
				before := f.action
				runBefore, err := b.Store.FindRunByID(ctx, run.ID)
				require.NoError(t, err)
				if !legal(from, to) {
					_, err := b.Store.TransitionAction(ctx, ledger.ActionTransition{ID: before.ID, From: from, To: to})
					require.ErrorIs(t, err, ledger.ErrInvalid)
					after, err := b.Store.FindActionByID(ctx, before.ID)
					require.NoError(t, err)
					require.Equal(t, before, after, "a refused transition changes nothing")
					runAfter, err := b.Store.FindRunByID(ctx, run.ID)
					require.NoError(t, err)
					require.Equal(t, runBefore.EventSeq, runAfter.EventSeq)
					return
				}
				if owner := ledger.ActionEdgeOwner(from, to); owner != "" {
					_, err := b.Store.TransitionAction(ctx, ledger.ActionTransition{ID: before.ID, From: from, To: to})
					require.ErrorIs(t, err, ledger.ErrInvalid, "owned edges are refused by the generic method")
					require.Contains(t, err.Error(), owner)
				}
				require.NoError(t, f.apply(t, from, to))
				require.Equal(t, to, f.action.State)
				require.Greater(t, f.action.Version, before.Version)
				require.Equal(t, before.ActionDigest, f.action.ActionDigest, "an action's digest never changes")
				pending, err := b.Store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &before.ID, State: ptr(ledger.ApprovalPending)})
				require.NoError(t, err)
				if to == ledger.ActionAwaitingApproval {
					require.Len(t, pending, 1, "awaiting_approval has its pending approval")
					require.Equal(t, before.ActionDigest, pending[0].ActionDigest)
				} else {
					require.Empty(t, pending, "no pending approval outlives awaiting_approval")
				}
				rep, err := b.Store.VerifyChain(ctx, run.ID)
				require.NoError(t, err)
				require.True(t, rep.OK, rep.Reason)
			})
		}
	}
}

func testStoreAttemptTransitions(t *testing.T, h Harness) {
	b := openStore(t, h)
	ctx := context.Background()
	n := 0
	start := func(t *testing.T) *ledger.Attempt {
		n++
		run := b.RunningRun(t, fmt.Sprintf("run-%d", n), ledger.BudgetLimits{})
		a := b.Action(t, run.ID, "step-1", ledger.ActionApproved).Action
		att, err := b.Store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID})
		require.NoError(t, err)
		require.Equal(t, ledger.AttemptStarted, att.Status)
		require.Equal(t, ledger.EffectUnknown, att.Effect)
		return att
	}
	for _, from := range ledger.AttemptStatuses() {
		for _, to := range ledger.AttemptStatuses() {
			t.Run(fmt.Sprintf("%s>%s", from, to), func(t *testing.T) {
				att := start(t)
				finish := func(s ledger.AttemptStatus) error {
					// An effect the outcome table allows with s (a write
					// that succeeded took effect); the transition is what
					// is tested.
					p := ledger.FinishAttemptParams{AttemptID: att.ID, Status: s}
					if s == ledger.AttemptSucceeded {
						p.Observation = &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened}
					}
					_, err := b.Store.FinishAttempt(ctx, p)
					return err
				}
				if from != ledger.AttemptStarted {
					require.NoError(t, finish(from))
				}
				err := finish(to)
				got, ferr := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &att.ActionID})
				require.NoError(t, ferr)
				require.Len(t, got, 1)
				switch {
				case ledger.ValidateAttemptTransition(from, to) == nil:
					require.NoError(t, err)
					require.Equal(t, to, got[0].Status)
					require.NotNil(t, got[0].FinishedAt)
				case from == ledger.AttemptStarted || to == ledger.AttemptStarted:
					require.ErrorIs(t, err, ledger.ErrInvalid, "started is not an outcome")
					require.Equal(t, from, got[0].Status)
				default:
					require.ErrorIs(t, err, ledger.ErrConflict, "a finished attempt stays finished")
					require.Equal(t, from, got[0].Status)
				}
			})
		}
	}
	for _, from := range ledger.EffectFacts() {
		for _, to := range ledger.EffectFacts() {
			t.Run(fmt.Sprintf("effect %s>%s", from, to), func(t *testing.T) {
				att := start(t)
				observe := func(e ledger.EffectFact) error {
					_, _, err := b.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: att.ID,
						Source: ledger.ObservedQuery, Effect: e})
					return err
				}
				if from != ledger.EffectUnknown {
					require.NoError(t, observe(from))
				}
				err := observe(to)
				got, ferr := b.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &att.ActionID})
				require.NoError(t, ferr)
				switch {
				case ledger.ValidateEffectTransition(from, to) == nil:
					require.NoError(t, err)
					require.Equal(t, to, got[0].Effect)
					require.NotEmpty(t, got[0].EffectObservation)
				case to == ledger.EffectUnknown || to == from:
					// "unknown" evidence and confirmations are recorded but change no fact.
					require.NoError(t, err)
					require.Equal(t, from, got[0].Effect)
				default:
					require.ErrorIs(t, err, ledger.ErrConflict, "established effects never flip")
					require.Equal(t, from, got[0].Effect)
				}
			})
		}
	}
}

func testStoreApprovalTransitions(t *testing.T, h Harness) {
	b := openStore(t, h)
	ctx := context.Background()
	n := 0
	// Each way an approval leaves pending, and that nothing moves it again.
	exits := map[ledger.ApprovalState]func(t *testing.T, a *ledger.Action) error{
		ledger.ApprovalGranted: func(t *testing.T, a *ledger.Action) error {
			_, err := b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a.ID, ActionDigest: a.ActionDigest, Decision: ledger.DecisionGrant, Principal: "bob"})
			return err
		},
		ledger.ApprovalDenied: func(t *testing.T, a *ledger.Action) error {
			_, err := b.Store.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: a.ID, ActionDigest: a.ActionDigest, Decision: ledger.DecisionDeny, Principal: "bob"})
			return err
		},
		ledger.ApprovalExpired: func(t *testing.T, a *ledger.Action) error {
			b.Clock.Advance(2 * time.Hour)
			_, err := b.Store.ExpireApprovals(ctx)
			return err
		},
		ledger.ApprovalInvalidated: func(t *testing.T, a *ledger.Action) error {
			_, err := b.Store.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: ledger.ActionAwaitingApproval, To: ledger.ActionCancelled})
			return err
		},
	}
	for _, from := range ledger.ApprovalStates() {
		for _, to := range ledger.ApprovalStates() {
			t.Run(fmt.Sprintf("%s>%s", from, to), func(t *testing.T) {
				n++
				run := b.RunningRun(t, fmt.Sprintf("run-%d", n), ledger.BudgetLimits{})
				a := b.Action(t, run.ID, "step-1", ledger.ActionAwaitingApproval).Action
				if from != ledger.ApprovalPending {
					require.NoError(t, exits[from](t, a))
				}
				var err error
				if exit := exits[to]; exit != nil {
					err = exit(t, a)
				}
				got, ferr := b.Store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &a.ID})
				require.NoError(t, ferr)
				require.Len(t, got, 1, "one approval per request")
				if ledger.ValidateApprovalTransition(from, to) == nil {
					require.NoError(t, err)
					require.Equal(t, to, got[0].State)
					require.NotNil(t, got[0].DecidedAt)
					return
				}
				require.Equal(t, from, got[0].State, "an approval leaves pending once")
				if to == ledger.ApprovalGranted || to == ledger.ApprovalDenied {
					require.ErrorIs(t, err, ledger.ErrConflict)
				}
			})
		}
	}
}

func testStoreCancellationTransitions(t *testing.T, h Harness) {
	b := openStore(t, h)
	ctx := context.Background()
	legal := func(from, to ledger.CancellationState) bool {
		return ledger.ValidateCancellationTransition(from, to) == nil
	}
	n := 0
	for _, from := range ledger.CancellationStates() {
		for _, to := range ledger.CancellationStates() {
			t.Run(fmt.Sprintf("%s>%s", from, to), func(t *testing.T) {
				n++
				run := b.RunningRun(t, fmt.Sprintf("run-%d", n), ledger.BudgetLimits{})
				start := ledger.CancelAccepted
				if from == ledger.CancelRequested {
					// Only an older build left a cancellation requested.
					start = ledger.CancelRequested
					b.LegacyCancellation(t, run.ID, ledger.CancelRequested)
				} else {
					res, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice", Reason: "enough"})
					require.NoError(t, err)
					require.True(t, res.Created)
					require.Equal(t, start, res.Cancellation.State)
				}
				if from == ledger.CancelTooLate || to == ledger.CancelTooLate {
					endRun(t, b, run.ID) // too late means the run ended first
				}
				for _, e := range pathTo(ledger.CancellationStates(), start, from, legal) {
					_, err := b.Store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID, From: e[0], To: e[1]})
					require.NoError(t, err)
				}
				c, err := b.Store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID, From: from, To: to})
				if !legal(from, to) {
					require.ErrorIs(t, err, ledger.ErrInvalid)
					got, err := b.Store.FindCancellation(ctx, run.ID)
					require.NoError(t, err)
					require.Equal(t, from, got.State)
					return
				}
				require.NoError(t, err)
				require.Equal(t, to, c.State)
				// Each fact keeps its own time.
				if from != ledger.CancelRequested || to != ledger.CancelTooLate {
					require.NotNil(t, c.AcceptedAt)
				}
				if to == ledger.CancelStopping || to == ledger.CancelStopped {
					require.NotNil(t, c.StoppingAt)
				}
				if to == ledger.CancelStopped {
					require.NotNil(t, c.StoppedAt)
				}
				if to == ledger.CancelTooLate {
					require.NotNil(t, c.TooLateAt)
				} else {
					require.Nil(t, c.TooLateAt)
				}
			})
		}
	}
	t.Run("ErrConflict too late while the run is live", func(t *testing.T) {
		run := b.RunningRun(t, "live", ledger.BudgetLimits{})
		_, err := b.Store.RequestCancel(ctx, ledger.RequestCancelParams{RunID: run.ID, Principal: "alice"})
		require.NoError(t, err)
		_, err = b.Store.TransitionCancellation(ctx, ledger.CancellationTransition{RunID: run.ID, From: ledger.CancelAccepted, To: ledger.CancelTooLate})
		require.ErrorIs(t, err, ledger.ErrConflict)
		got, err := b.Store.FindCancellation(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.CancelAccepted, got.State)
	})
}

func ptr[T any](v T) *T { return &v }
