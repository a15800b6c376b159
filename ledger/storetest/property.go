package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/actionledger/ledger/ledger"
)

// testInvariantsProperty drives one store with random sequences of
// operations, legal or not, and checks the ledger's invariants against the
// database after every step. One store serves every rapid iteration (opening
// a file per iteration is too slow); each iteration works on runs of its own,
// so their ids and keys never meet (each has its own tenant). Run with
// -rapid.checks=N to search longer.
func testInvariantsProperty(t *testing.T, h Harness) {
	b := openStore(t, h)
	steps := h.PropertySteps
	if steps <= 0 {
		steps = defaultPropSteps
	}
	stats := map[string]*[2]int{} // operation → {ok, refused}: shows the search is not vacuous
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		w := &propWorld{b: b, ctx: context.Background(), prefix: fmt.Sprintf("prop-%d", iteration), stats: stats}
		w.begin(rt)
		// Weighted by what the iteration holds, so that steps find something
		// to act on more often than not; every operation stays possible.
		ops := []struct {
			run    func(*rapid.T)
			weight func() int
		}{
			{w.submit, w.weight(1, nil, nil)},
			{w.transitionRun, w.weight(1, nil, nil)},
			{w.createAction, w.weight(2, nil, func(s *propRunSnap) bool { return s.Run.State == ledger.RunRunning })},
			{w.transitionAction, w.weight(2, propHasActions, nil)},
			{w.decideApproval, w.weight(1, propHasActions, propHasActionIn(ledger.ActionAwaitingApproval))},
			{w.expireApprovals, w.weight(1, nil, nil)},
			{w.startAttempt, w.weight(2, propHasActions, propHasActionIn(ledger.ActionApproved))},
			{w.finishAttempt, w.weight(2, propHasAttempts, propHasActionIn(ledger.ActionRunning))},
			{w.recordObservation, w.weight(2, propHasAttempts, nil)},
			{w.requestCancel, w.weight(1, nil, nil)},
			{w.transitionCancellation, w.weight(1, func(s *propRunSnap) bool { return s.Cancellation != nil }, nil)},
			{w.addUsage, w.weight(1, nil, nil)},
		}
		w.check(rt)
		for range rapid.IntRange(1, steps).Draw(rt, "steps") {
			var deck []int
			for i, op := range ops {
				for range op.weight() {
					deck = append(deck, i)
				}
			}
			ops[propPick(rt, "op", deck)].run(rt)
			w.check(rt)
		}
	})
	for _, op := range slices.Sorted(maps.Keys(stats)) {
		t.Logf("%-12s ok %5d  refused %5d", op, stats[op][0], stats[op][1])
	}
}

// defaultPropSteps bounds the operations of one iteration unless the
// harness says otherwise (Harness.PropertySteps); with rapid's default 100
// iterations the property takes about 3 s on SQLite, 15 s under -race (on
// two shared cores).
const defaultPropSteps = 50

// maxPropRuns bounds the runs of one iteration: every step snapshots them
// all, and a few runs already give replays, cross-run supersedes and
// terminal runs to hit.
const maxPropRuns = 3

// propWorld is what one iteration knows: the runs, actions and attempts it
// made, the requests it can replay, and the snapshot after the last step.
type propWorld struct {
	b      *bundle
	ctx    context.Context
	prefix string
	seq    int

	runs     []ledger.RunID
	submits  []ledger.SubmitRunParams // successful first submissions, for replays
	creates  []propCreate             // successful first creations, for replays
	attempts []ledger.AttemptID

	snap   propSnap
	op     string // the last operation, for messages
	failed bool   // whether the last operation returned an error
	// touched names the runs the last operation addressed; check reads
	// them in full, and any other run whose row changed.
	touched []ledger.RunID
	stats   map[string]*[2]int
}

type propCreate struct {
	p      ledger.CreateActionParams
	action *ledger.Action
}

// propSnap is every fact of the iteration's runs, read through the public
// API.
type propSnap map[ledger.RunID]*propRunSnap

type propRunSnap struct {
	Run          *ledger.Run
	Events       []*ledger.Event
	Chain        ledger.ChainReport
	Actions      map[ledger.ActionID]*ledger.Action
	Attempts     map[ledger.AttemptID]*ledger.Attempt
	Approvals    map[ledger.ApprovalID]*ledger.Approval
	Cancellation *ledger.Cancellation // nil if none was requested
}

// weight returns an operation's weight: base, four times more while some
// run of the iteration has what the operation works on (ready), and none
// while no run has anything it could work on (exists): unknown ids are
// still tried now and then by the pick functions.
func (w *propWorld) weight(base int, exists, ready func(*propRunSnap) bool) func() int {
	return func() int {
		n := 0
		if exists == nil {
			n = base
		}
		for _, s := range w.snap {
			if ready != nil && ready(s) {
				return 4 * base
			}
			if exists != nil && exists(s) {
				n = base
			}
		}
		return n
	}
}

func propHasActions(s *propRunSnap) bool  { return len(s.Actions) > 0 }
func propHasAttempts(s *propRunSnap) bool { return len(s.Attempts) > 0 }

func propHasActionIn(states ...ledger.ActionState) func(*propRunSnap) bool {
	return func(s *propRunSnap) bool {
		for _, a := range s.Actions {
			if slices.Contains(states, a.State) {
				return true
			}
		}
		return false
	}
}

// begin gives the iteration a running run to work on, so that most
// sequences get past submission. ExpireApprovals sweeps the whole store, so
// it first lets every approval with a TTL left by earlier iterations expire:
// an iteration then replays the same way when rapid shrinks it.
func (w *propWorld) begin(t *rapid.T) {
	w.b.Clock.Advance(24 * time.Hour)
	_, err := w.b.Store.ExpireApprovals(w.ctx)
	require.NoError(t, err)
	p := ledger.SubmitRunParams{Tenant: w.prefix, IdempotencyKey: w.nextKey("run"), Principal: "alice", Agent: "prop",
		Input: json.RawMessage(`{"n":0}`), Budgets: w.drawBudgets(t)}
	res, err := w.b.Store.SubmitRun(w.ctx, p)
	require.NoError(t, err)
	_, err = w.b.Store.TransitionRun(w.ctx, ledger.RunTransition{ID: res.Run.ID, From: ledger.RunQueued, To: ledger.RunRunning, Actor: "worker"})
	require.NoError(t, err)
	w.runs, w.submits = append(w.runs, res.Run.ID), append(w.submits, p)
}

// done records an operation's outcome. An error must be a *ledger.Error
// with a code other than internal: illegal requests are expected, a failure
// the ledger cannot classify is a bug.
func (w *propWorld) done(t *rapid.T, op string, err error, touched ...ledger.RunID) {
	t.Helper()
	w.op, w.failed, w.touched = op, err != nil, touched
	kind, _, _ := strings.Cut(op, " ")
	if w.stats[kind] == nil {
		w.stats[kind] = &[2]int{}
	}
	if err == nil {
		w.stats[kind][0]++
	} else {
		w.stats[kind][1]++
	}
	if err == nil {
		t.Logf("%s: ok", op)
		return
	}
	t.Logf("%s: %s: %v", op, ledger.Code(err), err)
	var le *ledger.Error
	require.Truef(t, errors.As(err, &le), "%s: error is not a *ledger.Error: %#v", op, err)
	require.NotEqualf(t, ledger.CodeInternal, ledger.Code(err), "%s: internal error: %v", op, err)
}

// propIndex draws 0..n-1 uniformly. rapid's own integers and SampledFrom
// lean hard towards the smallest value, which would turn every "now and
// then" into "most of the time" and starve the later choices of a list.
func propIndex(t *rapid.T, label string, n int) int {
	return rapid.Custom(func(t *rapid.T) int {
		v := 0
		for i := range 16 {
			if rapid.Bool().Draw(t, "bit") {
				v |= 1 << i
			}
		}
		return v % n
	}).Draw(t, label)
}

// propPick draws one of xs uniformly.
func propPick[E any](t *rapid.T, label string, xs []E) E { return xs[propIndex(t, label, len(xs))] }

// propChance is true with pct percent probability.
func propChance(t *rapid.T, pct int, label string) bool { return propIndex(t, label, 100) < pct }

func (w *propWorld) nextKey(kind string) string {
	w.seq++
	return fmt.Sprintf("%s-%s-%d", w.prefix, kind, w.seq)
}

// pickRun returns one of the iteration's runs, mostly one that prefer
// likes if there is one, and now and then an id that names no run.
func (w *propWorld) pickRun(t *rapid.T, prefer func(*ledger.Run) bool) ledger.RunID {
	if len(w.runs) == 0 || propChance(t, 3, "unknown run") {
		return "run_01J00000000000000000000000"
	}
	var liked []ledger.RunID
	for _, id := range w.runs {
		if s, ok := w.snap[id]; ok && prefer != nil && prefer(s.Run) {
			liked = append(liked, id)
		}
	}
	if len(liked) > 0 && propChance(t, 75, "preferred run") {
		return propPick(t, "run", liked)
	}
	return propPick(t, "run", w.runs)
}

func (w *propWorld) actionIDs(prefer func(*ledger.Action) bool) []ledger.ActionID {
	var ids []ledger.ActionID
	for _, s := range w.snap {
		for id, a := range s.Actions {
			if prefer == nil || prefer(a) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// pickAction returns one of the iteration's actions, mostly one that prefer
// likes if there is one, and now and then an id that names no action.
func (w *propWorld) pickAction(t *rapid.T, prefer func(*ledger.Action) bool) ledger.ActionID {
	ids := w.actionIDs(nil)
	if len(ids) == 0 || propChance(t, 3, "unknown action") {
		return "act_01J00000000000000000000000"
	}
	if liked := w.actionIDs(prefer); prefer != nil && len(liked) > 0 && propChance(t, 75, "preferred action") {
		return propPick(t, "action", liked)
	}
	return propPick(t, "action", ids)
}

// pickAttempt is pickAction for attempts.
func (w *propWorld) pickAttempt(t *rapid.T, prefer func(*ledger.Attempt) bool) ledger.AttemptID {
	if len(w.attempts) == 0 || propChance(t, 3, "unknown attempt") {
		return "att_01J00000000000000000000000"
	}
	var liked []ledger.AttemptID
	for _, id := range w.attempts {
		if a := w.findAttempt(id); a != nil && prefer != nil && prefer(a) {
			liked = append(liked, id)
		}
	}
	if len(liked) > 0 && propChance(t, 75, "preferred attempt") {
		return propPick(t, "attempt", liked)
	}
	return propPick(t, "attempt", w.attempts)
}

func propRunIs(states ...ledger.RunState) func(*ledger.Run) bool {
	return func(r *ledger.Run) bool { return slices.Contains(states, r.State) }
}

func propActionIs(states ...ledger.ActionState) func(*ledger.Action) bool {
	return func(a *ledger.Action) bool { return slices.Contains(states, a.State) }
}

func (w *propWorld) findAction(id ledger.ActionID) *ledger.Action {
	for _, s := range w.snap {
		if a, ok := s.Actions[id]; ok {
			return a
		}
	}
	return nil
}

func (w *propWorld) runOfAction(id ledger.ActionID) ledger.RunID {
	if a := w.findAction(id); a != nil {
		return a.RunID
	}
	return ""
}

func (w *propWorld) runOfAttempt(id ledger.AttemptID) ledger.RunID {
	if a := w.findAttempt(id); a != nil {
		return a.RunID
	}
	return ""
}

func (w *propWorld) findAttempt(id ledger.AttemptID) *ledger.Attempt {
	for _, s := range w.snap {
		if a, ok := s.Attempts[id]; ok {
			return a
		}
	}
	return nil
}

func (w *propWorld) drawBudgets(t *rapid.T) ledger.BudgetLimits {
	switch rapid.IntRange(0, 5).Draw(t, "budget kind") {
	case 1:
		return ledger.BudgetLimits{MaxAttemptsPerAction: rapid.Int64Range(1, 3).Draw(t, "max attempts per action")}
	case 2:
		return ledger.BudgetLimits{MaxAttemptsPerRun: rapid.Int64Range(1, 4).Draw(t, "max attempts per run")}
	case 3:
		return ledger.BudgetLimits{MaxExecution: time.Minute}
	case 4:
		return ledger.BudgetLimits{DeadlineAfter: time.Hour}
	default:
		return ledger.BudgetLimits{}
	}
}

func (w *propWorld) submit(t *rapid.T) {
	mode := "new"
	if len(w.submits) > 0 {
		mode = propPick(t, "submit mode", []string{"new", "new", "same body", "other body"})
	}
	if mode == "new" && len(w.runs) >= maxPropRuns {
		mode = "same body"
	}
	var p ledger.SubmitRunParams
	var first ledger.SubmitRunParams
	if mode == "new" {
		p = ledger.SubmitRunParams{
			Tenant: w.prefix, IdempotencyKey: w.nextKey("run"), Principal: "alice", Agent: "prop",
			Input:   json.RawMessage(fmt.Sprintf(`{"n":%d}`, rapid.IntRange(0, 9).Draw(t, "input"))),
			Budgets: w.drawBudgets(t),
		}
	} else {
		first = propPick(t, "replayed submission", w.submits)
		p = first
		if mode == "other body" {
			p.Input = json.RawMessage(`{"n":"other"}`)
		}
	}
	res, err := w.b.Store.SubmitRun(w.ctx, p)
	var touched ledger.RunID
	if res.Run != nil {
		touched = res.Run.ID
	}
	w.done(t, "submit "+mode+" "+p.IdempotencyKey, err, touched)
	switch mode {
	case "new":
		require.NoError(t, err, "a fresh key must make a run")
		require.False(t, res.Replayed)
		require.Equal(t, ledger.RunQueued, res.Run.State)
		w.runs = append(w.runs, res.Run.ID)
		w.submits = append(w.submits, p)
	case "same body":
		require.NoError(t, err, "a replay with the same body must resolve to the same run")
		require.True(t, res.Replayed)
		require.Equal(t, first.IdempotencyKey, res.Run.IdempotencyKey)
		require.Contains(t, w.runs, res.Run.ID)
	case "other body":
		require.Equal(t, ledger.CodeConflict, ledger.Code(err), "a reused key with another body must conflict")
	}
}

// propRunTargets lists the states a run may move to from s (with a fitting stop
// reason).
func propRunTargets(from ledger.RunState) []ledger.RunState {
	var out []ledger.RunState
	for _, to := range ledger.RunStates() {
		if ledger.ValidateRunTransition(from, to, propReasonFor(to)) == nil {
			out = append(out, to)
		}
	}
	return out
}

// propReasonFor returns some stop reason belonging to a terminal state.
func propReasonFor(s ledger.RunState) ledger.StopReason {
	if !s.Terminal() {
		return ""
	}
	for _, r := range ledger.StopReasons() {
		if r.TerminalState() == s {
			return r
		}
	}
	return ""
}

func (w *propWorld) transitionRun(t *rapid.T) {
	id := w.pickRun(t, func(r *ledger.Run) bool { return !r.State.Terminal() })
	var cur ledger.RunState
	if s, ok := w.snap[id]; ok {
		cur = s.Run.State
	}
	from := cur
	if from == "" || propChance(t, 20, "random from") {
		from = propPick(t, "from", ledger.RunStates())
	}
	var to ledger.RunState
	targets := propRunTargets(from)
	switch {
	case slices.Contains(targets, ledger.RunRunning) && propChance(t, 40, "to running"):
		to = ledger.RunRunning
	case slices.ContainsFunc(targets, func(s ledger.RunState) bool { return !s.Terminal() }) && propChance(t, 50, "to non-terminal"):
		to = propPick(t, "non-terminal target", slices.DeleteFunc(targets, ledger.RunState.Terminal))
	case len(targets) > 0 && propChance(t, 70, "legal to"):
		to = propPick(t, "legal target", targets)
	default:
		to = propPick(t, "any target", ledger.RunStates())
	}
	var reason ledger.StopReason
	switch n := rapid.IntRange(0, 9).Draw(t, "reason kind"); {
	case to.Terminal() && n < 7:
		var fits []ledger.StopReason
		for _, r := range ledger.StopReasons() {
			if r.TerminalState() == to {
				fits = append(fits, r)
			}
		}
		reason = propPick(t, "fitting reason", fits)
	case n == 9 || (to.Terminal() && n < 9):
		reason = propPick(t, "any reason", ledger.StopReasons())
	}
	run, err := w.b.Store.TransitionRun(w.ctx, ledger.RunTransition{ID: id, From: from, To: to, StopReason: reason, Actor: "worker"})
	w.done(t, fmt.Sprintf("run %s %s→%s (%q)", id, from, to, reason), err, id)
	if err == nil {
		require.Equal(t, cur, from, "a run moved from a state it was not in")
		require.Equal(t, to, run.State)
		require.Equal(t, reason, run.StopReason)
	}
}

func (w *propWorld) createAction(t *rapid.T) {
	mode := "new"
	if len(w.creates) > 0 {
		mode = propPick(t, "create mode", []string{"new", "new", "new", "same body", "other body"})
	}
	var p ledger.CreateActionParams
	var first propCreate
	if mode == "new" {
		p = ledger.CreateActionParams{
			RunID: w.pickRun(t, propRunIs(ledger.RunRunning)), IdempotencyKey: w.nextKey("step"), Tool: "cards.write", ToolVersion: "1",
			Effect:      propPick(t, "effect", []ledger.Effect{ledger.EffectRead, ledger.EffectWrite}),
			Arguments:   json.RawMessage(fmt.Sprintf(`{"x":%d}`, rapid.IntRange(0, 3).Draw(t, "argument"))),
			Gate:        propPick(t, "gate", []ledger.ActionState{"", ledger.ActionApproved, ledger.ActionApproved, ledger.ActionAwaitingApproval, ledger.ActionDenied}),
			ApprovalTTL: propPick(t, "approval ttl", []time.Duration{0, time.Second, 10 * time.Minute, time.Hour}),
			Actor:       "engine",
		}
		if ids := w.actionIDs(nil); len(ids) > 0 && propChance(t, 25, "supersede") {
			p.Supersedes = propPick(t, "superseded action", ids)
		}
	} else {
		first = propPick(t, "replayed creation", w.creates)
		p = first.p
		if mode == "other body" {
			p.Arguments = json.RawMessage(`{"x":"other"}`)
		}
	}
	res, err := w.b.Store.CreateAction(w.ctx, p)
	w.done(t, fmt.Sprintf("create action %s %s on %s gate %q supersedes %q", mode, p.IdempotencyKey, p.RunID, p.Gate, p.Supersedes), err,
		p.RunID, w.runOfAction(p.Supersedes))
	switch mode {
	case "same body":
		require.NoError(t, err, "a replayed step must return the recorded action")
		require.True(t, res.Duplicate)
		require.Equal(t, first.action.ID, res.Action.ID)
		require.Equal(t, first.action.ActionDigest, res.Action.ActionDigest)
	case "other body":
		require.Equal(t, ledger.CodeConflict, ledger.Code(err), "a reused step key with another action must conflict")
	case "new":
		if err != nil {
			return
		}
		require.False(t, res.Duplicate)
		want := p.Gate
		if want == "" {
			want = ledger.ActionProposed
		}
		require.Equal(t, want, res.Action.State)
		require.Equal(t, p.Gate == ledger.ActionAwaitingApproval, res.Approval != nil, "a pending approval opens iff the gate awaits one")
		if res.Approval != nil {
			require.Equal(t, ledger.ApprovalPending, res.Approval.State)
			require.Equal(t, res.Action.ActionDigest, res.Approval.ActionDigest)
		}
		w.creates = append(w.creates, propCreate{p: p, action: res.Action})
	}
}

// propActionTargets lists the states an action may move to from s.
func propActionTargets(from ledger.ActionState) []ledger.ActionState {
	var out []ledger.ActionState
	for _, to := range ledger.ActionStates() {
		if ledger.ValidateActionTransition(from, to) == nil {
			out = append(out, to)
		}
	}
	return out
}

func (w *propWorld) transitionAction(t *rapid.T) {
	id := w.pickAction(t, func(a *ledger.Action) bool { return !a.State.Terminal() })
	var cur ledger.ActionState
	if a := w.findAction(id); a != nil {
		cur = a.State
	}
	from := cur
	if from == "" || propChance(t, 20, "random from") {
		from = propPick(t, "from", ledger.ActionStates())
	}
	to := propPick(t, "any target", ledger.ActionStates())
	if targets := propActionTargets(from); len(targets) > 0 && propChance(t, 70, "legal to") {
		to = propPick(t, "legal target", targets)
	}
	ttl := propPick(t, "approval ttl", []time.Duration{0, time.Minute})
	a, err := w.b.Store.TransitionAction(w.ctx, ledger.ActionTransition{ID: id, From: from, To: to, ApprovalTTL: ttl, Actor: "person"})
	w.done(t, fmt.Sprintf("action %s %s→%s", id, from, to), err, w.runOfAction(id))
	if err == nil {
		require.Equal(t, cur, from, "an action moved from a state it was not in")
		require.Equal(t, to, a.State)
		require.Empty(t, ledger.ActionEdgeOwner(from, to), "TransitionAction took an edge owned by another method")
	}
}

func (w *propWorld) decideApproval(t *rapid.T) {
	id := w.pickAction(t, propActionIs(ledger.ActionAwaitingApproval))
	var right ledger.Digest
	if a := w.findAction(id); a != nil {
		right = a.ActionDigest
	}
	digest := right
	switch n := rapid.IntRange(0, 9).Draw(t, "digest kind"); {
	case n >= 7 && n < 9 || right == "":
		other, err := ledger.DigestJSON([]byte(`{"some":"other action"}`))
		require.NoError(t, err)
		digest = other
	case n == 9:
		digest = "sha256:not-a-digest"
	}
	decision := propPick(t, "decision", []ledger.ApprovalDecision{ledger.DecisionGrant, ledger.DecisionDeny})
	res, err := w.b.Store.DecideApproval(w.ctx, ledger.DecideApprovalParams{ActionID: id, ActionDigest: digest,
		Decision: decision, Principal: "bob", Reason: "looked at it"})
	w.done(t, fmt.Sprintf("decide %s %s (right digest %v)", id, decision, digest == right), err, w.runOfAction(id))
	if err == nil {
		require.Equal(t, right, digest, "an approval was decided with a digest its action does not have")
		wantApproval, wantAction := ledger.ApprovalGranted, ledger.ActionApproved
		if decision == ledger.DecisionDeny {
			wantApproval, wantAction = ledger.ApprovalDenied, ledger.ActionDenied
		}
		require.Equal(t, wantApproval, res.Approval.State)
		require.Equal(t, wantAction, res.Action.State)
	}
}

func (w *propWorld) expireApprovals(t *rapid.T) {
	d := propPick(t, "advance", []time.Duration{0, time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour})
	w.b.Clock.Advance(d)
	expired, err := w.b.Store.ExpireApprovals(w.ctx)
	w.done(t, fmt.Sprintf("advance %s and expire approvals (%d expired)", d, len(expired)), err)
	for _, a := range expired {
		require.Equal(t, ledger.ApprovalExpired, a.State)
		require.NotNil(t, a.ExpiresAt)
		require.False(t, w.b.Clock.Now().Before(*a.ExpiresAt), "an approval expired before its time")
	}
}

func (w *propWorld) startAttempt(t *rapid.T) {
	id := w.pickAction(t, propActionIs(ledger.ActionApproved))
	att, err := w.b.Store.StartAttempt(w.ctx, ledger.StartAttemptParams{ActionID: id, Actor: "worker"})
	w.done(t, fmt.Sprintf("start attempt of %s", id), err, w.runOfAction(id))
	if err == nil {
		require.Equal(t, id, att.ActionID)
		require.Equal(t, ledger.AttemptStarted, att.Status)
		require.Equal(t, ledger.EffectUnknown, att.Effect)
		w.attempts = append(w.attempts, att.ID)
	}
}

func propDrawObservation(t *rapid.T) (ledger.ObservationSource, ledger.EffectFact, json.RawMessage) {
	src := propPick(t, "observation source", []ledger.ObservationSource{ledger.ObservedResult, ledger.ObservedQuery,
		ledger.ObservedCancel, ledger.ObservedPerson, "rumour"})
	effect := propPick(t, "observed effect", []ledger.EffectFact{ledger.EffectUnknown, ledger.EffectHappened,
		ledger.EffectNotHappened, ledger.EffectHappened, ledger.EffectNotHappened, "maybe"})
	var detail json.RawMessage
	if propChance(t, 30, "detail") {
		detail = json.RawMessage(`{"status": 200, "id": "x1"}`)
	}
	return src, effect, detail
}

func (w *propWorld) finishAttempt(t *rapid.T) {
	id := w.pickAttempt(t, func(a *ledger.Attempt) bool { return a.Status == ledger.AttemptStarted })
	p := ledger.FinishAttemptParams{
		AttemptID: id,
		Status:    propPick(t, "status", ledger.AttemptStatuses()),
		Actor:     "worker",
	}
	if propChance(t, 65, "with observation") {
		src, effect, detail := propDrawObservation(t)
		p.Observation = &ledger.ObservationInput{Source: src, Effect: effect, Detail: detail}
	}
	if propChance(t, 30, "with error") {
		p.Error = &ledger.AttemptError{Code: "tool_error", Message: "boom"}
	} else if propChance(t, 50, "with result") {
		p.Result = json.RawMessage(`{"ok":true}`)
	}
	if propChance(t, 50, "time passes") {
		w.b.Clock.Advance(propPick(t, "duration", []time.Duration{time.Millisecond, time.Second, 30 * time.Second}))
	}
	res, err := w.b.Store.FinishAttempt(w.ctx, p)
	obs := "none"
	if p.Observation != nil {
		obs = fmt.Sprintf("%s/%s", p.Observation.Source, p.Observation.Effect)
	}
	w.done(t, fmt.Sprintf("finish %s as %s, observation %s", id, p.Status, obs), err, w.runOfAttempt(id))
	if err == nil {
		require.Equal(t, p.Status, res.Attempt.Status)
		// The action goes where the outcome table sends it, on the effect
		// as the close leaves it (or stays in review, where a person was
		// asked meanwhile).
		want, terr := ledger.OutcomeOf(res.Action.Effect, p.Status, res.Attempt.Effect)
		require.NoError(t, terr, "a finish the table refuses was written")
		if res.Action.State != ledger.ActionNeedsReview {
			require.Equal(t, want, res.Action.State)
		}
		if p.Observation != nil && p.Observation.Effect != ledger.EffectUnknown {
			require.Equal(t, p.Observation.Effect, res.Attempt.Effect)
		}
	}
}

func (w *propWorld) recordObservation(t *rapid.T) {
	id := w.pickAttempt(t, func(a *ledger.Attempt) bool { return a.Effect == ledger.EffectUnknown })
	var before ledger.EffectFact
	if a := w.findAttempt(id); a != nil {
		before = a.Effect
	}
	src, effect, detail := propDrawObservation(t)
	_, att, err := w.b.Store.RecordObservation(w.ctx, ledger.RecordObservationParams{AttemptID: id, Source: src,
		Effect: effect, Detail: detail, Actor: "recovery"})
	w.done(t, fmt.Sprintf("observe %s: %s says %s", id, src, effect), err, w.runOfAttempt(id))
	if err == nil {
		want := before
		if before == ledger.EffectUnknown {
			want = effect
		}
		require.Equal(t, want, att.Effect)
	}
}

func (w *propWorld) requestCancel(t *rapid.T) {
	id := w.pickRun(t, func(r *ledger.Run) bool { return !r.State.Terminal() })
	principal := "carol"
	if propChance(t, 5, "no principal") {
		principal = ""
	}
	res, err := w.b.Store.RequestCancel(w.ctx, ledger.RequestCancelParams{RunID: id, Principal: principal, Reason: "enough"})
	w.done(t, fmt.Sprintf("request cancel of %s", id), err, id)
	if err == nil {
		require.Equal(t, id, res.Cancellation.RunID)
		_, existed := w.snap[id]
		if existed && w.snap[id].Cancellation != nil {
			require.False(t, res.Created, "a second cancel request created another cancellation")
			require.Equal(t, w.snap[id].Cancellation.ID, res.Cancellation.ID)
		}
	}
}

func (w *propWorld) transitionCancellation(t *rapid.T) {
	id := w.pickRun(t, func(r *ledger.Run) bool { return w.snap[r.ID] != nil && w.snap[r.ID].Cancellation != nil })
	var cur ledger.CancellationState
	if s, ok := w.snap[id]; ok && s.Cancellation != nil {
		cur = s.Cancellation.State
	}
	from := cur
	if from == "" || propChance(t, 20, "random from") {
		from = propPick(t, "from", ledger.CancellationStates())
	}
	to := propPick(t, "any target", ledger.CancellationStates())
	for _, s := range ledger.CancellationStates() {
		if ledger.ValidateCancellationTransition(from, s) == nil && propChance(t, 75, "next state") {
			to = s
		}
	}
	c, err := w.b.Store.TransitionCancellation(w.ctx, ledger.CancellationTransition{RunID: id, From: from, To: to, Actor: "worker"})
	w.done(t, fmt.Sprintf("cancellation of %s %s→%s", id, from, to), err, id)
	if err == nil {
		require.Equal(t, cur, from, "a cancellation moved from a state it was not in")
		require.Equal(t, to, c.State)
	}
}

func (w *propWorld) addUsage(t *rapid.T) {
	id := w.pickRun(t, nil)
	p := ledger.AddUsageParams{
		RunID:             id,
		Steps:             rapid.Int64Range(0, 3).Draw(t, "steps"),
		Tokens:            rapid.Int64Range(0, 5000).Draw(t, "tokens"),
		Execution:         time.Duration(rapid.Int64Range(0, 2_000_000).Draw(t, "execution us")) * time.Microsecond,
		TokensUnavailable: propChance(t, 10, "tokens unavailable"),
	}
	budget, err := w.b.Store.AddUsage(w.ctx, p)
	w.done(t, fmt.Sprintf("add usage to %s: %d steps, %d tokens, %s", id, p.Steps, p.Tokens, p.Execution), err, id)
	if err == nil {
		prev := w.snap[id].Run.Budget.Used
		require.Equal(t, prev.Steps+p.Steps, budget.Used.Steps)
		require.Equal(t, prev.Tokens+p.Tokens, budget.Used.Tokens)
		require.Equal(t, prev.Execution+p.Execution, budget.Used.Execution)
		require.Equal(t, prev.Attempts, budget.Used.Attempts)
		require.Equal(t, prev.TokensUnavailable || p.TokensUnavailable, budget.Used.TokensUnavailable)
	}
}

// read reads every fact of one run. The chain is walked again whenever it
// grew; a chain whose head did not move must hold exactly the events that
// were verified before.
func (w *propWorld) read(t *rapid.T, id ledger.RunID, prev *propRunSnap) *propRunSnap {
	t.Helper()
	s := &propRunSnap{
		Actions:   map[ledger.ActionID]*ledger.Action{},
		Attempts:  map[ledger.AttemptID]*ledger.Attempt{},
		Approvals: map[ledger.ApprovalID]*ledger.Approval{},
	}
	var err error
	s.Run, err = w.b.Store.FindRunByID(w.ctx, id)
	require.NoError(t, err)
	s.Events, err = w.b.Store.FindEvents(w.ctx, id)
	require.NoError(t, err)
	if prev != nil && prev.Run.EventSeq == s.Run.EventSeq && prev.Run.EventHash == s.Run.EventHash {
		require.Equal(t, prev.Events, s.Events, "run %s: events changed under an unmoved head", id)
		s.Chain = prev.Chain
	} else {
		s.Chain, err = w.b.Store.VerifyChain(w.ctx, id)
		require.NoError(t, err)
	}
	actions, err := w.b.Store.FindActions(w.ctx, ledger.ActionFilter{RunID: &id})
	require.NoError(t, err)
	for _, a := range actions {
		s.Actions[a.ID] = a
	}
	attempts, err := w.b.Store.FindAttempts(w.ctx, ledger.AttemptFilter{RunID: &id})
	require.NoError(t, err)
	for _, a := range attempts {
		s.Attempts[a.ID] = a
	}
	approvals, err := w.b.Store.FindApprovals(w.ctx, ledger.ApprovalFilter{RunID: &id})
	require.NoError(t, err)
	for _, a := range approvals {
		s.Approvals[a.ID] = a
	}
	s.Cancellation, err = w.b.Store.FindCancellation(w.ctx, id)
	if ledger.Code(err) == ledger.CodeNotFound {
		s.Cancellation, err = nil, nil
	}
	require.NoError(t, err)
	return s
}

// check runs after every step: it reads the iteration's runs back and holds
// them to the invariants, each run alone and against the previous snapshot.
// Reading every fact of every run after every step is what makes such a
// test slow, so it reads in full the runs the step addressed and every run
// whose row (state, version, event head, budget) changed; a run whose row
// is as before has appended no event, and every change appends one.
func (w *propWorld) check(t *rapid.T) {
	t.Helper()
	rows, err := w.b.Store.FindRuns(w.ctx, ledger.RunFilter{Tenant: &w.prefix})
	require.NoError(t, err)
	ids := make([]ledger.RunID, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	require.ElementsMatch(t, w.runs, ids, "after %s: the tenant holds other runs than were submitted", w.op)
	prev, cur := w.snap, propSnap{}
	for _, row := range rows {
		p := prev[row.ID]
		if p != nil && !slices.Contains(w.touched, row.ID) && reflect.DeepEqual(p.Run, row) {
			cur[row.ID] = p
			continue
		}
		s := w.read(t, row.ID, p)
		if w.failed && p != nil {
			require.Lenf(t, s.Events, len(p.Events), "%s failed but run %s has new events", w.op, row.ID)
			require.Equalf(t, p, s, "%s failed but changed run %s", w.op, row.ID)
		}
		propCheckRun(t, w.op, p, s)
		cur[row.ID] = s
	}
	w.snap = cur
}

func propCheckRun(t *rapid.T, op string, prev, cur *propRunSnap) {
	t.Helper()
	run := cur.Run
	at := func(format string, args ...any) string {
		return fmt.Sprintf("after %s: run %s: ", op, run.ID) + fmt.Sprintf(format, args...)
	}

	// The event chain: 1..n without gaps, n recorded on the run, intact.
	for i, e := range cur.Events {
		require.Equal(t, int64(i+1), e.Seq, at("event sequence has a gap"))
		require.Equal(t, run.ID, e.RunID, at("event of another run"))
	}
	require.Equal(t, int64(len(cur.Events)), run.EventSeq, at("run head is not the last event"))
	require.True(t, cur.Chain.OK, at("chain broken at %d: %s", cur.Chain.BrokenSeq, cur.Chain.Reason))
	require.Equal(t, len(cur.Events), cur.Chain.Events, at("chain report counts other events"))

	// One terminal state with its one stop reason; none before.
	if run.State.Terminal() {
		require.NotEmpty(t, run.StopReason, at("terminal without a stop reason"))
		require.Equal(t, run.State, run.StopReason.TerminalState(), at("stop reason %s does not end in %s", run.StopReason, run.State))
	} else {
		require.Empty(t, run.StopReason, at("%s run has a stop reason", run.State))
	}

	// Budget usage is internally consistent.
	require.Equal(t, int64(len(cur.Attempts)), run.Budget.Used.Attempts, at("attempts used ≠ attempts recorded"))

	// Actions, their attempts and approvals agree with each other.
	attemptsOf := map[ledger.ActionID][]*ledger.Attempt{}
	for _, a := range cur.Attempts {
		attemptsOf[a.ActionID] = append(attemptsOf[a.ActionID], a)
		require.Equal(t, run.ID, a.RunID)
		require.Equal(t, a.Effect == ledger.EffectUnknown, a.EffectObservation == "", at("attempt %s effect %s with observation %q", a.ID, a.Effect, a.EffectObservation))
		require.Equal(t, a.Status == ledger.AttemptStarted, a.FinishedAt == nil, at("attempt %s is %s, finished at %v", a.ID, a.Status, a.FinishedAt))
	}
	pendingOf := map[ledger.ActionID]int{}
	for _, apr := range cur.Approvals {
		action, ok := cur.Actions[apr.ActionID]
		require.True(t, ok, at("approval %s of an action not in its run", apr.ID))
		require.Equal(t, action.ActionDigest, apr.ActionDigest, at("approval %s (%s) is bound to another digest than its action's", apr.ID, apr.State))
		if apr.State == ledger.ApprovalPending {
			pendingOf[apr.ActionID]++
		}
	}
	for id, a := range cur.Actions {
		atts := attemptsOf[id]
		slices.SortFunc(atts, func(x, y *ledger.Attempt) int { return int(x.No - y.No) })
		started := 0
		for i, att := range atts {
			require.Equal(t, int64(i+1), att.No, at("attempt numbers of %s have a gap", id))
			if att.Status == ledger.AttemptStarted {
				started++
			}
		}
		require.Equal(t, a.AttemptCount, int64(len(atts)), at("action %s counts %d attempts, has %d", id, a.AttemptCount, len(atts)))
		require.LessOrEqual(t, pendingOf[id], 1, at("action %s has %d pending approvals", id, pendingOf[id]))
		require.Equal(t, a.State == ledger.ActionAwaitingApproval, pendingOf[id] == 1,
			at("action %s is %s with %d pending approvals", id, a.State, pendingOf[id]))
		require.Equal(t, a.State == ledger.ActionRunning, started == 1,
			at("action %s is %s with %d attempts in flight", id, a.State, started))
		require.LessOrEqual(t, started, 1, at("action %s has %d attempts in flight", id, started))
	}

	if prev == nil {
		return
	}

	// Terminal is forever.
	if prev.Run.State.Terminal() {
		require.Equal(t, prev.Run.State, run.State, at("terminal run changed state"))
		require.Equal(t, prev.Run.StopReason, run.StopReason, at("terminal run changed stop reason"))
	}
	// Runs move along their table; versions never go down.
	require.GreaterOrEqual(t, run.Version, prev.Run.Version, at("run version went down"))
	if run.State != prev.Run.State {
		require.NoError(t, ledger.ValidateRunTransition(prev.Run.State, run.State, run.StopReason), at("run moved off its table"))
		require.Greater(t, run.Version, prev.Run.Version, at("run changed state without a new version"))
	}
	require.GreaterOrEqual(t, len(cur.Events), len(prev.Events), at("events disappeared"))
	for i, e := range prev.Events {
		require.Equal(t, e.Hash, cur.Events[i].Hash, at("event %d was rewritten", e.Seq))
	}

	// Usage counters never decrease.
	pu, cu := prev.Run.Budget.Used, run.Budget.Used
	require.GreaterOrEqual(t, cu.Attempts, pu.Attempts, at("attempts used went down"))
	require.GreaterOrEqual(t, cu.Execution, pu.Execution, at("execution used went down"))
	require.GreaterOrEqual(t, cu.Steps, pu.Steps, at("steps used went down"))
	require.GreaterOrEqual(t, cu.Tokens, pu.Tokens, at("tokens used went down"))
	require.False(t, pu.TokensUnavailable && !cu.TokensUnavailable, at("tokens_unavailable was cleared"))
	require.Equal(t, prev.Run.Budget.Limits, run.Budget.Limits, at("budget limits changed"))

	for id, a := range cur.Actions {
		p, ok := prev.Actions[id]
		if !ok {
			if a.State != ledger.ActionProposed {
				require.NoError(t, ledger.ValidateActionTransition(ledger.ActionProposed, a.State), at("new action %s", id))
			}
			continue
		}
		require.Equal(t, p.ActionDigest, a.ActionDigest, at("action %s digest changed", id))
		require.Equal(t, string(p.Arguments), string(a.Arguments), at("action %s arguments changed", id))
		require.Equal(t, p.DedupKey, a.DedupKey, at("action %s dedup key changed", id))
		require.GreaterOrEqual(t, a.Version, p.Version, at("action %s version went down", id))
		if a.State != p.State {
			require.NoError(t, ledger.ValidateActionTransition(p.State, a.State), at("action %s moved off its table", id))
			require.Greater(t, a.Version, p.Version, at("action %s changed state without a new version", id))
		}
	}
	require.GreaterOrEqual(t, len(cur.Actions), len(prev.Actions), at("actions disappeared"))

	for id, a := range cur.Attempts {
		p, ok := prev.Attempts[id]
		if !ok {
			require.Equal(t, ledger.AttemptStarted, a.Status, at("attempt %s was born %s", id, a.Status))
			require.Equal(t, ledger.EffectUnknown, a.Effect, at("attempt %s was born with effect %s", id, a.Effect))
			continue
		}
		require.GreaterOrEqual(t, a.Version, p.Version, at("attempt %s version went down", id))
		if a.Status != p.Status {
			require.Equal(t, ledger.AttemptStarted, p.Status, at("attempt %s left finished status %s", id, p.Status))
			require.NoError(t, ledger.ValidateAttemptTransition(p.Status, a.Status), at("attempt %s moved off its table", id))
			require.Greater(t, a.Version, p.Version, at("attempt %s changed status without a new version", id))
		}
		if a.Effect != p.Effect {
			require.Equal(t, ledger.EffectUnknown, p.Effect, at("attempt %s effect %s changed to %s", id, p.Effect, a.Effect))
			require.NoError(t, ledger.ValidateEffectTransition(p.Effect, a.Effect), at("attempt %s effect moved off its table", id))
			require.Greater(t, a.Version, p.Version, at("attempt %s changed effect without a new version", id))
		}
		if p.EffectObservation != "" {
			require.Equal(t, p.EffectObservation, a.EffectObservation, at("attempt %s effect evidence replaced", id))
		}
	}
	require.GreaterOrEqual(t, len(cur.Attempts), len(prev.Attempts), at("attempts disappeared"))

	for id, a := range cur.Approvals {
		p, ok := prev.Approvals[id]
		if !ok {
			require.Equal(t, ledger.ApprovalPending, a.State, at("approval %s was born %s", id, a.State))
			continue
		}
		require.GreaterOrEqual(t, a.Version, p.Version, at("approval %s version went down", id))
		if a.State != p.State {
			require.NoError(t, ledger.ValidateApprovalTransition(p.State, a.State), at("approval %s moved off its table", id))
			require.Greater(t, a.Version, p.Version, at("approval %s changed state without a new version", id))
		}
	}
	require.GreaterOrEqual(t, len(cur.Approvals), len(prev.Approvals), at("approvals disappeared"))

	switch c, p := cur.Cancellation, prev.Cancellation; {
	case c == nil:
		require.Nil(t, p, at("cancellation disappeared"))
	case p == nil:
		// Requested and accepted in the one write that moves the run.
		require.Equal(t, ledger.CancelAccepted, c.State, at("cancellation was born %s", c.State))
		require.Equal(t, ledger.RunStopping, cur.Run.State, at("cancellation born with its run %s", cur.Run.State))
	default:
		require.Equal(t, p.ID, c.ID, at("cancellation replaced"))
		require.GreaterOrEqual(t, c.Version, p.Version, at("cancellation version went down"))
		if c.State != p.State {
			require.NoError(t, ledger.ValidateCancellationTransition(p.State, c.State), at("cancellation moved off its table"))
			require.Greater(t, c.Version, p.Version, at("cancellation changed state without a new version"))
		}
		if c.State == ledger.CancelTooLate {
			require.True(t, cur.Run.State.Terminal(), at("cancellation too late on a run that is %s", cur.Run.State))
		}
	}
}
