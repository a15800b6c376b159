package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// Probe is how recovery reaches one tool: its guarantees and, where it has
// them, its query and cancel by dedup key. The engine builds probes from
// its registered tools.
type Probe struct {
	Tool       Tool
	QueryFunc  func(ctx context.Context, dedupKey string) (ledger.EffectFact, json.RawMessage, error)
	CancelFunc func(ctx context.Context, dedupKey string) (bool, json.RawMessage, error)
}

// ProbeFunc returns the probe of a tool by name and version.
type ProbeFunc func(tool, version string) (Probe, bool)

// RetryFunc is the budget verdict on one more attempt of an action: a stop
// reason and why, or "" to allow it.
type RetryFunc func(run *ledger.Run, action *ledger.Action, now time.Time) (ledger.StopReason, string)

// Config builds a Recoverer.
type Config struct {
	Store  ledger.Store
	Probes ProbeFunc
	Retry  RetryFunc
	Now    func() time.Time
	// MaxQueryFailures is the recovery budget of failed queries per
	// attempt before a person decides; 0 means 3.
	MaxQueryFailures int
	// ProbeTimeout bounds one query or cancel; 0 means 10s.
	ProbeTimeout time.Duration
	// OnDecision, if set, sees every decision recorded (for metrics); it
	// may be called from several goroutines at once.
	OnDecision func(Decision)
	// ScanWorkers is how many runs Scan recovers at once; 0 means 4.
	ScanWorkers int
}

// Recoverer applies the decision table to actions and acts on it.
type Recoverer struct{ cfg Config }

// New returns a Recoverer.
func New(cfg Config) *Recoverer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxQueryFailures <= 0 {
		cfg.MaxQueryFailures = 3
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 10 * time.Second
	}
	if cfg.ScanWorkers <= 0 {
		cfg.ScanWorkers = 4
	}
	if cfg.Retry == nil {
		cfg.Retry = func(*ledger.Run, *ledger.Action, time.Time) (ledger.StopReason, string) { return "", "" }
	}
	return &Recoverer{cfg: cfg}
}

// Recover decides what to do about one action of run whose outcome is not
// settled (approved, running, uncertain), records every decision with its
// rationale as an event — probes included — and acts on the final one:
// marks the interrupted attempt, establishes effects from the tool's
// answers, and moves the action and, for stop and review, the run.
// The action must not be in flight in this process.
func (r *Recoverer) Recover(ctx context.Context, run *ledger.Run, a *ledger.Action) (Decision, error) {
	f, probe, err := r.facts(ctx, run, a)
	if err != nil {
		return Decision{}, err
	}
	for range 4 { // at most a cancel and a query before a final decision
		d := Decide(f)
		if err := r.record(ctx, f, d); err != nil {
			return d, err
		}
		switch d.Kind {
		case Query:
			f.Query = r.query(ctx, f, probe)
			if f.Query.Err != nil {
				f.QueryFailures++
			}
		case Cancel:
			f.Cancel = r.cancel(ctx, f, probe)
		default:
			return d, r.act(ctx, run, f, d)
		}
	}
	return Decision{}, fmt.Errorf("recover %s: no final decision after probing", a.ID)
}

// facts gathers what Decide needs from the ledger.
func (r *Recoverer) facts(ctx context.Context, run *ledger.Run, a *ledger.Action) (Facts, Probe, error) {
	f := Facts{Action: a, Now: r.cfg.Now(), MaxQueryFailures: r.cfg.MaxQueryFailures}
	probe, ok := r.cfg.Probes(a.Tool, a.ToolVersion)
	if !ok {
		// A tool we no longer have guarantees nothing: review.
		probe = Probe{}
	}
	f.Tool = probe.Tool
	atts, err := r.cfg.Store.FindAttempts(ctx, ledger.AttemptFilter{ActionID: &a.ID})
	if err != nil {
		return f, probe, fmt.Errorf("recover %s: %w", a.ID, err)
	}
	if len(atts) > 0 {
		f.Attempt = atts[len(atts)-1]
		obs, err := r.cfg.Store.FindObservations(ctx, ledger.ObservationFilter{AttemptID: &f.Attempt.ID})
		if err != nil {
			return f, probe, fmt.Errorf("recover %s: %w", a.ID, err)
		}
		for _, o := range obs {
			if o.Source == ledger.ObservedQuery && o.Effect == ledger.EffectUnknown && isProbeError(o.Detail) {
				f.QueryFailures++
			}
		}
	}
	c, err := r.cfg.Store.FindCancellation(ctx, run.ID)
	switch {
	case err == nil:
		f.Cancelling = c.State != ledger.CancelRequested
	case !errors.Is(err, ledger.ErrNotFound):
		return f, probe, fmt.Errorf("recover %s: %w", a.ID, err)
	}
	f.Retry, f.RetryRationale = r.cfg.Retry(run, a, f.Now)
	// A guarantee without the means to use it is no guarantee.
	if probe.QueryFunc == nil {
		f.Tool.Guarantees.Query = false
	}
	if probe.CancelFunc == nil {
		f.Tool.Guarantees.Cancel = false
	}
	return f, probe, nil
}

func isProbeError(detail json.RawMessage) bool {
	var d struct {
		Error string `json:"error"`
	}
	return json.Unmarshal(detail, &d) == nil && d.Error != ""
}

func (r *Recoverer) record(ctx context.Context, f Facts, d Decision) error {
	p := ledger.RecordDecisionParams{ActionID: f.Action.ID, Decision: string(d.Kind), Rationale: d.Rationale, Actor: "recovery",
		Data: map[string]any{"query": f.Tool.Guarantees.Query, "dedup": f.Tool.Guarantees.Dedup, "cancel": f.Tool.Guarantees.Cancel}}
	if f.Attempt != nil {
		p.AttemptID = f.Attempt.ID
	}
	if d.StopReason != "" {
		p.Data["stop_reason"] = d.StopReason
	}
	if _, err := r.cfg.Store.RecordDecision(ctx, p); err != nil {
		return fmt.Errorf("recover %s: %w", f.Action.ID, err)
	}
	if r.cfg.OnDecision != nil {
		r.cfg.OnDecision(d)
	}
	return nil
}

// query asks the tool and records its answer as an observation; a failed
// query is recorded as unknown with the error, never as an answer.
func (r *Recoverer) query(ctx context.Context, f Facts, p Probe) *QueryAnswer {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
	effect, out, err := p.QueryFunc(qctx, f.Action.DedupKey)
	cancel()
	ans := &QueryAnswer{Effect: effect, Err: err}
	detail := out
	if err != nil {
		ans.Effect = ledger.EffectUnknown
		detail, _ = json.Marshal(map[string]string{"error": err.Error()})
	} else if !effect.Valid() {
		ans.Effect = ledger.EffectUnknown
	}
	if _, _, oerr := r.cfg.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: f.Attempt.ID,
		Source: ledger.ObservedQuery, Effect: ans.Effect, Detail: detail, Actor: "recovery"}); oerr != nil {
		// The answer cannot be kept: treat it as no answer.
		return &QueryAnswer{Effect: ledger.EffectUnknown, Err: oerr}
	}
	return ans
}

// cancel asks the tool to cancel and records its answer; a confirmed cancel
// establishes that the effect did not happen.
func (r *Recoverer) cancel(ctx context.Context, f Facts, p Probe) *CancelAnswer {
	cctx, stop := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
	confirmed, out, err := p.CancelFunc(cctx, f.Action.DedupKey)
	stop()
	ans := &CancelAnswer{Confirmed: confirmed && err == nil, Err: err}
	effect, detail := ledger.EffectUnknown, out
	if ans.Confirmed {
		effect = ledger.EffectNotHappened
	}
	if err != nil {
		detail, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	if f.Attempt == nil {
		return ans
	}
	if _, _, oerr := r.cfg.Store.RecordObservation(ctx, ledger.RecordObservationParams{AttemptID: f.Attempt.ID,
		Source: ledger.ObservedCancel, Effect: effect, Detail: detail, Actor: "recovery"}); oerr != nil {
		return &CancelAnswer{Err: oerr}
	}
	return ans
}

// act carries out a final decision.
func (r *Recoverer) act(ctx context.Context, run *ledger.Run, f Facts, d Decision) error {
	s := r.cfg.Store
	a := f.Action
	// An attempt still marked started was interrupted: close it. Its status
	// says we never saw the call's outcome; its effect stays what the
	// probes established (or unknown).
	closeAttempt := func(actionTo ledger.ActionState, status ledger.AttemptStatus) error {
		if a.State != ledger.ActionRunning {
			return nil
		}
		_, err := s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: f.Attempt.ID, Status: status, ActionState: actionTo,
			Actor: "recovery", Error: &ledger.AttemptError{Code: "interrupted", Message: "no outcome was recorded for this attempt: " + d.Rationale}})
		if err == nil {
			a.State = actionTo
		}
		return err
	}
	move := func(to ledger.ActionState) error {
		if a.State == to {
			return nil
		}
		_, err := s.TransitionAction(ctx, ledger.ActionTransition{ID: a.ID, From: a.State, To: to, Actor: "recovery",
			Data: map[string]any{"decision": d.Kind, "rationale": d.Rationale}})
		if err == nil {
			a.State = to
		}
		return err
	}
	var err error
	switch d.Kind {
	case Wait:
		return nil
	case Continue:
		if err = closeAttempt(ledger.ActionUncertain, ledger.AttemptUncertain); err == nil {
			if a.State == ledger.ActionUncertain {
				err = move(ledger.ActionApproved)
			}
		}
	case Reconcile:
		if a.State == ledger.ActionRunning {
			err = closeAttempt(ledger.ActionSucceeded, ledger.AttemptUncertain)
		} else {
			err = move(ledger.ActionSucceeded)
		}
	case Cancelled:
		status := ledger.AttemptUncertain
		if f.Cancel != nil && f.Cancel.Confirmed {
			status = ledger.AttemptCancelled
		}
		if err = closeAttempt(ledger.ActionUncertain, status); err == nil && a.State == ledger.ActionUncertain {
			err = move(ledger.ActionApproved)
		}
		if err == nil {
			err = move(ledger.ActionCancelled)
		}
	case Stop:
		if err = closeAttempt(ledger.ActionUncertain, ledger.AttemptUncertain); err == nil {
			if a.State == ledger.ActionApproved {
				err = move(ledger.ActionCancelled)
			} else {
				err = move(ledger.ActionFailed)
			}
		}
		if err == nil && !run.State.Terminal() && run.State != ledger.RunStopping {
			_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: run.State, To: d.StopReason.TerminalState(),
				StopReason: d.StopReason, Actor: "recovery", Data: map[string]any{"action_id": a.ID, "rationale": d.Rationale}})
		}
	case Review:
		if err = closeAttempt(ledger.ActionUncertain, ledger.AttemptUncertain); err == nil {
			err = move(ledger.ActionNeedsReview)
		}
		if err == nil && (run.State == ledger.RunRunning || run.State == ledger.RunAwaitingApproval) {
			_, err = s.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: run.State, To: ledger.RunNeedsReview,
				Actor: "recovery", Data: map[string]any{"action_id": a.ID, "rationale": d.Rationale}})
		}
	default:
		return fmt.Errorf("recover %s: cannot act on %q", a.ID, d.Kind)
	}
	if err != nil {
		return fmt.Errorf("recover %s: %s: %w", a.ID, d.Kind, err)
	}
	return nil
}

// ScanReport counts what a scan decided.
type ScanReport struct {
	Actions   int          `json:"actions"`
	Decisions map[Kind]int `json:"decisions"`
	Errors    []string     `json:"errors,omitempty"`
}

// Scan recovers every action of a non-terminal run that is approved,
// running or uncertain: at start-up, before the engine takes work, and on
// `ledger recover`. Runs are recovered Config.ScanWorkers at a time (the
// actions of one run one after another, in order), so their writes share
// commits. An error on one action is reported and the scan goes on with
// the others; a cancelled ctx stops it.
func (r *Recoverer) Scan(ctx context.Context) (ScanReport, error) {
	rep := ScanReport{Decisions: map[Kind]int{}}
	// Snapshot first: acting moves actions between these states (running →
	// approved), and each must be decided once per scan.
	byRun := map[ledger.RunID][]*ledger.Action{}
	var order []ledger.RunID
	for _, st := range []ledger.ActionState{ledger.ActionRunning, ledger.ActionUncertain, ledger.ActionApproved} {
		found, err := r.cfg.Store.FindActions(ctx, ledger.ActionFilter{State: &st})
		if err != nil {
			return rep, fmt.Errorf("recovery scan: %w", err)
		}
		for _, a := range found {
			if _, seen := byRun[a.RunID]; !seen {
				order = append(order, a.RunID)
			}
			byRun[a.RunID] = append(byRun[a.RunID], a)
		}
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		next = make(chan ledger.RunID)
	)
	note := func(d Decision, err error) {
		mu.Lock()
		defer mu.Unlock()
		rep.Actions++
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			return
		}
		rep.Decisions[d.Kind]++
	}
	for range r.cfg.ScanWorkers {
		wg.Go(func() {
			for id := range next {
				for _, a := range byRun[id] {
					if ctx.Err() != nil {
						return
					}
					run, err := r.cfg.Store.FindRunByID(ctx, id)
					if err != nil {
						note(Decision{}, fmt.Errorf("recovery scan: %w", err))
						break
					}
					if run.State.Terminal() {
						break
					}
					note(r.Recover(ctx, run, a))
				}
			}
		})
	}
	for _, id := range order {
		select {
		case next <- id:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	return rep, nil
}
