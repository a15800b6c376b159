package main

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/config"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/httptool"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/storehealth"
)

// service is the wired service: the ledger store, the simulator's own
// effect store, the approval service and the engine with the practice-cards
// agent registered, and the config file's agents beside it.
type service struct {
	store     *ledger.DB
	effects   *simulator.EffectStore
	approvals *approval.Service
	engine    *engine.Engine
	log       *slog.Logger
	// redactor hides secrets in what is stored and shown, with
	// LEDGER_REDACTION_KEY when set.
	redactor *redact.Redactor
	// clientTools are the leases of the config file's client tools, by
	// name, for the server's GET /v1/tools.
	clientTools map[string]engine.Lease
	// httpTools are the names of the config file's http tools, which the
	// engine calls over HTTP, for the server's GET /v1/tools.
	httpTools []string
	// gateway is the MCP gateway of the config file's mcp section, or nil.
	gateway *mcpgw.Gateway
}

// serviceConfig says where things live and how they behave.
type serviceConfig struct {
	DBPath      string
	EffectsPath string // "" means defaultEffectsPath(DBPath)
	Simulator   simulator.Config
	// Rules are the approval rules: --rules or the config file's.
	Rules *contracts.Rules
	// Config is the operator's config file (serve --config), or nil: its
	// client agents are registered beside practice-cards, which it may
	// restrict to tenants and give thresholds, and its http tools with the
	// engine (configHTTPTools).
	Config *config.Config
	// DevMode relaxes separation of duties so one person can try the flow.
	DevMode bool
	Logger  *slog.Logger
	// FaultFunc is set only from an explicit fault plan (faults.go).
	FaultFunc func(engine.FaultPoint)
	// WrapStore, if set, wraps the store the engine uses (fault plans).
	WrapStore func(ledger.Store) ledger.Store
	// WriteFault is the ledger store's write hook; set only from an
	// explicit fault plan (faults.go).
	WriteFault func(n int64, at ledger.WritePoint) error
	// OnEffects, if set, is given the simulator's effect store once it
	// is open (a fault plan's stop action).
	OnEffects func(*simulator.EffectStore)
	// OnDecision sees every recovery decision (serve counts them).
	OnDecision func(recovery.Decision)
	// OnCommit sees every group commit of the store, OnToolCall every
	// tool call of the engine (serve's metrics).
	OnCommit   func(ledger.CommitStats)
	OnToolCall func(engine.ToolCallStats)
	// SigningKey, if set, signs each run's chain head (signingkey.go).
	SigningKey ed25519.PrivateKey
	// AllowUnsigned lets a process without SigningKey write to a database
	// whose chain heads are signed, with a warning (checkSigners).
	AllowUnsigned bool
	// Warnings is where the warnings of opening go (checkSigners); nil
	// means Logger. A command whose Logger discards gives its stderr.
	Warnings *slog.Logger
	// LeaseTTL is how long the engine's run leases hold unless renewed;
	// 0 means $LEDGER_LEASE_TTL, or the engine's default.
	LeaseTTL time.Duration
	// ApprovalURL is where the MCP gateway's clients are sent to approve
	// (nil: nowhere); MaxPendingApprovals its cap at a call.
	ApprovalURL         func(ledger.ActionID) string
	MaxPendingApprovals int
}

// envLeaseTTL, a duration ("15s"), is how long the run leases of serve,
// worker, recover and demo hold unless renewed, when serve's --lease-ttl
// is not given.
const envLeaseTTL = "LEDGER_LEASE_TTL"

// envLeaseOwner names the replica in the run leases of serve, worker,
// recover and demo (engine.NamedOwner), instead of its host; unset, the
// owner is engine.DefaultOwner.
const envLeaseOwner = "LEDGER_LEASE_OWNER"

// leaseOwnerFromEnv is the lease owner $LEDGER_LEASE_OWNER names; "" if
// unset.
func leaseOwnerFromEnv() (string, error) {
	v := os.Getenv(envLeaseOwner)
	if v == "" {
		return "", nil
	}
	if len(v) > 100 || strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0 {
		return "", usagef("%s must be at most 100 printable characters without spaces, not %q", envLeaseOwner, v)
	}
	return engine.NamedOwner(v), nil
}

// leaseTTLFromEnv is $LEDGER_LEASE_TTL; 0 if unset.
func leaseTTLFromEnv() (time.Duration, error) {
	v := os.Getenv(envLeaseTTL)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, usagef("%s must be a positive duration such as 15s, not %q", envLeaseTTL, v)
	}
	return d, nil
}

func openService(ctx context.Context, cfg serviceConfig) (*service, error) {
	if cfg.EffectsPath == "" {
		cfg.EffectsPath = defaultEffectsPath(cfg.DBPath)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	// Before anything is opened: an http tool that cannot be reached as
	// declared (its bearer token's variable unset) is the operator's to fix.
	httpTools, err := configHTTPTools(cfg.Config)
	if err != nil {
		return nil, err
	}
	// Several processes may share the database: each advances and
	// recovers only the runs whose leases it holds (engine/runleases.go).
	if cfg.LeaseTTL == 0 {
		ttl, err := leaseTTLFromEnv()
		if err != nil {
			return nil, err
		}
		cfg.LeaseTTL = ttl
	}
	owner, err := leaseOwnerFromEnv()
	if err != nil {
		return nil, err
	}
	// The store's health sees every operation of every caller (approvals,
	// engine, server) through the store's own hook: failures counted
	// together, and writes seen to succeed again whoever writes first.
	health := storehealth.New(storehealth.Config{Logger: cfg.Logger})
	store, err := openStore(ctx, storeConfig{DB: cfg.DBPath, OnCommit: cfg.OnCommit, WriteFault: cfg.WriteFault,
		SigningKey: cfg.SigningKey, Observe: health.Observe})
	if err != nil {
		return nil, err
	}
	if cfg.Warnings == nil {
		cfg.Warnings = cfg.Logger
	}
	if err := checkSigners(ctx, store, cfg); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	effects, err := simulator.OpenEffectStore(ctx, cfg.EffectsPath, nil)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	if cfg.OnEffects != nil {
		cfg.OnEffects(effects)
	}
	rt := &service{store: store, effects: effects, log: cfg.Logger}
	for _, t := range httpTools {
		rt.httpTools = append(rt.httpTools, t.Descriptor().Name)
	}
	policy, err := approval.NewPolicy(cfg.Rules, approval.Defaults{})
	if err != nil {
		return nil, errors.Join(err, rt.Close())
	}
	agents, clientTools := configAgents(cfg.Config, simulator.PracticeCardsAgent(effects, cfg.Simulator))
	rt.clientTools = clientTools
	// The engine redacts tool output and errors, and the engine and the
	// approval service redact people's reasons and notes, before they are
	// stored, with the same key evidence exports use, so markers correlate.
	key, generated, err := redactionKey("")
	if err != nil {
		return nil, errors.Join(err, rt.Close())
	}
	if generated {
		cfg.Logger.Warn("no " + envRedactionKey + ": secrets in tool output are redacted with a key of this process only; their markers will match no evidence export")
	}
	redactor, err := redact.NewRedactor(key)
	if err != nil {
		return nil, errors.Join(err, rt.Close())
	}
	rt.redactor = redactor
	// The engine needs the approval service for gates, and the service
	// needs the engine's tool registry for rules: it asks the engine, which
	// exists before the first decision.
	rt.approvals = approval.NewService(store, policy, func(name string) (contracts.ToolDescriptor, bool) {
		return rt.engine.Tool(name)
	}, approval.Options{RelaxSeparationOfDuties: cfg.DevMode, Redactor: redactor})
	// The rule set goes on the record before the engine exists, so before
	// any action can cite its digest (ledger rules show, evidence).
	if _, err := rt.approvals.StoreRules(ctx); err != nil {
		return nil, errors.Join(err, rt.Close())
	}
	if cfg.Config != nil && cfg.Config.MCP != nil {
		// The gateway's tools are those of the lock file; its upstreams
		// are connected at their first use (a call, a query, a cancel).
		rt.gateway, err = mcpgw.New(mcpgw.Options{Config: cfg.Config.MCP, Dir: filepath.Dir(cfg.Config.Path), Logger: cfg.Logger,
			Version: Version, StateKey: mcpStateKey(key), ApprovalURL: cfg.ApprovalURL, MaxPendingApprovals: cfg.MaxPendingApprovals,
			Approvals: rt.approvals})
		if err != nil {
			return nil, errors.Join(err, rt.Close())
		}
		agents = append(agents, rt.gateway.Agent())
	}
	var engineStore ledger.Store = store
	if cfg.WrapStore != nil {
		engineStore = cfg.WrapStore(engineStore)
	}
	rt.engine, err = engine.New(engine.Config{Store: engineStore, Approvals: rt.approvals, Agents: agents, Tools: httpTools, Logger: cfg.Logger, FaultFunc: cfg.FaultFunc,
		OnDecision: cfg.OnDecision, OnToolCall: cfg.OnToolCall, Redactor: redactor, Health: health,
		AttemptTokenKey: attemptTokenKey(key), LeaseTTL: cfg.LeaseTTL, Owner: owner})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("wire engine: %w", err), rt.Close())
	}
	if rt.gateway != nil {
		rt.gateway.Bind(rt.engine)
	}
	return rt, nil
}

// builtins are what this build has of its own, which a config file may
// name: the simulator's tools and the practice-cards agent.
func builtins() config.Builtins {
	return config.Builtins{
		Tools:  []contracts.ToolDescriptor{simulator.CardsWriteDescriptor(), simulator.CardsCountDescriptor()},
		Agents: []string{simulator.AgentName},
	}
}

// configAgents are the engine's agents: practice-cards, always, with the
// tenants and thresholds the config file gives it, and each client agent
// of the file with its tools, which the agent's process executes. It also
// returns the client tools' leases, by name. A nil cfg leaves
// practice-cards alone.
func configAgents(cfg *config.Config, practice engine.Agent) ([]engine.Agent, map[string]engine.Lease) {
	if cfg == nil {
		return []engine.Agent{practice}, nil
	}
	agents := []engine.Agent{practice}
	leases := map[string]engine.Lease{}
	for _, a := range cfg.Agents {
		switch a.Driver {
		case contracts.DriverBuiltin: // the parser let through only practice-cards
			agents[0].Tenants, agents[0].Policy = a.Tenants, a.Policy
		case contracts.DriverClient:
			agent := engine.Agent{Name: a.Name, Driver: engine.DriverClient, Tenants: a.Tenants, Policy: a.Policy}
			for _, name := range a.Tools {
				t, _ := cfg.Tool(name) // declared, and a client tool: the parser checked
				lease := engine.Lease{HeartbeatTimeout: t.HeartbeatTimeout, MaxDuration: t.MaxDuration, DecisionTimeout: t.DecisionTimeout}
				agent.Tools = append(agent.Tools, engine.ClientTool(t.Descriptor, lease))
				leases[name] = lease
			}
			agents = append(agents, agent)
		}
	}
	return agents, leases
}

// configHTTPTools are the config file's http tools, each the engine's
// tool over HTTP (httptool), in file order; nil for no file. A tool whose
// bearer_token_env names a variable unset or empty is a usage error that
// names the variable, never a value.
func configHTTPTools(cfg *config.Config) ([]engine.Tool, error) {
	if cfg == nil {
		return nil, nil
	}
	var tools []engine.Tool
	for _, t := range cfg.Tools {
		if t.Executor != contracts.ExecutorHTTP {
			continue
		}
		tool, err := httptool.New(t.Descriptor, t.HTTP, httptool.Options{})
		if err != nil {
			return nil, &usageError{err: fmt.Errorf("config file %s: %w", cfg.Path, err)}
		}
		tools = append(tools, tool)
	}
	return tools, nil
}

// Close stops the engine's workers (which releases the run leases they
// held) and closes both stores.
func (rt *service) Close() error {
	if rt.engine != nil {
		rt.engine.Stop()
	}
	var gwErr error
	if rt.gateway != nil {
		gwErr = rt.gateway.Close()
	}
	return errors.Join(gwErr, rt.effects.Close(), rt.store.Close())
}

// mcpStateKey derives the key of the MCP gateway's request states from
// the redaction key, as attemptTokenKey does: with LEDGER_REDACTION_KEY
// set, a state outlives a restart and is good on every replica.
func mcpStateKey(redactionKey []byte) []byte {
	m := hmac.New(sha256.New, redactionKey)
	m.Write([]byte("ledger mcp request states v1"))
	return m.Sum(nil)
}

// attemptTokenKey derives the key of attempt tokens (the agent protocol)
// from the redaction key, so that with LEDGER_REDACTION_KEY set a begin
// replayed after a restart gets its token again; the two keys stay
// independent (an HMAC of a fixed label).
func attemptTokenKey(redactionKey []byte) []byte {
	m := hmac.New(sha256.New, redactionKey)
	m.Write([]byte("ledger attempt tokens v1"))
	return m.Sum(nil)
}
