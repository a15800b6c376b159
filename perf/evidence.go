package perf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
)

// EvidenceRun writes, to a new Store on db (a SQLite file path or a
// postgres:// URL) with synchronous=OFF (PostgreSQL: synchronous_commit
// off; reading does not care), a run with one approved write that ran once and
// succeeded, then fills it with usage records up to n events. It returns
// the Store, which the caller closes, the run and its number of events.
func EvidenceRun(ctx context.Context, db string, n int) (*ledger.DB, ledger.RunID, int, error) {
	s, err := openUnsynced(ctx, db)
	if err != nil {
		return nil, "", 0, err
	}
	id, events, err := evidenceRun(ctx, s, n)
	if err != nil {
		return nil, "", 0, errors.Join(err, s.Close())
	}
	return s, id, events, nil
}

func evidenceRun(ctx context.Context, s ledger.Store, n int) (ledger.RunID, int, error) {
	res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "bench", IdempotencyKey: "evidence", Principal: "bench",
		Agent: "bench", Input: json.RawMessage(`{"title":"t"}`)})
	if err != nil {
		return "", 0, err
	}
	id := res.Run.ID
	if _, err := s.TransitionRun(ctx, ledger.RunTransition{ID: id, From: ledger.RunQueued, To: ledger.RunRunning}); err != nil {
		return "", 0, err
	}
	a, err := s.CreateAction(ctx, ledger.CreateActionParams{RunID: id, IdempotencyKey: "step-1", Tool: "bench.write",
		ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"title":"t","cards":[{"front":"q","back":"a"}]}`),
		Gate: ledger.ActionApproved})
	if err != nil {
		return "", 0, err
	}
	att, err := s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: a.Action.ID})
	if err != nil {
		return "", 0, err
	}
	if _, err := s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: att.ID, Status: ledger.AttemptSucceeded,
		Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened},
		Result:      json.RawMessage(`{"written":1}`)}); err != nil {
		return "", 0, err
	}
	events, err := FillEvents(ctx, s, id, n)
	return id, events, err
}

// FillEvents adds model-step usage records to run until its chain holds at
// least n events, verifies the chain and returns how many events it holds.
func FillEvents(ctx context.Context, s ledger.Store, run ledger.RunID, n int) (int, error) {
	chain, err := s.VerifyChain(ctx, run)
	if err != nil {
		return 0, err
	}
	for i := chain.Events; i < n; i++ {
		if _, err := s.AddUsage(ctx, ledger.AddUsageParams{RunID: run, Steps: 1, Tokens: 42, Execution: time.Millisecond}); err != nil {
			return 0, err
		}
	}
	if chain, err = s.VerifyChain(ctx, run); err != nil {
		return 0, err
	}
	if !chain.OK || chain.Events < n {
		return 0, fmt.Errorf("run %s has %d events (chain ok: %t), want %d", run, chain.Events, chain.OK, n)
	}
	return chain.Events, nil
}

// Export is the time of one evidence export.
type Export struct {
	Build  time.Duration // evidence.Build: every query, the chain verification, redaction of every event
	Render time.Duration // the JSON report: encoding and schema validation
	Events int           // events of the report's timeline
}

// Total is Build plus Render.
func (e Export) Total() time.Duration { return e.Build + e.Render }

// ExportOnce times one export of run: evidence.Build, then the JSON report
// written to io.Discard. It checks that the report's timeline holds at
// least n events and that its chain verified.
func ExportOnce(ctx context.Context, s ledger.Store, run ledger.RunID, opts evidence.Options, n int) (Export, error) {
	t0 := time.Now()
	rep, err := evidence.Build(ctx, s, run, opts)
	if err != nil {
		return Export{}, err
	}
	t1 := time.Now()
	if err := rep.JSON(io.Discard); err != nil {
		return Export{}, err
	}
	out := Export{Build: t1.Sub(t0), Render: time.Since(t1), Events: len(rep.Timeline)}
	if len(rep.Timeline) < n || !rep.Chain.OK {
		return Export{}, fmt.Errorf("report has %d timeline events (chain ok: %t), want %d", len(rep.Timeline), rep.Chain.OK, n)
	}
	return out, nil
}

// ExportMedian exports run reps times with ExportOnce and returns the
// median build and the median render time. Each export starts from a
// collected heap, as each Go benchmark does: in `ledger bench` the earlier
// phases leave garbage whose collection would otherwise land in the timed
// export (it moved the median between 156 and 268 ms from run to run).
func ExportMedian(ctx context.Context, s ledger.Store, run ledger.RunID, opts evidence.Options, n, reps int) (Export, error) {
	var out Export
	builds, renders := make([]time.Duration, 0, reps), make([]time.Duration, 0, reps)
	for range reps {
		runtime.GC()
		e, err := ExportOnce(ctx, s, run, opts, n)
		if err != nil {
			return Export{}, err
		}
		builds, renders, out.Events = append(builds, e.Build), append(renders, e.Render), e.Events
	}
	out.Build, out.Render = Percentile(builds, 0.5), Percentile(renders, 0.5)
	return out, nil
}
