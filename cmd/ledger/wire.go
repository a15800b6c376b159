package main

import (
	"context"
	"crypto/ed25519"
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
	// redactor hides secrets in what is stored and shown, with
	// LEDGER_REDACTION_KEY when set.
	redactor *redact.Redactor
}

// serviceConfig says where things live and how they behave.
type serviceConfig struct {
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
	// OnDecision sees every recovery decision (serve counts them).
	OnDecision func(recovery.Decision)
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
	store, err := ledger.Open(ctx, ledger.Config{Path: cfg.DBPath, SigningKey: cfg.SigningKey})
	if err != nil {
		return nil, err
	}
	effects, err := simulator.OpenEffectStore(ctx, cfg.EffectsPath, nil)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	rt := &service{store: store, effects: effects, log: cfg.Logger}
	policy, err := approval.NewPolicy(cfg.Rules, approval.Defaults{})
	if err != nil {
		return nil, errors.Join(err, rt.Close())
	}
	agent := simulator.PracticeCardsAgent(effects, cfg.Simulator)
	// The engine needs the approval service for gates, and the service
	// needs the engine's tool registry for rules: it asks the engine, which
	// exists before the first decision.
	rt.approvals = approval.NewService(store, policy, func(name string) (contracts.ToolDescriptor, bool) {
		return rt.engine.Tool(name)
	}, approval.Options{RelaxSeparationOfDuties: cfg.DevMode})
	// The engine redacts tool output and errors before they are stored,
	// with the same key evidence exports use, so markers correlate.
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
	var engineStore ledger.Store = store
	if cfg.WrapStore != nil {
		engineStore = cfg.WrapStore(store)
	}
	rt.engine, err = engine.New(engine.Config{Store: engineStore, Approvals: rt.approvals, Agents: []engine.Agent{agent}, Logger: cfg.Logger, FaultFunc: cfg.FaultFunc,
		OnDecision: cfg.OnDecision, Redactor: redactor})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("wire engine: %w", err), rt.Close())
	}
	return rt, nil
}

// Close stops the engine's workers and closes both stores.
func (rt *service) Close() error {
	if rt.engine != nil {
		rt.engine.Stop()
	}
	return errors.Join(rt.effects.Close(), rt.store.Close())
}
