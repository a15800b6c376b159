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

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/simulator"
)

// service is the wired service: the ledger store, the simulator's own
// effect store, the approval service and the engine with the practice-cards
// agent registered.
type service struct {
	store     *ledger.GormStore
	effects   *simulator.EffectStore
	approvals *approval.Service
	engine    *engine.Engine
	log       *slog.Logger
	// lock is the database's lock (lock.go), held until Close.
	lock *dbLock
	// redactor hides secrets in what is stored and shown, with
	// LEDGER_REDACTION_KEY when set.
	redactor *redact.Redactor
}

// serviceConfig says where things live and how they behave.
type serviceConfig struct {
	// Command names the command in the database's lock file ("serve").
	Command     string
	DBPath      string
	EffectsPath string // "" means <DBPath>.effects.db
	Simulator   simulator.Config
	Rules       *contracts.Rules
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
	// OnDecision sees every recovery decision (serve counts them).
	OnDecision func(recovery.Decision)
	// OnCommit sees every group commit of the store, OnToolCall every
	// tool call of the engine (serve's metrics).
	OnCommit   func(ledger.CommitStats)
	OnToolCall func(engine.ToolCallStats)
	// SigningKey, if set, signs each run's chain head (signingkey.go).
	SigningKey ed25519.PrivateKey
}

func openService(ctx context.Context, cfg serviceConfig) (*service, error) {
	if cfg.EffectsPath == "" {
		cfg.EffectsPath = cfg.DBPath + ".effects.db"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	// One process per database, before anything reads or writes it: a
	// second one would take this one's calls in flight for interrupted
	// ones (lock.go).
	lock, err := lockDatabase(cfg.DBPath, cfg.Command, cfg.Logger)
	if err != nil {
		return nil, err
	}
	store, err := ledger.Open(ctx, ledger.Config{Path: cfg.DBPath, OnCommit: cfg.OnCommit, WriteFaultFunc: cfg.WriteFault,
		SigningKey: cfg.SigningKey})
	if err != nil {
		return nil, errors.Join(err, lock.Release())
	}
	effects, err := simulator.OpenEffectStore(ctx, cfg.EffectsPath, nil)
	if err != nil {
		return nil, errors.Join(err, store.Close(), lock.Release())
	}
	rt := &service{store: store, effects: effects, log: cfg.Logger, lock: lock}
	policy, err := approval.NewPolicy(cfg.Rules, approval.Defaults{})
	if err != nil {
		return nil, errors.Join(err, rt.Close())
	}
	agent := simulator.PracticeCardsAgent(effects, cfg.Simulator)
	// One StoreHealth for every writer (approvals, engine and, through
	// the engine, the server): failures counted together, and writes seen
	// to succeed again whoever writes first.
	health := engine.NewStoreHealth(engine.StoreHealthConfig{Logger: cfg.Logger})
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
	rt.approvals = approval.NewService(health.Watch(store), policy, func(name string) (contracts.ToolDescriptor, bool) {
		return rt.engine.Tool(name)
	}, approval.Options{RelaxSeparationOfDuties: cfg.DevMode, Redactor: redactor})
	var engineStore ledger.Store = store
	if cfg.WrapStore != nil {
		engineStore = cfg.WrapStore(engineStore)
	}
	rt.engine, err = engine.New(engine.Config{Store: engineStore, Approvals: rt.approvals, Agents: []engine.Agent{agent}, Logger: cfg.Logger, FaultFunc: cfg.FaultFunc,
		OnDecision: cfg.OnDecision, OnToolCall: cfg.OnToolCall, Redactor: redactor, Health: health,
		AttemptTokenKey: attemptTokenKey(key)})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("wire engine: %w", err), rt.Close())
	}
	return rt, nil
}

// Close stops the engine's workers, closes both stores, then releases the
// database's lock.
func (rt *service) Close() error {
	if rt.engine != nil {
		rt.engine.Stop()
	}
	err := errors.Join(rt.effects.Close(), rt.store.Close())
	return errors.Join(err, rt.lock.Release())
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
