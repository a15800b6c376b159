package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	// Tools are tools the engine calls itself, registered apart from any
	// agent (the config file's http tools, which agents the engine drives
	// may be given): Tool finds them, Tools lists them, and recovery
	// probes an action of theirs whichever agent recorded it. An agent
	// calls only the tools of its own Agent.Tools: listing one of these
	// there is how it gets to use it. A name appears once here, and an
	// agent's tool of the same name must have the same descriptor. Client
	// tools (ClientTool) are an agent's process's, never here.
	Tools []Tool
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
	// frontDriven names the agents whose running runs a front end drives
	// (a client through the agent protocol, or a gateway's caller), in
	// name order: the pool does not claim those.
	frontDriven []string
	// runGens is the generation of each gateway run key last opened
	// (OpenRun), under callsMu.
	runGens map[string]runGen
	// decisionSweep is the sweep's place in the told, unanswered decisions
	// (sweepDecisions), and minDecisionTimeout the shortest decision
	// timeout of a client tool: no decision is due before it.
	decisionSweep      sweepCursor
	minDecisionTimeout time.Duration
	// leases are the run leases the engine holds (runleases.go).
	leases *runLeases
	// tools are Config.Tools, by name.
	tools map[string]registeredTool
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
		notBefore: map[ledger.RunID]time.Time{}, runGens: map[string]runGen{}, failures: map[ledger.RunID]int{}, policy: cfg.Policy.WithDefaults(),
		health: cfg.Health, backoff: backoff{min: cfg.RetryMin, max: cfg.RetryMax},
		failLogs: storehealth.NewFailureLog(cfg.Logger, cfg.Now, cfg.LogInterval)}
	e.leases = newRunLeases(e, cfg.Owner, cfg.LeaseTTL)
	for _, a := range cfg.Agents {
		switch a.Driver {
		case "":
			a.Driver = DriverBuiltin
		case DriverBuiltin, DriverClient, DriverGateway:
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
		if a.Driver == DriverClient || a.Driver == DriverGateway {
			e.frontDriven = append(e.frontDriven, a.Name)
		}
	}
	slices.Sort(e.frontDriven)
	if err := e.registerTools(cfg.Tools); err != nil {
		return nil, err
	}
	e.recoverer = recovery.New(recovery.Config{Store: cfg.Store, Probes: e.probe, Retry: e.retryVerdict, Now: cfg.Now,
		OnDecision: cfg.OnDecision, ProbeTimeout: probeTimeout, Lease: e.scanLease, Done: e.scanDone, Guard: e.probeGuard})
	return e, nil
}

// Leases is what the engine's lease loop last did (for /readyz).
func (e *Engine) Leases() LeaseStatus { return e.leases.Status() }

// Owner is this process's name as the holder of run leases.
func (e *Engine) Owner() string { return e.leases.owner }

// Health is the store's health (Config.Health).
func (e *Engine) Health() *storehealth.Tracker { return e.health }

func ptr[T any](v T) *T { return &v }
