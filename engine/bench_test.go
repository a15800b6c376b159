package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/simulator"
)

// instantTool is the benchmark's tool: it answers at once and changes
// nothing anywhere, so what is measured is the ledger's cost per action.
type instantTool struct{ desc contracts.ToolDescriptor }

func (t instantTool) Descriptor() contracts.ToolDescriptor { return t.desc }
func (t instantTool) Execute(context.Context, engine.Call) (engine.Result, error) {
	return engine.Result{Output: json.RawMessage(`{"ok":true}`), Effect: ledger.EffectHappened}, nil
}

const actionsPerRun = 10

// benchEngine is the engine of the benchmarks: one agent of ten
// auto-approved writes of an instant tool, on a real file (synchronous=FULL).
func benchEngine(b *testing.B, dir string) (*ledger.GormStore, *engine.Engine) {
	ctx := context.Background()
	store, err := ledger.Open(ctx, ledger.Config{Path: filepath.Join(dir, "ledger.db")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	desc := simulator.CardsWriteDescriptor()
	desc.Name = "bench.write"
	desc.Guarantees = contracts.Guarantees{}
	steps := make([]engine.Step, 0, actionsPerRun)
	for i := range actionsPerRun {
		steps = append(steps, engine.Step{Kind: engine.StepToolCall, Tool: desc.Name,
			Arguments: json.RawMessage(fmt.Sprintf(`{"title":"t","cards":[{"front":"q%d","back":"a"}]}`, i)),
			Usage:     &engine.Usage{InputTokens: 10, OutputTokens: 5}})
	}
	agent := engine.Agent{Name: "bench", Tools: []engine.Tool{instantTool{desc}},
		NewModel: func(json.RawMessage) (engine.Model, error) { return simulator.NewScriptedModel(steps...), nil }}
	rules := &contracts.Rules{Rules: []contracts.Rule{{Tool: desc.Name, Decision: contracts.RuleDecisionAutoApprove}}}
	policy, err := approval.NewPolicy(rules, approval.Defaults{})
	if err != nil {
		b.Fatal(err)
	}
	svc := approval.NewService(store, policy, nil, approval.Options{})
	eng, err := engine.New(engine.Config{Store: store, Approvals: svc, Agents: []engine.Agent{agent}})
	if err != nil {
		b.Fatal(err)
	}
	return store, eng
}

// BenchmarkEngineConcurrency drives runs from 1, 8 and 32 goroutines at
// once; group commit lets concurrent writes share their fsyncs, so
// actions/s should grow with concurrency. Each op is one run of ten actions.
func BenchmarkEngineConcurrency(b *testing.B) {
	for _, c := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			ctx := context.Background()
			store, eng := benchEngine(b, b.TempDir())
			var next atomic.Int64
			t0 := time.Now()
			b.SetParallelism(c)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := next.Add(1)
					res, err := store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: fmt.Sprintf("run-%d", n),
						Principal: "bench", Agent: "bench", Input: json.RawMessage(`{}`)})
					if err != nil {
						b.Error(err)
						return
					}
					if err := eng.Advance(ctx, res.Run.ID); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(next.Load()*actionsPerRun)/time.Since(t0).Seconds(), "actions/s")
		})
	}
}

// BenchmarkEngineActions drives runs of ten auto-approved write actions
// each through Engine.Advance on a real file (synchronous=FULL), and
// reports actions per second beside raw single-row commits per second
// measured in the same run on the same file system: ratio_to_floor is the
// figure to compare across machines. Per action the engine commits four
// times (model step usage, action recorded through the gate, attempt
// started, attempt finished), so 0.25 would be "no cost beyond the fsyncs".
func BenchmarkEngineActions(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	store, eng := benchEngine(b, dir)
	floor := ledgertest.OpenFloor(b, dir)

	var engineTime, floorTime time.Duration
	actions, runs := 0, 0
	for b.Loop() {
		// One op is one run of ten actions, then as many floor commits.
		runs++
		res, err := store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: fmt.Sprintf("run-%d", runs),
			Principal: "bench", Agent: "bench", Input: json.RawMessage(`{}`)})
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if err := eng.Advance(ctx, res.Run.ID); err != nil {
			b.Fatal(err)
		}
		engineTime += time.Since(t0)
		actions += actionsPerRun
		t0 = time.Now()
		for range actionsPerRun {
			floor.Commit(b)
		}
		floorTime += time.Since(t0)
	}
	last, err := store.FindRuns(ctx, ledger.RunFilter{State: ptr(ledger.RunCompleted)})
	if err != nil || len(last) != runs {
		b.Fatalf("%d of %d runs completed (%v)", len(last), runs, err)
	}
	actionsPerSec := float64(actions) / engineTime.Seconds()
	floorPerSec := float64(actions) / floorTime.Seconds()
	b.ReportMetric(actionsPerSec, "actions/s")
	b.ReportMetric(floorPerSec, "floor_commits/s")
	b.ReportMetric(actionsPerSec/floorPerSec, "ratio_to_floor")
}
