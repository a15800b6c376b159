package perf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/ledger/stores"
	"github.com/actionledger/ledger/simulator"
)

// ActionsPerRun is how many auto-approved actions each run of the action
// workload takes.
const ActionsPerRun = 10

// InstantTool is the workloads' tool: it answers at once and changes
// nothing anywhere, so what is measured is the ledger's cost per action.
type InstantTool struct{ Desc contracts.ToolDescriptor }

// NewInstantTool is the instant tool with the simulator's cards.write
// descriptor, renamed bench.write and with no guarantees.
func NewInstantTool() InstantTool {
	desc := simulator.CardsWriteDescriptor()
	desc.Name = "bench.write"
	desc.Guarantees = contracts.Guarantees{}
	return InstantTool{Desc: desc}
}

// Descriptor is the tool's descriptor.
func (t InstantTool) Descriptor() contracts.ToolDescriptor { return t.Desc }

// Execute answers {"ok":true}, with its effect happened. It changes
// nothing, so it has nothing to fence or deduplicate: the call's fencing
// token and dedup key go unused.
func (t InstantTool) Execute(context.Context, engine.Call) (engine.Result, error) {
	return engine.Result{Output: json.RawMessage(`{"ok":true}`), Effect: ledger.EffectHappened}, nil
}

// StepArguments are the arguments of a run's step i: one card of a deck.
func StepArguments(i int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"title":"t","cards":[{"front":"q%d","back":"a"}]}`, i))
}

// Actions is the durable-action workload: a Store on a real file
// (synchronous=FULL) or PostgreSQL database (the server's durability, the
// driver's pool of connections) and an engine with one agent, "bench", whose scripted
// model asks for ActionsPerRun writes of the instant tool, each approved by
// a rule that auto-approves the tool. Per action the engine commits the
// model step's usage with the action, starts the attempt and finishes it,
// each durable before the next.
type Actions struct {
	Store  *ledger.DB
	Engine *engine.Engine
	seq    atomic.Int64 // runs submitted, for their idempotency keys
	done   atomic.Int64 // runs advanced to their end
}

// OpenActions opens the workload's Store on db, a SQLite file path or a
// postgres:// URL (stores.Open), which should be new, and its engine.
func OpenActions(ctx context.Context, db string) (*Actions, error) {
	store, err := stores.Open(ctx, stores.Config{DB: db})
	if err != nil {
		return nil, err
	}
	return openActions(ctx, store)
}

// OpenActionsWith is OpenActions on SQLite with the Store's configuration
// given (cfg.Path a new file): synchronous=OFF, say, to measure the
// ledger's CPU without the fsyncs.
func OpenActionsWith(ctx context.Context, cfg sqlite.Config) (*Actions, error) {
	store, err := sqlite.OpenStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return openActions(ctx, store)
}

// openActions is the workload's engine over store, which it closes if it
// fails.
func openActions(_ context.Context, store *ledger.DB) (*Actions, error) {
	tool := NewInstantTool()
	steps := make([]engine.Step, 0, ActionsPerRun)
	for i := range ActionsPerRun {
		steps = append(steps, engine.Step{Kind: engine.StepToolCall, Tool: tool.Desc.Name, Arguments: StepArguments(i),
			Usage: &engine.Usage{InputTokens: 10, OutputTokens: 5}})
	}
	agent := engine.Agent{Name: "bench", Tools: []engine.Tool{tool},
		NewModel: func(json.RawMessage) (engine.Model, error) { return simulator.NewScriptedModel(steps...), nil }}
	rules := &contracts.Rules{Rules: []contracts.Rule{{Tool: tool.Desc.Name, Decision: contracts.RuleDecisionAutoApprove}}}
	policy, err := approval.NewPolicy(rules, approval.Defaults{})
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	svc := approval.NewService(store, policy, nil, approval.Options{})
	eng, err := engine.New(engine.Config{Store: store, Approvals: svc, Agents: []engine.Agent{agent}})
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	return &Actions{Store: store, Engine: eng}, nil
}

// Close closes the Store.
func (a *Actions) Close() error { return a.Store.Close() }

// Run submits one run and drives it with Engine.Advance as far as it goes:
// ActionsPerRun actions. It returns how long the submit and the advance
// took.
func (a *Actions) Run(ctx context.Context) (submit, advance time.Duration, err error) {
	key := fmt.Sprintf("run-%d", a.seq.Add(1))
	t0 := time.Now()
	res, err := a.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: key,
		Principal: "bench", Agent: "bench", Input: json.RawMessage(`{}`)})
	if err != nil {
		return 0, 0, err
	}
	t1 := time.Now()
	if err := a.Engine.Advance(ctx, res.Run.ID); err != nil {
		return t1.Sub(t0), time.Since(t1), err
	}
	t2 := time.Now()
	a.done.Add(1)
	return t1.Sub(t0), t2.Sub(t1), nil
}

// CheckCompleted checks that every run Run drove to its end is completed.
func (a *Actions) CheckCompleted(ctx context.Context) error {
	done, err := a.Store.FindRuns(ctx, ledger.RunFilter{State: ptrTo(ledger.RunCompleted)})
	if err != nil {
		return err
	}
	if n := int(a.done.Load()); len(done) != n {
		return fmt.Errorf("%d of %d runs completed", len(done), n)
	}
	return nil
}

// Level is what one Drive did.
type Level struct {
	Actions, Runs int
	Elapsed       time.Duration
}

// PerSecond is actions per second.
func (l Level) PerSecond() float64 { return float64(l.Actions) / l.Elapsed.Seconds() }

// Drive runs the workload from c goroutines at once, each calling Run
// again and again until runs runs have started (runs > 0) or d has passed
// (d > 0), whichever comes first. A run started is finished and counted;
// Elapsed is the wall time until the last goroutine returns, submits
// included. It then checks that every run is completed.
func (a *Actions) Drive(ctx context.Context, c, runs int, d time.Duration) (Level, error) {
	if c < 1 || (runs <= 0 && d <= 0) {
		return Level{}, fmt.Errorf("perf: drive needs a concurrency of at least 1 and a number of runs or a duration")
	}
	var (
		started, finished atomic.Int64
		wg                sync.WaitGroup
		errOnce           sync.Once
		first             error
	)
	fail := func(err error) { errOnce.Do(func() { first = err }) }
	start := time.Now()
	deadline := start.Add(d)
	for range c {
		wg.Go(func() {
			for ctx.Err() == nil && (d <= 0 || time.Now().Before(deadline)) {
				if runs > 0 && started.Add(1) > int64(runs) {
					return
				}
				if _, _, err := a.Run(ctx); err != nil {
					fail(err)
					return
				}
				finished.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return Level{}, first
	}
	if err := ctx.Err(); err != nil {
		return Level{}, err
	}
	if err := a.CheckCompleted(ctx); err != nil {
		return Level{}, err
	}
	n := int(finished.Load())
	return Level{Actions: n * ActionsPerRun, Runs: n, Elapsed: elapsed}, nil
}

func ptrTo[T any](v T) *T { return &v }
