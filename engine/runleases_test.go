package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

// heldTool is a write tool whose calls wait until the test lets them
// answer, whatever their context says: its outcome can reach the worker
// after the worker lost the run's lease. It counts its effects.
type heldTool struct {
	desc    contracts.ToolDescriptor
	started chan struct{}
	release chan struct{}
	effects atomic.Int64
	// hold, if false, answers at once.
	hold bool
}

func newHeldTool(name string, hold bool) *heldTool {
	return &heldTool{hold: hold, started: make(chan struct{}, 16), release: make(chan struct{}),
		desc: contracts.ToolDescriptor{SchemaVersion: "1.0", Name: name, Version: "1", Effect: contracts.EffectWrite,
			ArgumentsSchema: json.RawMessage(`{"type":"object"}`), TimeoutMS: 10000}}
}

func (t *heldTool) Descriptor() contracts.ToolDescriptor { return t.desc }

func (t *heldTool) Execute(ctx context.Context, _ engine.Call) (engine.Result, error) {
	select {
	case t.started <- struct{}{}:
	default:
	}
	if t.hold {
		<-t.release
	}
	t.effects.Add(1)
	return engine.Result{Output: json.RawMessage(`{"ok":true}`)}, nil
}

// leasedEngine is an engine on its own Store over a shared database file,
// as another process would be, with an agent "writer" that calls tool once
// (auto-approved) and finishes.
func leasedEngine(t *testing.T, path string, clock *ledgertest.Clock, tool engine.Tool, owner string, tune func(*engine.Config)) (*ledgertest.Bundle, *engine.Engine) {
	t.Helper()
	lb := ledgertest.OpenStoreAt(t, path, clock)
	agent := engine.Agent{Name: "writer", NewModel: func(json.RawMessage) (engine.Model, error) {
		return &oneCall{tool: tool.Descriptor().Name}, nil
	}, Tools: []engine.Tool{tool}}
	rules := &contracts.Rules{SchemaVersion: contracts.CurrentVersion, Rules: []contracts.Rule{
		{Tool: tool.Descriptor().Name, Decision: contracts.RuleDecisionAutoApprove}}}
	policy, err := approval.NewPolicy(rules, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(lb.Store, policy, func(string) (contracts.ToolDescriptor, bool) { return tool.Descriptor(), true },
		approval.Options{})
	cfg := engine.Config{Store: lb.Store, Approvals: svc, Agents: []engine.Agent{agent}, Now: clock.Now,
		PollInterval: 5 * time.Millisecond, Owner: owner, LeaseTTL: 300 * time.Millisecond}
	if tune != nil {
		tune(&cfg)
	}
	eng, err := engine.New(cfg)
	require.NoError(t, err)
	return lb, eng
}

// oneCall is a model that calls its tool once, then finishes.
type oneCall struct{ tool string }

func (m *oneCall) Next(_ context.Context, h engine.History) (engine.Step, error) {
	if len(h.Entries) == 0 {
		return engine.Step{Kind: engine.StepToolCall, Tool: m.tool, Arguments: json.RawMessage(`{}`)}, nil
	}
	return engine.Step{Kind: engine.StepFinal, Final: json.RawMessage(`{"done":true}`)}, nil
}

func submitWriter(t *testing.T, s ledger.Store, key string) ledger.RunID {
	t.Helper()
	res, err := s.SubmitRun(context.Background(), ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: key, Principal: "alice",
		Agent: "writer", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	return res.Run.ID
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 5*time.Millisecond, what)
}

// pausedRenewals fails the renewals of run leases while paused is set, as
// for a process paused or cut off from its database.
type pausedRenewals struct {
	ledger.Store
	paused *atomic.Bool
}

func (s pausedRenewals) RenewRunLeases(ctx context.Context, owner string, leases []ledger.RunLease, ttl time.Duration) ([]ledger.RunLease, error) {
	if s.paused.Load() {
		return nil, ledger.Errorf(ledger.CodeInternal, "renew run leases: the process is paused")
	}
	return s.Store.RenewRunLeases(ctx, owner, leases, ttl)
}

// TestStaleHolder: a worker whose run is claimed by another process while
// its call is out (its renewals stopped and its lease lapsed: here the
// clock jumps an hour) gives the run up, cancels the call, and records the
// outcome that still reaches it as a stale_holder observation instead of
// finishing the attempt. The new holder recovers the attempt from that
// evidence: the effect happened once, and the run completes.
func TestStaleHolder(t *testing.T) {
	ctx := context.Background()
	clock := ledgertest.NewClock()
	path := filepath.Join(t.TempDir(), "ledger.db")
	tool := newHeldTool("ext.write", true)
	paused := &atomic.Bool{}
	a, engA := leasedEngine(t, path, clock, tool, "a", func(c *engine.Config) { c.Store = pausedRenewals{c.Store, paused} })
	run := submitWriter(t, a.Store, "k")

	engA.Start(ctx)
	t.Cleanup(engA.Stop)
	var answered sync.Once
	answer := func() { answered.Do(func() { close(tool.release) }) }
	t.Cleanup(answer) // before Stop, whatever happened: the call ignores its context
	<-tool.started
	first, err := a.Store.FindRunLease(ctx, run)
	require.NoError(t, err)
	require.Equal(t, "a", first.Owner)

	// Another process claims the run once the lease has lapsed.
	paused.Store(true)
	other := ledgertest.OpenStoreAt(t, path, clock)
	clock.Advance(time.Hour)
	taken, err := other.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "b", TTL: time.Hour, Limit: 1,
		States: []ledger.RunState{ledger.RunRunning}})
	require.NoError(t, err)
	require.Len(t, taken, 1)
	require.Equal(t, first.Token+1, taken[0].Token)
	paused.Store(false)

	var staleObs *ledger.Observation
	waitFor(t, "engine a gives up the run", func() bool { return engA.Leases().Held == 0 })
	answer() // the call answers after all, too late
	waitFor(t, "the late outcome kept as stale_holder", func() bool {
		obs, err := a.Store.FindObservations(ctx, ledger.ObservationFilter{RunID: &run})
		require.NoError(t, err)
		for _, o := range obs {
			if o.Source == ledger.ObservedStaleHolder {
				staleObs = o
				return true
			}
		}
		return false
	})
	require.Equal(t, ledger.EffectHappened, staleObs.Effect)
	atts, err := a.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run})
	require.NoError(t, err)
	require.Len(t, atts, 1)
	require.Equal(t, ledger.AttemptStarted, atts[0].Status, "the stale holder did not finish the attempt")
	require.Equal(t, ledger.EffectHappened, atts[0].Effect)
	engA.Stop()

	// The new holder (another engine, its lease once b's is released)
	// recovers: the effect is established, so the attempt is reconciled,
	// not called again.
	require.NoError(t, other.Store.ReleaseRunLease(ctx, taken[0]))
	_, engB := leasedEngine(t, path, clock, tool, "c", nil)
	moved, err := engB.AdvanceRunnable(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	got, err := other.Store.FindRunByID(ctx, run)
	require.NoError(t, err)
	require.Equal(t, ledger.RunCompleted, got.State)
	require.EqualValues(t, 1, tool.effects.Load(), "one effect")
	rep, err := other.Store.VerifyChain(ctx, run)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep)
	l, err := other.Store.FindRunLease(ctx, run)
	require.NoError(t, err)
	require.Empty(t, l.Owner, "released when done")
}

// TestTwoEnginesOneDatabase: two engines (two processes) on one database
// under load advance every run exactly once: each effect once, every run
// completed, every lease released.
func TestTwoEnginesOneDatabase(t *testing.T) {
	ctx := context.Background()
	clock := ledgertest.NewClock()
	path := filepath.Join(t.TempDir(), "ledger.db")
	tool := newHeldTool("ext.write", false)
	a, engA := leasedEngine(t, path, clock, tool, "a", nil)
	_, engB := leasedEngine(t, path, clock, tool, "b", nil)
	const n = 40
	var runs []ledger.RunID
	for i := range n {
		runs = append(runs, submitWriter(t, a.Store, fmt.Sprintf("k%d", i)))
	}
	var wg sync.WaitGroup
	for _, e := range []*engine.Engine{engA, engB} {
		wg.Go(func() { e.Start(ctx) })
	}
	wg.Wait()
	defer engA.Stop()
	defer engB.Stop()
	waitFor(t, "every run completed", func() bool {
		for _, id := range runs {
			r, err := a.Store.FindRunByID(ctx, id)
			require.NoError(t, err)
			if r.State != ledger.RunCompleted {
				return false
			}
		}
		return true
	})
	engA.Stop()
	engB.Stop()
	require.EqualValues(t, n, tool.effects.Load(), "every action's effect exactly once")
	for _, id := range runs {
		atts, err := a.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &id})
		require.NoError(t, err)
		require.Len(t, atts, 1)
		l, err := a.Store.FindRunLease(ctx, id)
		require.NoError(t, err)
		require.Empty(t, l.Owner)
	}
}

// TestRecoverSkipsHeldRuns: the recovery scan recovers only the runs it
// can claim; a run another process holds is counted and left alone, and
// recovered by a scan once it is free.
func TestRecoverSkipsHeldRuns(t *testing.T) {
	ctx := context.Background()
	clock := ledgertest.NewClock()
	path := filepath.Join(t.TempDir(), "ledger.db")
	tool := newHeldTool("ext.write", false)
	a, eng := leasedEngine(t, path, clock, tool, "a", nil)
	run := submitWriter(t, a.Store, "k")
	// An attempt recorded, its call never made: a crash after the record.
	_, err := a.Store.TransitionRun(ctx, ledger.RunTransition{ID: run, From: ledger.RunQueued, To: ledger.RunRunning})
	require.NoError(t, err)
	res, err := a.Store.CreateAction(ctx, ledger.CreateActionParams{RunID: run, IdempotencyKey: "step-1", Tool: "ext.write",
		ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{}`), Gate: ledger.ActionApproved, StartAttempt: true})
	require.NoError(t, err)
	require.NotNil(t, res.Attempt)

	held, err := a.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "other", TTL: time.Hour, Limit: 1, States: []ledger.RunState{ledger.RunRunning}})
	require.NoError(t, err)
	require.Len(t, held, 1)
	rep, err := eng.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Held)
	require.Zero(t, rep.Actions)
	act, err := a.Store.FindActionByID(ctx, res.Action.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.ActionRunning, act.State, "left to its holder")

	require.NoError(t, a.Store.ReleaseRunLease(ctx, held[0]))
	rep, err = eng.Recover(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.Held)
	require.Equal(t, 1, rep.Actions)
	act, err = a.Store.FindActionByID(ctx, res.Action.ID)
	require.NoError(t, err)
	require.NotEqual(t, ledger.ActionRunning, act.State, "recovered")
	l, err := a.Store.FindRunLease(ctx, run)
	require.NoError(t, err)
	require.Empty(t, l.Owner, "released after the scan")
	require.Equal(t, int64(2), l.Token)
}

// failingRenewals fails every renewal of run leases, as a store that
// cannot write would.
type failingRenewals struct{ ledger.Store }

func (failingRenewals) RenewRunLeases(context.Context, string, []ledger.RunLease, time.Duration) ([]ledger.RunLease, error) {
	return nil, ledger.Errorf(ledger.CodeInternal, "renew run leases: database or disk is full")
}

// TestNoCallWithoutLease: a tool is called only while the run's lease
// outlasts the call's timeout by the margin. Here the lease (300ms) is
// shorter than the tool's timeout (10s) and cannot be extended: nothing is
// called and no attempt recorded; the run waits for a lease that can.
func TestNoCallWithoutLease(t *testing.T) {
	ctx := context.Background()
	clock := ledgertest.NewClock()
	path := filepath.Join(t.TempDir(), "ledger.db")
	tool := newHeldTool("ext.write", false)
	a, eng := leasedEngine(t, path, clock, tool, "a", func(c *engine.Config) { c.Store = failingRenewals{c.Store} })
	run := submitWriter(t, a.Store, "k")
	moved, err := eng.AdvanceRunnable(ctx)
	require.ErrorIs(t, err, ledger.ErrInternal)
	require.Equal(t, 0, moved)
	require.Zero(t, tool.effects.Load())
	atts, err := a.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run})
	require.NoError(t, err)
	require.Empty(t, atts)
	acts, err := a.Store.FindActions(ctx, ledger.ActionFilter{RunID: &run})
	require.NoError(t, err)
	require.Len(t, acts, 1)
	require.Equal(t, ledger.ActionApproved, acts[0].State, "recorded, not started")
	require.Error(t, eng.Leases().Err)

	// With a store that renews, the same run goes on.
	_, ok := leasedEngine(t, path, clock, tool, "b", nil)
	moved, err = ok.AdvanceRunnable(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	require.EqualValues(t, 1, tool.effects.Load())
	require.NoError(t, ok.Leases().Err)
	require.False(t, ok.Leases().LastClaim.IsZero())
}

// TestOwnerGone: a default owner names its process so that another process
// of the same host can tell when it no longer exists; any other owner, a
// live process, this process and another host's never count as gone.
func TestOwnerGone(t *testing.T) {
	if engine.LocalOwnerPrefix() == "" {
		t.Skip("this system does not say which processes share pids")
	}
	host := engine.LocalOwnerPrefix()
	require.Regexp(t, `^`+regexp.QuoteMeta(host)+`/\d+/[0-9a-f]{8}$`, engine.DefaultOwner())
	require.NotEqual(t, engine.DefaultOwner(), engine.DefaultOwner(), "a random part")

	child := exec.Command("sleep", "60")
	require.NoError(t, child.Start())
	owner := fmt.Sprintf("%s/%d/0badc0de", host, child.Process.Pid)
	require.False(t, engine.OwnerGone(owner), "alive")
	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	require.True(t, engine.OwnerGone(owner), "killed and reaped")

	named := engine.NamedOwner("pod-7/" + host)
	require.Regexp(t, `^pod-7_`+regexp.QuoteMeta(strings.ReplaceAll(host, "~", "_"))+`/\d+/[0-9a-f]{8}$`, named)
	for _, o := range []string{
		strings.Replace(named, strconv.Itoa(os.Getpid()), strconv.Itoa(child.Process.Pid), 1), // named: never told from its pid
		fmt.Sprintf("%s/%d/0badc0de", host, os.Getpid()),                                      // this process
		fmt.Sprintf("other-host~123456789abc/%d/0badc0de", child.Process.Pid),                 // another host, or namespace
		fmt.Sprintf("%s/%d", host, child.Process.Pid),                                         // not a default owner
		"worker-1",
	} {
		require.False(t, engine.OwnerGone(o), o)
	}
}

// slowFinish holds FinishAttempt until its context ends and fails it with
// the context's error, as a write blocked behind another's lock fails when
// its caller gives up; entered is told when it is called.
type slowFinish struct {
	ledger.Store
	entered chan struct{}
}

func (s slowFinish) FinishAttempt(ctx context.Context, _ ledger.FinishAttemptParams) (ledger.FinishAttemptResult, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ledger.FinishAttemptResult{}, fmt.Errorf("finish attempt: %w", ctx.Err())
}

// staleObservation waits for run's stale_holder observation and returns it.
func staleObservation(t *testing.T, s ledger.Store, run ledger.RunID) *ledger.Observation {
	t.Helper()
	var found *ledger.Observation
	waitFor(t, "the late outcome kept as stale_holder", func() bool {
		obs, err := s.FindObservations(context.Background(), ledger.ObservationFilter{RunID: &run})
		require.NoError(t, err)
		for _, o := range obs {
			if o.Source == ledger.ObservedStaleHolder {
				found = o
				return true
			}
		}
		return false
	})
	return found
}

// TestStaleHolderWriteCancelled: the call answered while the worker still
// held the lease, and the outcome's write was out when the worker learned
// that another process had claimed the run (a renewal no longer returned
// it) and cancelled its work. The write fails with the context's error, not
// with ErrLeaseLost, and the outcome is kept as a stale_holder observation
// all the same.
func TestStaleHolderWriteCancelled(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	tool := newHeldTool("ext.write", true)
	entered := make(chan struct{}, 1)
	// a's clock stands still: its lease never lapses on its own clock, so
	// only a renewal can tell it the run is another's.
	a, engA := leasedEngine(t, path, ledgertest.NewClock(), tool, "a", func(c *engine.Config) {
		c.Store = slowFinish{Store: c.Store, entered: entered}
	})
	run := submitWriter(t, a.Store, "k")
	engA.Start(ctx)
	t.Cleanup(engA.Stop)
	<-tool.started
	close(tool.release)
	<-entered

	later := ledgertest.NewClock()
	later.Advance(time.Hour)
	other := ledgertest.OpenStoreAt(t, path, later)
	taken, err := other.Store.ClaimRuns(ctx, ledger.ClaimRunsParams{Owner: "b", TTL: time.Hour, Limit: 1,
		States: []ledger.RunState{ledger.RunRunning}})
	require.NoError(t, err)
	require.Len(t, taken, 1)

	obs := staleObservation(t, a.Store, run)
	require.Equal(t, ledger.EffectHappened, obs.Effect)
	atts, err := a.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run})
	require.NoError(t, err)
	require.Len(t, atts, 1)
	require.Equal(t, ledger.AttemptStarted, atts[0].Status, "the stale holder did not finish the attempt")
}

// TestStaleHolderAttemptClosed: a worker paused past its lease (its
// renewals failing, its clock standing still, as in a frozen process) gets
// its call's answer after the new holder recovered the run and closed the
// attempt. Its write is refused as a plain conflict (the attempt is
// finished), not by the fence; the run's token being another's, the late
// outcome is kept as a stale_holder observation all the same, and the
// new holder's verdict stands.
func TestStaleHolderAttemptClosed(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	tool := newHeldTool("ext.write", true)
	paused := &atomic.Bool{}
	a, engA := leasedEngine(t, path, ledgertest.NewClock(), tool, "a", func(c *engine.Config) { c.Store = pausedRenewals{c.Store, paused} })
	run := submitWriter(t, a.Store, "k")
	engA.Start(ctx)
	t.Cleanup(engA.Stop)
	var answered sync.Once
	answer := func() { answered.Do(func() { close(tool.release) }) }
	t.Cleanup(answer)
	<-tool.started
	paused.Store(true)

	// Another process, whose clock is past the lease, claims the run and
	// recovers it: the tool has no guarantees, so a person reviews it.
	later := ledgertest.NewClock()
	later.Advance(time.Hour)
	b, engB := leasedEngine(t, path, later, newHeldTool("ext.write", false), "b", nil)
	moved, err := engB.AdvanceRunnable(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	got, err := b.Store.FindRunByID(ctx, run)
	require.NoError(t, err)
	require.Equal(t, ledger.RunNeedsReview, got.State)
	atts, err := b.Store.FindAttempts(ctx, ledger.AttemptFilter{RunID: &run})
	require.NoError(t, err)
	require.Len(t, atts, 1)
	require.NotEqual(t, ledger.AttemptStarted, atts[0].Status, "closed by the new holder's recovery")

	answer() // too late
	obs := staleObservation(t, a.Store, run)
	require.Equal(t, atts[0].ID, obs.AttemptID)
	after, err := b.Store.FindRunByID(ctx, run)
	require.NoError(t, err)
	require.Equal(t, ledger.RunNeedsReview, after.State, "the late outcome is evidence, not a verdict")
	rep, err := b.Store.VerifyChain(ctx, run)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep)
}
