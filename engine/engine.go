package engine

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/storehealth"
)

// FaultPoint names a dangerous moment of an attempt, where a fault plan
// may kill the process to prove recovery (docs/evidence.md, "The fault matrix").
type FaultPoint string

// The fault points of an attempt, in order.
const (
	FaultBeforeAttemptRecorded FaultPoint = "before_attempt_recorded"
	FaultAfterAttemptRecorded  FaultPoint = "after_attempt_recorded" // recorded, tool not called yet
	FaultBeforeToolCall        FaultPoint = "before_tool_call"       // deadline set, lease checked to outlast it, tool not called yet
	FaultAfterToolCall         FaultPoint = "after_tool_call"        // the tool acted, its result not recorded
	FaultAfterResultRecorded   FaultPoint = "after_result_recorded"  // recorded, next step not taken
	// FaultAwaitingApproval: the run has just started waiting for a person.
	FaultAwaitingApproval FaultPoint = "awaiting_approval"
	// FaultCancelStopping: a cancel is accepted and stopping, nothing
	// confirmed yet.
	FaultCancelStopping FaultPoint = "cancel_stopping"
)

// FaultPoints lists the four crash points of an attempt, in order.
// FaultBeforeToolCall is not one of them: a crash there leaves what a crash
// at FaultAfterAttemptRecorded leaves (the attempt recorded, the tool not
// called); it is where a process is paused (the fault matrix's
// replica/stop cells), between its lease check and its call.
func FaultPoints() []FaultPoint {
	return []FaultPoint{FaultBeforeAttemptRecorded, FaultAfterAttemptRecorded, FaultAfterToolCall, FaultAfterResultRecorded}
}

// AllFaultPoints lists every fault point, the attempt's and the others.
func AllFaultPoints() []FaultPoint {
	return append(FaultPoints(), FaultBeforeToolCall, FaultAwaitingApproval, FaultCancelStopping)
}

// errRunCancelled is the cause of a call's context cancelled by Cancel.
var errRunCancelled = errors.New("run cancelled")

// Approvals is what the engine needs of package approval: the gate rules
// choose for a new action, and the sweep that expires stale approvals.
type Approvals interface {
	Gate(tenant string, tool contracts.ToolDescriptor) approval.Decision
	// PersonGate is Gate for asking a person whatever the rules decide
	// now: for an approved action whose approval passed its execute_by.
	PersonGate(tenant string, tool contracts.ToolDescriptor) approval.Decision
	ExpireDue(ctx context.Context) ([]*ledger.Approval, error)
}

// Config builds an Engine.
type Config struct {
	Store     ledger.Store
	Approvals Approvals
	// Agents are the agents runs may name, by Agent.Name.
	Agents []Agent
	// Now is the clock for step durations; nil means time.Now.
	Now func() time.Time
	// Workers is how many runs advance at once; 0 means 4.
	Workers int
	// PollInterval is how often the pool looks for runnable runs when
	// nobody notified it; 0 means 250ms.
	PollInterval time.Duration
	// DefaultToolTimeout bounds a call whose descriptor sets none; 0 means 30s.
	DefaultToolTimeout time.Duration
	// Policy holds the loop policies; zero fields take budget's defaults.
	Policy budget.Policy
	// MaxAttemptsPerAction caps retries of one action when the run's own
	// budget sets no limit, so a tool that keeps failing cannot be retried
	// forever; 0 means 5. It counts persisted attempts, so restarts do not
	// reset it.
	MaxAttemptsPerAction int64
	// FaultFunc, if set, is called at each FaultPoint. Only a process
	// started with an explicit fault plan sets it (see cmd/ledger); nothing
	// reachable from the network can.
	FaultFunc func(FaultPoint)
	// Redactor hides secrets in what tools and models return (outputs,
	// error messages, probe answers) before the ledger stores it: only an
	// action's arguments are kept as given. Nil means a redactor with a
	// random key of this process, so markers correlate within the process
	// only.
	Redactor *redact.Redactor
	// OnDecision, if set, sees every recovery decision (for metrics).
	OnDecision func(recovery.Decision)
	// OnToolCall, if set, is told of every call of a tool for an attempt
	// once the tool has answered, before the outcome is recorded (for
	// metrics). It runs on the worker that made the call: keep it quick.
	OnToolCall func(ToolCallStats)
	Logger     *slog.Logger
	// Health is the store's health: the Tracker the store was opened with
	// as its observation hook (ledger.Options.Observe: Health.Observe),
	// which sees every caller's operations. The pool backs off while
	// writes fail and makes its probe write when one is due; the server's
	// /readyz and metrics read it. Nil means a new one with Now, Logger and
	// LogInterval, which sees nothing of a store not opened with it.
	Health *storehealth.Tracker
	// RetryMin and RetryMax bound the backoff after failures: a run whose
	// Advance failed (other than by a lost race) waits RetryMin, doubling
	// with each failure in a row up to RetryMax, the upper half of each
	// wait random; so does the pool when its own pass over the store
	// fails. A success starts over. 0 means 100ms and 30s.
	RetryMin, RetryMax time.Duration
	// LogInterval is how often a failure that repeats is logged: once at
	// first, then once per interval with a count. 0 means 10s.
	LogInterval time.Duration
	// Owner names this process as the holder of run leases; "" means
	// DefaultOwner() (host, pid and a random part). Two processes on one
	// database must not share an owner.
	Owner string
	// LeaseTTL is how long a run lease holds unless renewed; the engine
	// renews its leases every third of it, and another process may take a
	// run over that long after this one stopped renewing. 0 means 15s.
	LeaseTTL time.Duration
	// AttemptTokenKey derives the secret tokens of attempts clients begin
	// (the agent protocol), so that a replayed begin gets its token again
	// while only its hash is stored. Keep it across restarts (cmd/ledger
	// derives it from the redaction key); nil means a random key of this
	// process, and a begin replayed after a restart then cannot be answered
	// with its token.
	AttemptTokenKey []byte
}

// ToolCallStats describe one call of a tool (Config.OnToolCall).
type ToolCallStats struct {
	// Tool is the tool's name, one of the registered tools.
	Tool string
	// Status is the attempt status the call's answer gives: succeeded,
	// failed, timed_out or cancelled; started when the engine was shutting
	// down and left the attempt for recovery.
	Status ledger.AttemptStatus
	// Duration is how long the tool took to answer, on the clock Now.
	Duration time.Duration
}

// Engine drives runs over the Store. Advance moves one run as far as it can
// go without a person; Start runs a worker pool that does so for every
// runnable run.
type Engine struct {
	store     ledger.Store
	approvals Approvals
	agents    map[string]*registeredAgent
	now       func() time.Time
	cfg       Config
	log       *slog.Logger
	pool      atomic.Pointer[pool]
	policy    budget.Policy
	recoverer *recovery.Recoverer

	callsMu sync.Mutex
	calls   map[ledger.RunID]func() // cancel functions of calls in flight
	// notBefore holds runs recovery told to wait, or that failed, until
	// when; in memory only: a restart scans everything again anyway.
	notBefore map[ledger.RunID]time.Time
	// failures counts the failed Advances in a row of each run, for its
	// backoff.
	failures map[ledger.RunID]int

	health   *storehealth.Tracker
	backoff  backoff
	failLogs *storehealth.FailureLog
	tokenKey []byte
	// clientAgents names the agents a client drives, in name order.
	clientAgents []string
	// decisionSweep is the sweep's place in the told, unanswered decisions
	// (sweepDecisions), and minDecisionTimeout the shortest decision
	// timeout of a client tool: no decision is due before it.
	decisionSweep      sweepCursor
	minDecisionTimeout time.Duration
	// leases are the run leases the engine holds (runleases.go).
	leases *runLeases
}

type registeredAgent struct {
	Agent
	tools map[string]registeredTool
}

type registeredTool struct {
	Tool
	desc contracts.ToolDescriptor
	args *contracts.ArgumentValidator
}

// New checks the configuration and returns an Engine. It panics on nothing:
// a bad configuration is an error.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil || cfg.Approvals == nil {
		return nil, errors.New("engine: Store and Approvals are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 250 * time.Millisecond
	}
	if cfg.DefaultToolTimeout <= 0 {
		cfg.DefaultToolTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxAttemptsPerAction <= 0 {
		cfg.MaxAttemptsPerAction = 5
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = defaultRetryMin
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = defaultRetryMax
	}
	if cfg.RetryMax < cfg.RetryMin {
		return nil, errors.New("engine: RetryMax is shorter than RetryMin")
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = defaultLogInterval
	}
	if cfg.Owner == "" {
		cfg.Owner = DefaultOwner()
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = defaultLeaseTTL
	}
	if cfg.Health == nil {
		cfg.Health = storehealth.New(storehealth.Config{Now: cfg.Now, Logger: cfg.Logger, LogInterval: cfg.LogInterval})
	}
	if cfg.Redactor == nil {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("engine: redaction key: %w", err)
		}
		r, err := redact.NewRedactor(key)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		cfg.Redactor = r
	}
	if len(cfg.AttemptTokenKey) == 0 {
		cfg.AttemptTokenKey = make([]byte, 32)
		if _, err := rand.Read(cfg.AttemptTokenKey); err != nil {
			return nil, fmt.Errorf("engine: attempt token key: %w", err)
		}
	}
	e := &Engine{store: cfg.Store, tokenKey: cfg.AttemptTokenKey, approvals: cfg.Approvals, agents: map[string]*registeredAgent{},
		now: cfg.Now, cfg: cfg, log: cfg.Logger, calls: map[ledger.RunID]func(){},
		notBefore: map[ledger.RunID]time.Time{}, failures: map[ledger.RunID]int{}, policy: cfg.Policy.WithDefaults(),
		health: cfg.Health, backoff: backoff{min: cfg.RetryMin, max: cfg.RetryMax},
		failLogs: storehealth.NewFailureLog(cfg.Logger, cfg.Now, cfg.LogInterval)}
	e.leases = newRunLeases(e, cfg.Owner, cfg.LeaseTTL)
	for _, a := range cfg.Agents {
		switch a.Driver {
		case "":
			a.Driver = DriverBuiltin
		case DriverBuiltin, DriverClient:
		default:
			return nil, fmt.Errorf("engine: agent %s: unknown driver %q", a.Name, a.Driver)
		}
		if a.Name == "" || a.Driver == DriverBuiltin && a.NewModel == nil {
			return nil, errors.New("engine: an agent needs a name, and a built-in one a model")
		}
		if _, dup := e.agents[a.Name]; dup {
			return nil, fmt.Errorf("engine: agent %q registered twice", a.Name)
		}
		ra := &registeredAgent{Agent: a, tools: map[string]registeredTool{}}
		for _, t := range a.Tools {
			d := t.Descriptor()
			if _, client := LeaseOf(t); a.Driver == DriverClient && !client {
				return nil, fmt.Errorf("engine: agent %s: tool %s: a client-driven agent's tools are made with ClientTool", a.Name, d.Name)
			}
			v, err := d.ArgumentValidator()
			if err != nil {
				return nil, fmt.Errorf("engine: agent %s: tool %s: %w", a.Name, d.Name, err)
			}
			if _, dup := ra.tools[d.Name]; dup {
				return nil, fmt.Errorf("engine: agent %s: tool %q registered twice", a.Name, d.Name)
			}
			ra.tools[d.Name] = registeredTool{Tool: t, desc: d, args: v}
			if l, client := LeaseOf(t); client && (e.minDecisionTimeout == 0 || l.DecisionTimeout < e.minDecisionTimeout) {
				e.minDecisionTimeout = l.DecisionTimeout
			}
		}
		e.agents[a.Name] = ra
		if a.Driver == DriverClient {
			e.clientAgents = append(e.clientAgents, a.Name)
		}
	}
	slices.Sort(e.clientAgents)
	e.recoverer = recovery.New(recovery.Config{Store: cfg.Store, Probes: e.probe, Retry: e.retryVerdict, Now: cfg.Now,
		OnDecision: cfg.OnDecision, ProbeTimeout: probeTimeout, Lease: e.scanLease, Done: e.scanDone, Guard: e.probeGuard})
	return e, nil
}

// probe gives recovery what a registered tool guarantees and can answer.
func (e *Engine) probe(name, version string) (recovery.Probe, bool) {
	for _, a := range e.agents {
		t, ok := a.tools[name]
		if !ok || t.desc.Version != version {
			continue
		}
		p := recovery.Probe{Tool: recovery.ToolFor(t.desc)}
		if lease, client := LeaseOf(t.Tool); client {
			// The agent asks its tool for recovery (the agent protocol).
			p.Client = true
			p.Tool.DecisionTimeout = lease.DecisionTimeout
			return p, true
		}
		if broken("retry_unknown") {
			p.Tool.Guarantees.Dedup = true
		}
		// What a tool answers a probe is recorded as evidence: redacted
		// first, its errors too (their text reaches rationales).
		if q, ok := t.Tool.(Querier); ok && t.desc.Guarantees.Query {
			p.QueryFunc = func(ctx context.Context, key string) (ledger.EffectFact, json.RawMessage, error) {
				r, err := q.Query(ctx, key)
				return r.Effect, e.redactJSON(r.Output), e.redactErr(err)
			}
		}
		if c, ok := t.Tool.(Canceller); ok && t.desc.Guarantees.Cancel {
			p.CancelFunc = func(ctx context.Context, key string) (bool, json.RawMessage, error) {
				r, err := c.Cancel(ctx, key)
				return r.Confirmed, e.redactJSON(r.Detail), e.redactErr(err)
			}
		}
		return p, true
	}
	return recovery.Probe{}, false
}

// retryVerdict is the budget's answer to "may this action have one more
// attempt?": the run's persisted budgets under its agent's policy, then the
// engine's cap.
func (e *Engine) retryVerdict(run *ledger.Run, a *ledger.Action, now time.Time) (ledger.StopReason, string) {
	policy := e.policy
	if agent, ok := e.agents[run.Agent]; ok {
		policy = e.policyOf(agent)
	}
	if v := policy.BeforeAttempt(run, a, now); v.Stopped() {
		return v.Stop, v.Rationale
	}
	if run.Budget.Limits.MaxAttemptsPerAction == 0 && a.AttemptCount >= e.cfg.MaxAttemptsPerAction {
		return ledger.StopRetryBudgetExhausted, fmt.Sprintf("action %s used %d attempts, the engine's cap when the run sets none", a.ID, a.AttemptCount)
	}
	return "", ""
}

// Recover runs the recovery scan: every approved, running or uncertain
// action of a live run whose lease this process can claim gets its
// decision, recorded with its rationale, and acted on; a run another
// process holds is that process's to recover (ScanReport.Held). Call it at
// start-up, before Start.
func (e *Engine) Recover(ctx context.Context) (recovery.ScanReport, error) {
	stop := e.leases.keep(ctx)
	defer stop()
	return e.recoverer.Scan(ctx)
}

// scanLease claims the runs of a page of the recovery scan and returns the
// context to recover each one it got with, under its lease.
func (e *Engine) scanLease(ctx context.Context, runs []ledger.RunID) (map[ledger.RunID]context.Context, error) {
	var live []ledger.RunState
	for _, st := range ledger.RunStates() {
		if !st.Terminal() {
			live = append(live, st)
		}
	}
	// Long enough for a probe without extending the lease first.
	ttl := probeTimeout + 2*e.leases.margin()
	got, err := e.leases.claim(ctx, ledger.ClaimRunsParams{Limit: len(runs), States: live, Runs: runs, TTL: ttl})
	if err != nil {
		return nil, err
	}
	out := make(map[ledger.RunID]context.Context, len(got))
	for _, l := range got {
		if wctx, _, ok := e.leases.work(ctx, l.Run); ok {
			out[l.Run] = wctx // its work ends with the release (scanDone)
		}
	}
	return out, nil
}

// probeTimeout bounds each query or cancel recovery makes of a tool.
const probeTimeout = 10 * time.Second

// scanDone releases a run the recovery scan recovered.
func (e *Engine) scanDone(ctx context.Context, run ledger.RunID) { e.leases.release(ctx, run) }

// probeGuard lets recovery query or cancel a tool only while the lease of
// the run it recovers outlasts the probe by the margin.
func (e *Engine) probeGuard(ctx context.Context, timeout time.Duration) error {
	ok, err := e.leases.outlasts(ctx, timeout+e.leases.margin())
	if err == nil && !ok {
		err = fmt.Errorf("%w: the run's lease cannot be made to outlast the probe", ledger.ErrLeaseLost)
	}
	return err
}

// Leases is what the engine's lease loop last did (for /readyz).
func (e *Engine) Leases() LeaseStatus { return e.leases.Status() }

// Owner is this process's name as the holder of run leases.
func (e *Engine) Owner() string { return e.leases.owner }

// Health is the store's health (Config.Health).
func (e *Engine) Health() *storehealth.Tracker { return e.health }

// HasAgent reports whether runs may name agent.
func (e *Engine) HasAgent(name string) bool { _, ok := e.agents[name]; return ok }

// AgentInfo is what the engine knows of a registered agent, for listing.
type AgentInfo struct {
	Name    string
	Driver  Driver
	Tenants []string // empty: every tenant
	// Tools are the agent's tools' descriptors, in registration order.
	Tools []contracts.ToolDescriptor
	// Policy is the loop-policy thresholds its runs are held to.
	Policy budget.Policy
}

// Agents lists the registered agents in name order.
func (e *Engine) Agents() []AgentInfo {
	out := make([]AgentInfo, 0, len(e.agents))
	for _, a := range e.agents {
		out = append(out, e.infoOf(a))
	}
	slices.SortFunc(out, func(x, y AgentInfo) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// AgentFor reports whether runs of tenant may name agent: it is registered
// and allows the tenant.
func (e *Engine) AgentFor(name, tenant string) (AgentInfo, bool) {
	a, ok := e.agents[name]
	if !ok || len(a.Tenants) > 0 && !slices.Contains(a.Tenants, tenant) {
		return AgentInfo{}, false
	}
	return e.infoOf(a), true
}

// infoOf is what Agents and AgentFor show of a registered agent.
func (e *Engine) infoOf(a *registeredAgent) AgentInfo {
	info := AgentInfo{Name: a.Name, Driver: a.Driver, Tenants: slices.Clone(a.Tenants), Policy: e.policyOf(a)}
	for _, t := range a.Agent.Tools {
		info.Tools = append(info.Tools, t.Descriptor())
	}
	return info
}

// policyOf is the loop policy of an agent's runs: its own thresholds, the
// engine's where it sets none, budget's defaults where neither does.
func (e *Engine) policyOf(a *registeredAgent) budget.Policy {
	p := a.Policy
	if p.RepeatLimit <= 0 {
		p.RepeatLimit = e.policy.RepeatLimit
	}
	if p.NoProgressWindow <= 0 {
		p.NoProgressWindow = e.policy.NoProgressWindow
	}
	if p.ConsecutiveErrors <= 0 {
		p.ConsecutiveErrors = e.policy.ConsecutiveErrors
	}
	return p.WithDefaults()
}

// Tool returns the descriptor of a tool any agent registered.
func (e *Engine) Tool(name string) (contracts.ToolDescriptor, bool) {
	for _, a := range e.agents {
		if t, ok := a.tools[name]; ok {
			return t.desc, true
		}
	}
	return contracts.ToolDescriptor{}, false
}

// Advance drives one run until it ends or waits for something outside the
// engine (a person's approval or review). It is safe to call again at any
// point, including after a crash: every step it takes is derived from the
// ledger, and every write is idempotent or guarded.
func (e *Engine) Advance(ctx context.Context, id ledger.RunID) error {
	conflicts := 0
	// What this Advance knows of the run from one step to the next; each
	// step reads the run, and the rest only if the run's chain moved in a
	// way the view did not follow (runview.go).
	var v runView
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		run, err := e.store.FindRunByID(ctx, id)
		if err != nil {
			return fmt.Errorf("advance %s: %w", id, err)
		}
		v.at(run)
		more, err := e.step(ctx, run, &v)
		if errors.Is(err, ledger.ErrConflict) && !errors.Is(err, ledger.ErrLeaseLost) && conflicts < 3 {
			// Someone moved the run underneath (a cancel, an approval, a
			// person's resolution): read it again and go on from there.
			conflicts++
			v.drop()
			continue
		}
		if err != nil {
			return fmt.Errorf("advance %s: %w", id, err)
		}
		conflicts = 0
		if !more {
			return nil
		}
	}
}

// step takes one step of run, of which v is what this Advance knows, and
// reports whether another may follow.
func (e *Engine) step(ctx context.Context, run *ledger.Run, v *runView) (bool, error) {
	if run.State.Terminal() {
		return false, nil
	}
	c, err := v.cancellation(ctx, e.store, run.ID)
	switch {
	case err != nil:
		return false, err
	case c != nil && (c.State == ledger.CancelAccepted || c.State == ledger.CancelStopping ||
		c.State == ledger.CancelStopped && run.State == ledger.RunStopping):
		return e.stepCancel(ctx, run, c)
	}
	switch run.State {
	case ledger.RunQueued:
		if _, ok := e.agents[run.Agent]; !ok {
			return false, e.finish(ctx, run, ledger.StopInternalError, map[string]any{"error": "agent " + run.Agent + " is not registered"})
		}
		return e.moveRun(ctx, run, ledger.RunRunning, nil)
	case ledger.RunRunning:
		return e.stepRunning(ctx, run, v)
	default:
		// awaiting_approval and needs_review wait for a person; stopping and
		// the terminal states are not the engine's to advance here.
		return false, nil
	}
}

func (e *Engine) stepRunning(ctx context.Context, run *ledger.Run, v *runView) (bool, error) {
	agent, ok := e.agents[run.Agent]
	if !ok {
		return false, e.finish(ctx, run, ledger.StopInternalError, map[string]any{"error": "agent " + run.Agent + " is not registered"})
	}
	if agent.Driver == DriverClient {
		return false, nil // its client takes every step (protocol_steps.go)
	}
	actions, err := v.findActions(ctx, e.store, run.ID)
	if err != nil {
		return false, err
	}
	last := current(actions)
	if last != nil {
		switch last.State {
		case ledger.ActionApproved:
			return e.attempt(ctx, run, agent, last, v)
		case ledger.ActionAwaitingApproval, ledger.ActionProposed:
			more, err := e.moveRun(ctx, run, ledger.RunAwaitingApproval, map[string]any{"action_id": last.ID})
			if err == nil {
				e.fault(FaultAwaitingApproval)
			}
			return more, err
		case ledger.ActionDenied:
			reason := ledger.StopPolicyDenied
			if decided, err := e.store.FindApprovals(ctx, ledger.ApprovalFilter{ActionID: &last.ID, State: ptr(ledger.ApprovalDenied)}); err != nil {
				return false, err
			} else if len(decided) > 0 {
				reason = ledger.StopApprovalDenied
			}
			return false, e.finish(ctx, run, reason, map[string]any{"action_id": last.ID})
		case ledger.ActionExpired:
			return false, e.finish(ctx, run, ledger.StopApprovalExpired, map[string]any{"action_id": last.ID})
		case ledger.ActionRunning, ledger.ActionUncertain:
			// Running here means the process that started the attempt died
			// (this one runs each run in one worker); uncertain means the
			// call ended without an established effect. Either way the
			// recovery table decides, with the tool's guarantees.
			return e.recover(ctx, run, last)
		case ledger.ActionNeedsReview:
			return e.moveRun(ctx, run, ledger.RunNeedsReview, map[string]any{"action_id": last.ID})
		case ledger.ActionFailed:
			if !agent.ContinueOnToolError {
				return false, e.finish(ctx, run, ledger.StopToolError, map[string]any{"action_id": last.ID})
			}
			// The failure is the model's to answer: on to its next step.
		case ledger.ActionAbandoned:
			return false, e.finish(ctx, run, ledger.StopUserCancelled, map[string]any{"action_id": last.ID, "cause": "a person abandoned the action in review"})
		case ledger.ActionCancelled:
			return false, e.finish(ctx, run, ledger.StopUserCancelled, map[string]any{"action_id": last.ID})
		}
	}
	if v := e.policyOf(agent).BeforeStep(run, e.now()); v.Stopped() {
		return false, e.finish(ctx, run, v.Stop, map[string]any{"rationale": v.Rationale})
	}
	return e.modelStep(ctx, run, agent, actions, v)
}

// recover applies the recovery table to an action whose outcome is not
// settled, and says whether the run can go on now.
func (e *Engine) recover(ctx context.Context, run *ledger.Run, a *ledger.Action) (bool, error) {
	d, err := e.recoverer.Recover(ctx, run, a)
	if err != nil {
		return false, err
	}
	switch d.Kind {
	case recovery.Wait:
		e.deferRun(run.ID, 2*time.Second)
		return false, nil
	case recovery.Review, recovery.Stop:
		return false, nil
	default:
		return true, nil
	}
}

// deferRun keeps the pool away from a run for a while (recovery said wait).
func (e *Engine) deferRun(id ledger.RunID, d time.Duration) {
	e.callsMu.Lock()
	e.notBefore[id] = e.now().Add(d)
	e.callsMu.Unlock()
}

// deferred reports whether the pool should leave a run alone for now.
func (e *Engine) deferred(id ledger.RunID) bool {
	e.callsMu.Lock()
	defer e.callsMu.Unlock()
	t, ok := e.notBefore[id]
	if ok && !e.now().Before(t) {
		delete(e.notBefore, id)
		return false
	}
	return ok
}

// current is the action the run is on: the last one recorded that was not
// superseded by a later one.
func current(actions []*ledger.Action) *ledger.Action {
	for i := len(actions) - 1; i >= 0; i-- {
		if actions[i].State != ledger.ActionSuperseded {
			return actions[i]
		}
	}
	return nil
}

// modelStep asks the model for the next step and records it: an action
// through the gate, or the final answer.
func (e *Engine) modelStep(ctx context.Context, run *ledger.Run, agent *registeredAgent, actions []*ledger.Action, v *runView) (bool, error) {
	model, err := agent.NewModel(run.Input)
	if err != nil {
		return false, e.finish(ctx, run, ledger.StopInvalidModelResponse, map[string]any{"error": err.Error()})
	}
	hist, err := e.history(ctx, run, actions, v)
	if err != nil {
		return false, err
	}
	started := e.now()
	s, err := model.Next(ctx, hist)
	took := e.now().Sub(started)
	usage := ledger.AddUsageParams{RunID: run.ID, Steps: 1, Execution: max(took, 0), TokensUnavailable: s.Usage == nil}
	if s.Usage != nil {
		usage.Tokens = s.Usage.InputTokens + s.Usage.OutputTokens
	}
	// A step that records an action adds its usage in the action's own
	// transaction (counted once, even when the step is replayed); every
	// other step records it alone, first.
	if err != nil || s.Kind != StepToolCall {
		if _, uerr := e.store.AddUsage(ctx, usage); uerr != nil {
			return false, uerr
		}
	}
	failStep := func(reason ledger.StopReason, data map[string]any) error {
		if _, uerr := e.store.AddUsage(ctx, usage); uerr != nil {
			return uerr
		}
		return e.finish(ctx, run, reason, data)
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, e.finish(ctx, run, ledger.StopProviderError, map[string]any{"error": err.Error()})
	}
	switch s.Kind {
	case StepFinal:
		var answer any = json.RawMessage(`null`)
		if len(s.Final) > 0 {
			if err := ledger.CheckJSON(s.Final); err != nil {
				return false, e.finish(ctx, run, ledger.StopInvalidModelResponse, map[string]any{"error": "final answer: " + err.Error()})
			}
			answer = s.Final
		}
		return false, e.finish(ctx, run, ledger.StopCompleted, map[string]any{"final": answer})
	case StepToolCall:
		res, tool, err := e.propose(ctx, proposal{run: run, agent: agent, actions: actions,
			stepKey: fmt.Sprintf("step-%d", len(actions)+1), tool: s.Tool, arguments: s.Arguments,
			usage: usage, actor: "engine", execute: true, fingerprint: v.fingerprint})
		var pe *ProtocolError
		if errors.As(err, &pe) {
			switch pe.Code {
			case CodeRunStopped: // a budget or loop policy stopped the run
				return false, nil
			case CodeUnknownTool, CodeToolNotAllowed, CodeInvalidArgs:
				// The model's mistake: the run stops with it.
				return false, failStep(ledger.StopInvalidModelResponse, map[string]any{"error": refusalText(pe)})
			}
		}
		if err != nil {
			return false, err
		}
		v.created(res)
		if res.Attempt != nil {
			return e.callTool(ctx, run, tool, res.Action, res.Attempt, v)
		}
		return true, nil
	default:
		return false, e.finish(ctx, run, ledger.StopInvalidModelResponse, map[string]any{"error": fmt.Sprintf("unknown step kind %q", s.Kind)})
	}
}

// history rebuilds what the model has seen from the ledger alone: the
// actions and their last attempts as the ledger holds them (read, or
// returned by the writes that wrote them, runview.go). The model gets
// copies, so that nothing it does to them reaches the view.
func (e *Engine) history(ctx context.Context, run *ledger.Run, actions []*ledger.Action, v *runView) (History, error) {
	h := History{RunID: run.ID, Input: run.Input}
	lastAttempt, err := v.lastAttempts(ctx, e.store, run.ID)
	if err != nil {
		return h, err
	}
	if len(actions) > 0 {
		h.Entries = make([]HistoryEntry, len(actions))
	}
	for i, a := range actions {
		ac := *a
		h.Entries[i].Action = &ac
		if att := lastAttempt[a.ID]; att != nil {
			attc := *att
			h.Entries[i].Attempt = &attc
		}
	}
	return h, nil
}

// attempt records an attempt durably, then calls the tool with the action's
// dedup key, then records the outcome and the tool's observation.
func (e *Engine) attempt(ctx context.Context, run *ledger.Run, agent *registeredAgent, a *ledger.Action, v *runView) (bool, error) {
	tool, ok := agent.tools[a.Tool]
	if !ok {
		return false, e.finish(ctx, run, ledger.StopInternalError, map[string]any{"action_id": a.ID,
			"error": fmt.Sprintf("tool %s is no longer registered with agent %s: approved action %s (version %s) cannot run", a.Tool, agent.Name, a.ID, a.ToolVersion)})
	}
	// An approval that drifted (the tool changed, the rules changed) goes
	// through the gate again as a new action; one past its execute_by
	// asks a person again (StartAttempt's ErrApprovalStale, below). Either
	// way the next step finds the action, or the one that supersedes it,
	// waiting as any other.
	if why, err := e.drift(ctx, run, a, tool); err != nil {
		return false, err
	} else if why != "" {
		if _, err := e.regate(ctx, run, a, tool, why); errors.Is(err, errArgumentsDrifted) {
			return false, e.finish(ctx, run, ledger.StopInternalError, map[string]any{"action_id": a.ID, "error": err.Error()})
		} else if err != nil {
			return false, err
		}
		return true, nil
	}
	if reason, why := e.retryVerdict(run, a, e.now()); reason != "" {
		return false, e.finish(ctx, run, reason, map[string]any{"action_id": a.ID, "rationale": why})
	}
	if err := e.leaseForCall(ctx, tool); err != nil {
		return false, err
	}
	e.fault(FaultBeforeAttemptRecorded)
	var early *Result // only a broken test build calls the tool before recording the attempt
	var earlyErr error
	if broken("call_before_record") {
		r, err := tool.Execute(ctx, Call{RunID: run.ID, ActionID: a.ID, DedupKey: a.DedupKey, FencingToken: fencingToken(ctx), Arguments: a.Arguments})
		early, earlyErr = &r, err
		e.fault(FaultAfterToolCall)
	}
	att, err := e.store.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.ID, Actor: "engine"})
	switch {
	case errors.Is(err, ledger.ErrBudgetExceeded):
		// The store's own guard: another process spent the budget first.
		return false, e.finish(ctx, run, ledger.StopRetryBudgetExhausted, map[string]any{"action_id": a.ID, "error": err.Error()})
	case errors.Is(err, ledger.ErrLeaseLost):
		return false, err
	case errors.Is(err, ledger.ErrApprovalStale):
		if _, err := e.reask(ctx, run, a, tool, err); err != nil {
			return false, err
		}
		return true, nil
	case errors.Is(err, ledger.ErrConflict):
		return true, nil // a cancel was accepted meanwhile: the next step handles it
	case err != nil:
		return false, err
	}
	// StartAttempt's write is not one the view follows, so neither is
	// the outcome's: the next step reads the run afresh.
	if early != nil {
		return e.finishCall(ctx, run, tool, a, att, *early, earlyErr, false, 0, v)
	}
	return e.callTool(ctx, run, tool, a, att, v)
}

// callTimeout is how long a call of tool may take.
func (e *Engine) callTimeout(tool registeredTool) time.Duration {
	if t := tool.desc.Timeout(); t > 0 {
		return t
	}
	return e.cfg.DefaultToolTimeout
}

// leaseForCall makes sure the lease of the run ctx works on outlasts a
// call of tool by the margin, extending it if need be, so that no other
// process can claim the run (and recover the attempt) while the call may
// still be running: callTool sets the call's deadline before it asks.
// Nil if ctx carries no lease.
func (e *Engine) leaseForCall(ctx context.Context, tool registeredTool) error {
	ok, err := e.leases.outlasts(ctx, e.callTimeout(tool)+e.leases.margin())
	if err == nil && !ok {
		err = fmt.Errorf("call %s: the run's lease cannot be made to outlast the call", tool.desc.Name)
	}
	return err
}

// callTool calls the tool for an attempt recorded durably, then records
// the outcome and the tool's observation; v follows the write. It does
// not call the tool if the run's lease cannot be made to outlast the call:
// the attempt, recorded and never called, is then recovered by whoever
// holds the run next, as after a crash at that point.
//
// The call's deadline is set before the lease check, which then makes the
// lease outlast it by the margin: a process paused between the check and
// the call wakes with the deadline it had, passed by then if another
// process could take the run over meanwhile, never with a fresh one. The
// call carries the lease's fencing token for a tool that cannot see the
// deadline.
func (e *Engine) callTool(ctx context.Context, run *ledger.Run, tool registeredTool, a *ledger.Action, att *ledger.Attempt, v *runView) (bool, error) {
	e.fault(FaultAfterAttemptRecorded)
	callCtx, cancelTimeout := context.WithTimeout(ctx, e.callTimeout(tool))
	defer cancelTimeout()
	if err := e.leaseForCall(ctx, tool); err != nil {
		return false, err
	}
	e.fault(FaultBeforeToolCall)
	callCtx, cancelCall := context.WithCancelCause(callCtx)
	untrack := e.trackCall(run.ID, func() { cancelCall(errRunCancelled) })
	started := e.now()
	res, callErr := tool.Execute(callCtx, Call{RunID: run.ID, ActionID: a.ID, Attempt: att.No, DedupKey: a.DedupKey,
		FencingToken: fencingToken(ctx), Arguments: a.Arguments})
	took := e.now().Sub(started)
	untrack()
	cancelledByRun := errors.Is(context.Cause(callCtx), errRunCancelled)
	cancelCall(nil)
	cancelTimeout()
	e.fault(FaultAfterToolCall)
	return e.finishCall(ctx, run, tool, a, att, res, callErr, cancelledByRun, took, v)
}

// fencingToken is the fencing token of the run lease ctx carries, 0 if it
// carries none.
func fencingToken(ctx context.Context) int64 {
	l, _ := ledger.RunLeaseFrom(ctx)
	return l.Token
}

// toolCalled tells Config.OnToolCall of a call.
func (e *Engine) toolCalled(tool string, status ledger.AttemptStatus, took time.Duration) {
	if e.cfg.OnToolCall != nil {
		e.cfg.OnToolCall(ToolCallStats{Tool: tool, Status: status, Duration: max(took, 0)})
	}
}

// finishCall records what a call answered; took is how long the tool
// took; v follows the write.
func (e *Engine) finishCall(ctx context.Context, run *ledger.Run, tool registeredTool, a *ledger.Action, att *ledger.Attempt,
	res Result, callErr error, cancelledByRun bool, took time.Duration, v *runView) (bool, error) {
	if leaseLost(ctx) {
		// Another process may hold the run now: what the call answered is
		// evidence for its recovery, not this worker's to record.
		fin := outcome(tool.desc, e.redactResult(res), e.redactErr(callErr))
		if errors.Is(callErr, context.Canceled) {
			fin = ledger.FinishAttemptParams{Status: ledger.AttemptCancelled,
				Error:       &ledger.AttemptError{Code: "lease_lost", Message: "the worker lost the run's lease and cancelled the call"},
				Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}}
		}
		return false, e.staleOutcome(ctx, tool, att, fin)
	}
	if callErr != nil && ctx.Err() != nil {
		// We are shutting down, not the tool failing: leave the attempt
		// started; recovery finds it and decides with the tool's guarantees.
		e.toolCalled(tool.desc.Name, ledger.AttemptStarted, took)
		return false, ctx.Err()
	}
	fin := outcome(tool.desc, e.redactResult(res), e.redactErr(callErr))
	if callErr != nil && cancelledByRun {
		fin = ledger.FinishAttemptParams{Status: ledger.AttemptCancelled,
			Error:       &ledger.AttemptError{Code: "cancelled", Message: "the run was cancelled during the call"},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}}
	}
	fin.AttemptID, fin.Actor = att.ID, "engine"
	e.toolCalled(tool.desc.Name, fin.Status, took)
	done, err := e.store.FinishAttempt(ctx, fin)
	if err != nil {
		if e.refusedForLease(ctx, err) {
			return false, e.staleOutcome(ctx, tool, att, fin)
		}
		return false, err
	}
	v.finished(done)
	e.fault(FaultAfterResultRecorded)
	switch done.Action.State {
	case ledger.ActionFailed:
		if agent, ok := e.agents[run.Agent]; ok && agent.ContinueOnToolError {
			return true, nil // the model answers the failure (stepRunning)
		}
		return false, e.finish(ctx, run, ledger.StopToolError, map[string]any{"action_id": a.ID, "error": fin.Error})
	case ledger.ActionNeedsReview: // the call failed but took effect: the run waits for a person
		return false, nil
	default: // succeeded: the next model step; uncertain: recovery decides
		return true, nil
	}
}

// redactResult is res with its output redacted, as it is stored.
func (e *Engine) redactResult(res Result) Result {
	res.Output = e.redactJSON(res.Output)
	return res
}

// refusedForLease reports whether a write of the run ctx works on failed
// with err because the worker lost the run's lease: the store fenced it
// (ErrLeaseLost); or the engine, learning of the loss while the write was
// out, cancelled it (the write then fails with the context's error); or
// the new holder got there first and the write was refused as a plain
// conflict (an attempt its recovery closed already), the run's token being
// another's now. Its caller keeps the outcome as evidence (staleOutcome)
// in each case, never drops it.
func (e *Engine) refusedForLease(ctx context.Context, err error) bool {
	if errors.Is(err, ledger.ErrLeaseLost) || leaseLost(ctx) {
		return true
	}
	l, ok := ledger.RunLeaseFrom(ctx)
	if !ok || ledger.Code(err) != ledger.CodeConflict {
		return false
	}
	rctx, cancel := e.leases.lateWrite(ctx)
	defer cancel()
	now, ferr := e.store.FindRunLease(rctx, l.Run)
	if ferr != nil {
		e.log.WarnContext(ctx, "read the run's lease after a refused write", "run", l.Run, "err", ferr)
		return false
	}
	return now.Token != l.Token
}

// staleOutcome records the outcome of a call that reached this worker
// after it lost the run's lease, as an observation with source
// stale_holder (an effect it establishes is written on the attempt),
// instead of finishing the attempt: the run's new holder recovers the
// attempt and finds it there. It returns the lost lease as the error.
func (e *Engine) staleOutcome(ctx context.Context, tool registeredTool, att *ledger.Attempt, fin ledger.FinishAttemptParams) error {
	lost := fmt.Errorf("attempt %s of %s: %w", att.ID, tool.desc.Name, errLeaseLost)
	detail := map[string]any{"status": fin.Status}
	if len(fin.Result) > 0 {
		detail["result"] = fin.Result
	}
	if fin.Error != nil {
		detail["error"] = fin.Error
	}
	body, err := json.Marshal(detail)
	if err != nil {
		return errors.Join(lost, err)
	}
	effect := ledger.EffectUnknown
	if fin.Observation != nil {
		effect = fin.Observation.Effect
	}
	// Unfenced (the lease is lost) and written even though the worker's
	// context is cancelled.
	wctx, cancel := e.leases.lateWrite(ctx)
	defer cancel()
	p := ledger.RecordObservationParams{AttemptID: att.ID, Source: ledger.ObservedStaleHolder, Effect: effect, Detail: body, Actor: "engine"}
	_, _, err = e.store.RecordObservation(wctx, p)
	if ledger.Code(err) == ledger.CodeConflict && effect != ledger.EffectUnknown {
		// The new holder established the effect otherwise: the evidence is
		// kept, the established fact stands.
		p.Effect = ledger.EffectUnknown
		_, _, err = e.store.RecordObservation(wctx, p)
	}
	if err != nil {
		return errors.Join(lost, fmt.Errorf("record the outcome as stale_holder: %w", err))
	}
	e.log.WarnContext(ctx, "a call's outcome reached this worker after it lost the run's lease: kept as a stale_holder observation",
		"attempt", att.ID, "tool", tool.desc.Name, "status", fin.Status, "effect", effect)
	return lost
}

func (e *Engine) fault(p FaultPoint) {
	if e.cfg.FaultFunc != nil {
		e.cfg.FaultFunc(p)
	}
}

// outcome turns a tool's answer into the facts to record: the status of the
// call and the effect with the observation that established it. Where the
// action goes is the ledger's outcome table (ledger.OutcomeOf); an answer
// the table refuses (a write that succeeded without taking effect) is
// recorded as a failed call whose effect is unknown, for recovery to
// establish.
func outcome(d contracts.ToolDescriptor, res Result, err error) ledger.FinishAttemptParams {
	fin := answered(d, res, err)
	if _, terr := ledger.OutcomeOf(d.Effect, fin.Status, fin.Observation.Effect); terr != nil {
		return ledger.FinishAttemptParams{Status: ledger.AttemptFailed,
			Error:       &ledger.AttemptError{Code: "outcome_not_allowed", Message: "the tool's answer is not an outcome: " + terr.Error()},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown, Detail: fin.Result}}
	}
	return fin
}

// answered is the tool's answer as it was given.
func answered(d contracts.ToolDescriptor, res Result, err error) ledger.FinishAttemptParams {
	var te *ToolError
	switch {
	case err == nil:
		effect := res.Effect
		if effect == "" {
			effect = ledger.EffectHappened
			if d.Effect == contracts.EffectRead {
				effect = ledger.EffectNotHappened
			}
		}
		return ledger.FinishAttemptParams{Status: ledger.AttemptSucceeded, Result: res.Output,
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: effect, Detail: res.Output}}
	case errors.Is(err, context.DeadlineExceeded):
		return ledger.FinishAttemptParams{Status: ledger.AttemptTimedOut,
			Error:       &ledger.AttemptError{Code: "timeout", Message: "the tool did not answer in time"},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}}
	case errors.As(err, &te):
		effect := te.Effect
		if effect == "" {
			effect = ledger.EffectUnknown
		}
		return ledger.FinishAttemptParams{Status: ledger.AttemptFailed,
			Error:       &ledger.AttemptError{Code: te.Code, Message: te.Message},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: effect}}
	default:
		return ledger.FinishAttemptParams{Status: ledger.AttemptFailed,
			Error:       &ledger.AttemptError{Code: "tool_error", Message: err.Error()},
			Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectUnknown}}
	}
}

// moveRun moves a running run; true means the engine may go on.
func (e *Engine) moveRun(ctx context.Context, run *ledger.Run, to ledger.RunState, data any) (bool, error) {
	_, err := e.store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: run.State, To: to, Actor: "engine", Data: data})
	if err != nil {
		return false, err
	}
	return to == ledger.RunRunning, nil
}

// finish ends a run with a stop reason, in the state the reason belongs to.
func (e *Engine) finish(ctx context.Context, run *ledger.Run, reason ledger.StopReason, data map[string]any) error {
	if data == nil {
		data = map[string]any{}
	}
	data["stop_reason"] = reason
	// Error texts from tools and models end up here: the event is
	// append-only and hash-chained, so a secret in it could never be
	// removed. Redact before it is written.
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("finish %s: %w", run.ID, err)
	}
	_, err = e.store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: run.State, To: reason.TerminalState(),
		StopReason: reason, Actor: "engine", Data: e.redactJSON(raw)})
	if err == nil {
		e.log.Info("run finished", "run", run.ID, "state", reason.TerminalState(), "stop_reason", reason)
	}
	return err
}

// redactJSON hides secrets in a tool's or model's JSON before it is
// stored. A document that cannot be redacted is not stored at all.
func (e *Engine) redactJSON(doc json.RawMessage) json.RawMessage {
	if len(doc) == 0 {
		return doc
	}
	out, err := e.cfg.Redactor.RedactJSON(doc, nil)
	if err != nil {
		return json.RawMessage(`{"unrecorded":"the output could not be redacted, so it was not kept"}`)
	}
	return out
}

// redactErr keeps an error's kind (timeouts, tool errors) and hides
// secrets in its text.
func (e *Engine) redactErr(err error) error {
	if err == nil {
		return nil
	}
	var te *ToolError
	if errors.As(err, &te) {
		c := *te
		c.Message = e.cfg.Redactor.RedactString(c.Message)
		return &c
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	return errors.New(e.cfg.Redactor.RedactString(err.Error()))
}

func ptr[T any](v T) *T { return &v }
