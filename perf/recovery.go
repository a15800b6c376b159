package perf

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/stores"
	"github.com/actionledger/ledger/recovery"
)

// WriteInterruptedRuns writes n runs to a new Store on db (a SQLite file
// path or a postgres:// URL) as a crash mid-attempt leaves them: each
// submitted, running, with one approved write action of bench.write whose
// attempt was started and never finished. It writes with synchronous=OFF
// (PostgreSQL: synchronous_commit off; the scan is what is measured) and
// one writer: the SQLite store has one writer connection, and four
// goroutines were no faster.
func WriteInterruptedRuns(ctx context.Context, db string, n int, progress Progress) error {
	s, err := openUnsynced(ctx, db)
	if err != nil {
		return err
	}
	defer s.Close()
	step := max(n/5, 1000)
	for i := range n {
		if err := interruptedRun(ctx, s, i); err != nil {
			return err
		}
		if (i+1)%step == 0 && i+1 < n {
			progress.printf("recovery: %d of %d interrupted runs written", i+1, n)
		}
	}
	return nil
}

// interruptedRun writes run i: submitted, running, one approved write
// action, its attempt started and never finished.
func interruptedRun(ctx context.Context, s ledger.Store, i int) error {
	res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: fmt.Sprintf("k%d", i),
		Principal: "bench", Agent: "bench", Input: json.RawMessage(`{}`)})
	if err != nil {
		return err
	}
	if _, err := s.TransitionRun(ctx, ledger.RunTransition{ID: res.Run.ID, From: ledger.RunQueued, To: ledger.RunRunning}); err != nil {
		return err
	}
	a, err := s.CreateAction(ctx, ledger.CreateActionParams{RunID: res.Run.ID, IdempotencyKey: "step-1", Tool: "bench.write",
		ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"i":1}`), Gate: ledger.ActionApproved})
	if err != nil {
		return err
	}
	_, err = s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.Action.ID})
	return err
}

// ScanRecovery opens the Store on db, which holds the n runs
// WriteInterruptedRuns wrote, with synchronous=FULL (PostgreSQL: the
// server's durability) and times one recovery
// scan with a tool that can be queried and answers "not happened" at once:
// per run a query decision, the observation, a continue decision, the
// attempt closed and the action back to approved, written together in one
// durable transaction (Store.RecordRecovery) that the group commit shares
// with other runs'. It checks
// that the scan decided to continue every one of the n actions. While the
// scan runs it reports the decisions so far every five seconds.
func ScanRecovery(ctx context.Context, db string, n int, progress Progress) (time.Duration, error) {
	s, err := stores.Open(ctx, stores.Config{DB: db})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	var decided atomic.Int64
	r := recovery.New(recovery.Config{Store: s,
		Probes: func(string, string) (recovery.Probe, bool) {
			return recovery.Probe{Tool: recovery.Tool{Guarantees: contracts.Guarantees{Query: true}},
				QueryFunc: func(context.Context, string) (ledger.EffectFact, json.RawMessage, error) {
					return ledger.EffectNotHappened, nil, nil
				}}, true
		},
		OnDecision: func(recovery.Decision) { decided.Add(1) },
	})
	stop := every(5*time.Second, func() { progress.printf("recovery: scanning, %d decisions recorded so far", decided.Load()) })
	t0 := time.Now()
	rep, err := r.Scan(ctx)
	scan := time.Since(t0)
	stop()
	if err != nil {
		return 0, err
	}
	if rep.Actions != n || rep.Decisions[recovery.Continue] != n || len(rep.Errors) > 0 {
		first := ""
		if len(rep.Errors) > 0 {
			first = " (the first: " + rep.Errors[0] + ")"
		}
		return 0, fmt.Errorf("scan decided %d actions (%v) in %s, %d errors%s, want %d continues", rep.Actions, rep.Decisions,
			scan.Round(time.Millisecond), len(rep.Errors), first, n)
	}
	return scan, nil
}

// every calls f every period until stop is called; stop returns once f
// can no longer be called.
func every(period time.Duration, f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				f()
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}
