package recovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	// Client marks a tool an outside agent executes (the agent protocol):
	// recovery cannot ask it, the agent can. A query or cancel decision is
	// then recorded once, told to the agent (ledger.AgentDecision) and
	// returned as the pass's result; the agent's answer, recorded as an
	// observation, makes the next pass decide.
	Client bool
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
	// OnDecision, if set, sees every decision once it is durable (for
	// metrics); it may be called from several goroutines at once.
	OnDecision func(Decision)
	// ScanWorkers is how many runs Scan recovers at once (their probes run
	// concurrently, their writes share commits); 0 means 64, as many
	// writes as one group commit takes.
	ScanWorkers int
	// ScanPage is how many runs' facts Scan reads at once; 0 means 1000.
	ScanPage int
	// Lease, if set, makes Scan recover only the runs this process can
	// claim: it is called with the runs of each page before they are
	// recovered, claims what it can and returns, for each run it claimed,
	// the context to recover it with (marked with the run's lease,
	// ledger.WithRunLease). Scan leaves the other runs to the processes
	// that hold them (ScanReport.Held) and calls Done with each run it
	// claimed once its actions are recovered.
	Lease func(ctx context.Context, runs []ledger.RunID) (map[ledger.RunID]context.Context, error)
	Done  func(ctx context.Context, run ledger.RunID)
	// Guard, if set, is asked before each query or cancel of a tool,
	// with the probe's timeout, and the pass stops with its error: the
	// engine lets a probe run only while the run's lease outlasts it.
	Guard func(ctx context.Context, timeout time.Duration) error
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
		cfg.ScanWorkers = 64
	}
	if cfg.ScanPage <= 0 {
		cfg.ScanPage = 1000
	}
	if cfg.Retry == nil {
		cfg.Retry = func(*ledger.Run, *ledger.Action, time.Time) (ledger.StopReason, string) { return "", "" }
	}
	return &Recoverer{cfg: cfg}
}

// Recover decides what to do about one action whose outcome is not
// settled (approved, running, uncertain), records every decision with its
// rationale as an event — probes included — and acts on the final one:
// marks the interrupted attempt, establishes effects from the tool's
// answers, and moves the action and, for stop and review, the run.
// The action must not be in flight in this process. run and a name the
// action; its facts (its state, its run's, its last attempt, failed
// queries, the run's cancellation) are read afresh from the store.
//
// Durable writes: the decisions of a pass, the tools' answers and the act
// on the final decision are written together, in one transaction
// (Store.RecordRecovery), once the final decision is made. A query is a
// read: a crash before that commit loses nothing but the question, which
// the next pass asks again. A cancel acts on the tool, so the decision to
// cancel (with whatever was decided before it) is durable before the tool
// is asked; its answer is written with the final decision.
func (r *Recoverer) Recover(ctx context.Context, run *ledger.Run, a *ledger.Action) (Decision, error) {
	found, err := r.cfg.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &a.ID})
	if err != nil {
		return Decision{}, fmt.Errorf("recover %s: %w", a.ID, err)
	}
	if run != nil && found[0].Run.ID != run.ID {
		return Decision{}, fmt.Errorf("recover %s: the action belongs to run %s, not %s", a.ID, found[0].Run.ID, run.ID)
	}
	return r.recover(ctx, found[0])
}

// recover is Recover on facts already read. The pass's first write
// carries those facts (RecordRecoveryParams.Facts), so that it reads
// nothing of them again and is refused if another write changed them
// since. Then, if the action is still one recovery decides about (approved,
// running or uncertain, of a live run), the pass is made once more from
// facts read afresh; only queries, which change nothing, can have been
// asked before that write. Otherwise the refusal is the answer: whatever
// settled the action meanwhile stands, and nothing of the pass is written.
func (r *Recoverer) recover(ctx context.Context, lf *ledger.RecoveryFacts) (Decision, error) {
	d, stale, err := r.pass(ctx, lf)
	if !stale {
		return d, err
	}
	fresh, ferr := r.cfg.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &lf.Action.ID})
	if ferr != nil {
		return Decision{}, fmt.Errorf("%w; read afresh: %w", err, ferr)
	}
	switch f := fresh[0]; {
	case f.Run.State.Terminal():
		return Decision{}, err
	case f.Action.State != ledger.ActionApproved && f.Action.State != ledger.ActionRunning && f.Action.State != ledger.ActionUncertain:
		return Decision{}, err
	}
	d, _, err = r.pass(ctx, fresh[0])
	return d, err
}

// pass decides about the action of lf and acts; stale reports that its
// first write was refused because the facts had changed, before anything
// was written or any tool asked to change anything.
func (r *Recoverer) pass(ctx context.Context, lf *ledger.RecoveryFacts) (d Decision, stale bool, err error) {
	f, probe := r.facts(lf)
	if probe.Client {
		told, err := r.cfg.Store.FindAgentDecision(ctx, lf.Action.ID)
		switch {
		case err == nil && !told.Answered:
			f.Told = &told
		case err != nil && ledger.Code(err) != ledger.CodeNotFound:
			return Decision{}, false, fmt.Errorf("recover %s: %w", lf.Action.ID, err)
		}
	}
	p := pass{facts: lf}
	write := func(final *Decision) error {
		withFacts := p.facts != nil
		err := r.write(ctx, lf.Run, f, &p, final)
		stale = withFacts && errors.Is(err, ledger.ErrConflict)
		return err
	}
	for range 4 { // at most a cancel and a query before a final decision
		d := Decide(f)
		if probe.Client && (d.Kind == Query || d.Kind == Cancel) {
			// The agent is the tool's hands: tell it, once.
			d.ID = DecisionID(f, d.Kind)
			p.decide(f, d)
			p.tell = &ledger.AgentDecision{ActionID: f.Action.ID, DecisionID: d.ID, Kind: string(d.Kind)}
			return d, stale, write(nil)
		}
		p.decide(f, d)
		if r.cfg.Guard != nil && (d.Kind == Query || d.Kind == Cancel) {
			if err := r.cfg.Guard(ctx, r.cfg.ProbeTimeout); err != nil {
				return d, stale, fmt.Errorf("recover %s: %s: %w", f.Action.ID, d.Kind, err)
			}
		}
		switch d.Kind {
		case Query:
			f.Query = r.query(ctx, f, probe, &p)
			if f.Query.Err != nil {
				f.QueryFailures++
			}
		case Cancel:
			// The cancel changes the world: the decision to ask for it is
			// durable before it is asked.
			if err := write(nil); err != nil {
				return d, stale, err
			}
			f.Cancel = r.cancel(ctx, f, probe, &p)
		default:
			if probe.Client && d.Kind == Continue && d.Effect == "" && f.Attempt != nil && f.Attempt.Effect == ledger.EffectUnknown {
				// The agent is told to resend: the decision stands until it
				// begins the new attempt, or its timeout hands it to a person.
				p.tell = &ledger.AgentDecision{ActionID: f.Action.ID, DecisionID: resendID(f.Action.ID, f.Attempt.ID), Kind: "resend"}
			}
			return d, stale, write(&d)
		}
	}
	return Decision{}, false, fmt.Errorf("recover %s: no final decision after probing", f.Action.ID)
}

// facts is what Decide needs, from what the ledger holds and the tool's
// probe.
func (r *Recoverer) facts(lf *ledger.RecoveryFacts) (Facts, Probe) {
	a := lf.Action
	f := Facts{Action: a, Attempt: lf.Attempt, Now: r.cfg.Now(), MaxQueryFailures: r.cfg.MaxQueryFailures,
		QueryFailures: lf.FailedQueries, Cancelling: lf.Cancellation != "" && lf.Cancellation != ledger.CancelRequested}
	probe, ok := r.cfg.Probes(a.Tool, a.ToolVersion)
	if !ok {
		// A tool we no longer have guarantees nothing: review.
		probe = Probe{}
	}
	f.Tool = probe.Tool
	f.Retry, f.RetryRationale = r.cfg.Retry(withInterrupted(lf.Run, lf.Attempt, f.Now), a, f.Now)
	if probe.Client {
		clientAnswers(&f, lf)
		return f, probe
	}
	// A guarantee without the means to use it is no guarantee.
	if probe.QueryFunc == nil {
		f.Tool.Guarantees.Query = false
	}
	if probe.CancelFunc == nil {
		f.Tool.Guarantees.Cancel = false
	}
	return f, probe
}

// clientAnswers puts into f what an agent answered for its tool since the
// attempt: an unknown answer to a query, queries that failed (asked again
// until the recovery budget is spent), a cancel not confirmed. An answer
// that established the effect is on the attempt already.
func clientAnswers(f *Facts, lf *ledger.RecoveryFacts) {
	if f.Attempt == nil || f.Attempt.Effect != ledger.EffectUnknown {
		return
	}
	switch {
	case lf.UnknownQueries > lf.FailedQueries:
		f.Query = &QueryAnswer{Effect: ledger.EffectUnknown}
	case lf.FailedQueries >= f.MaxQueryFailures:
		f.Query = &QueryAnswer{Effect: ledger.EffectUnknown, Err: fmt.Errorf("the agent reported %d failed queries", lf.FailedQueries)}
	}
	if lf.UnknownCancels > 0 {
		f.Cancel = &CancelAnswer{}
	}
}

// DecisionID names the facts a decision of kind rests on: the action and
// its version, its last attempt and its version, and the answers recorded
// about that attempt. It changes whenever they change, so an agent's
// answer to an older decision is recognised as stale.
func DecisionID(f Facts, kind Kind) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00%s\x00", f.Action.ID, f.Action.Version, kind)
	if f.Attempt != nil {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00", f.Attempt.ID, f.Attempt.Version, f.Attempt.Effect)
	}
	fmt.Fprintf(h, "%d\x00%t", f.QueryFailures, f.Cancel != nil)
	return "dec_" + hex.EncodeToString(h.Sum(nil))[:32]
}

// withInterrupted returns run with the time of its interrupted attempt,
// if att is one (still started), counted in its execution budget up to
// now: an interrupted attempt counts until it is found interrupted, and
// closing it adds exactly that time. Without it the budget verdict would
// see the budget as it was before the crash, allow one more attempt (or a
// resend) that the time already spent forbids, and the run would stop
// only later, with the effect of the interrupted call left unsettled.
func withInterrupted(run *ledger.Run, att *ledger.Attempt, now time.Time) *ledger.Run {
	if run == nil || att == nil || att.Status != ledger.AttemptStarted {
		return run
	}
	counted := *run
	counted.Budget.Used.Execution += max(now.Sub(att.StartedAt), 0)
	return &counted
}

// pass collects what a recovery pass decided and heard that is not written
// yet.
type pass struct {
	steps     []ledger.RecoveryStep
	decisions []Decision
	// tell is the decision the agent is told, for a client's tool.
	tell *ledger.AgentDecision
	// facts are the facts the pass decided on, until its first write: a
	// later write (after a cancel) rests on what that one wrote as well,
	// and reads the rows itself.
	facts *ledger.RecoveryFacts
}

func (p *pass) decide(f Facts, d Decision) {
	data := map[string]any{"query": f.Tool.Guarantees.Query, "dedup": f.Tool.Guarantees.Dedup, "cancel": f.Tool.Guarantees.Cancel}
	if d.StopReason != "" {
		data["stop_reason"] = d.StopReason
	}
	if d.ID != "" {
		data["decision_id"] = d.ID
	}
	p.steps = append(p.steps, ledger.RecoveryStep{Decision: &ledger.RecoveryDecision{Decision: string(d.Kind), Rationale: d.Rationale, Data: data}})
	p.decisions = append(p.decisions, d)
}

func (p *pass) observe(src ledger.ObservationSource, effect ledger.EffectFact, detail json.RawMessage) {
	p.steps = append(p.steps, ledger.RecoveryStep{Observation: &ledger.ObservationInput{Source: src, Effect: effect, Detail: detail}})
}

// write makes what p holds durable in one transaction, with the act on
// final if it is set, and then reports p's decisions to OnDecision.
func (r *Recoverer) write(ctx context.Context, run *ledger.Run, f Facts, p *pass, final *Decision) error {
	a := f.Action
	w := ledger.RecordRecoveryParams{ActionID: a.ID, ActionState: a.State, Steps: p.steps, Actor: "recovery", TellAgent: p.tell,
		Facts: p.facts}
	if f.Attempt != nil {
		w.AttemptID = f.Attempt.ID
	}
	kind := p.decisions[len(p.decisions)-1].Kind
	if final != nil {
		if err := plan(&w, run, f, *final); err != nil {
			return err
		}
	}
	res, err := r.cfg.Store.RecordRecovery(ctx, w)
	if err != nil {
		return fmt.Errorf("recover %s: %s: %w", a.ID, kind, err)
	}
	if r.cfg.OnDecision != nil && (w.TellAgent == nil || res.Told) {
		for _, d := range p.decisions {
			r.cfg.OnDecision(d)
		}
	}
	*p = pass{}
	return nil
}

// query asks the tool and keeps its answer as an observation to record; a
// failed query is recorded as unknown with the error, never as an answer,
// and so is an answer that cannot be recorded.
func (r *Recoverer) query(ctx context.Context, f Facts, probe Probe, p *pass) *QueryAnswer {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
	effect, out, err := probe.QueryFunc(qctx, f.Action.DedupKey)
	cancel()
	if err == nil {
		err = recordable(out)
	}
	ans := &QueryAnswer{Effect: effect, Err: err}
	detail := out
	if err != nil {
		ans.Effect = ledger.EffectUnknown
		detail, _ = json.Marshal(map[string]string{"error": err.Error()})
	} else if !effect.Valid() {
		ans.Effect = ledger.EffectUnknown
	}
	if f.Attempt != nil {
		p.observe(ledger.ObservedQuery, ans.Effect, detail)
	}
	return ans
}

// cancel asks the tool to cancel and keeps its answer to record; a
// confirmed cancel establishes that the effect did not happen. An answer
// that cannot be recorded counts as a failed cancel.
func (r *Recoverer) cancel(ctx context.Context, f Facts, probe Probe, p *pass) *CancelAnswer {
	cctx, stop := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
	confirmed, out, err := probe.CancelFunc(cctx, f.Action.DedupKey)
	stop()
	if err == nil {
		err = recordable(out)
	}
	ans := &CancelAnswer{Confirmed: confirmed && err == nil, Err: err}
	effect, detail := ledger.EffectUnknown, out
	if ans.Confirmed {
		effect = ledger.EffectNotHappened
	}
	if err != nil {
		detail, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	if f.Attempt != nil {
		p.observe(ledger.ObservedCancel, effect, detail)
	}
	return ans
}

// recordable refuses a tool's answer the ledger could not keep as an
// observation's detail (not JSON, or JSON it refuses); nil for none.
func recordable(out json.RawMessage) error {
	if len(out) == 0 {
		return nil
	}
	if _, err := ledger.Canonicalize(out); err != nil {
		return fmt.Errorf("the tool's answer cannot be recorded: %w", err)
	}
	return nil
}

// plan adds to w the act on a final decision: an attempt still marked
// started was interrupted, so it is closed (its status says we never saw
// the call's outcome; its effect stays what the probes established, or
// unknown); the action moves; for stop and review, the run too.
func plan(w *ledger.RecordRecoveryParams, run *ledger.Run, f Facts, d Decision) error {
	a := f.Action
	state := a.State
	var planErr error
	closeAttempt := func(status ledger.AttemptStatus) {
		if state != ledger.ActionRunning || f.Attempt == nil {
			return
		}
		w.CloseAttempt = &ledger.CloseAttempt{Status: status,
			Error: &ledger.AttemptError{Code: "interrupted", Message: "no outcome was recorded for this attempt: " + d.Rationale}}
		// Where the close leaves the action is the outcome table's, on
		// the effect as this pass's answers leave it.
		state, planErr = ledger.OutcomeOf(a.Effect, status, establishedEffect(f.Attempt, w.Steps))
	}
	move := func(to ledger.ActionState) {
		if state == to || planErr != nil {
			return
		}
		if state.Terminal() {
			planErr = fmt.Errorf("recover %s: %s: the close left the action %s, which cannot move to %s", a.ID, d.Kind, state, to)
			return
		}
		w.Moves = append(w.Moves, ledger.ActionMove{To: to, Data: map[string]any{"decision": d.Kind, "rationale": d.Rationale}})
		state = to
	}
	switch d.Kind {
	case Wait:
	case Continue:
		closeAttempt(ledger.AttemptUncertain)
		if state == ledger.ActionUncertain {
			move(ledger.ActionApproved)
		}
	case Reconcile:
		if state == ledger.ActionRunning {
			closeAttempt(ledger.AttemptUncertain)
		} else {
			move(ledger.ActionSucceeded)
		}
	case Cancelled:
		status := ledger.AttemptUncertain
		if f.Cancel != nil && f.Cancel.Confirmed {
			status = ledger.AttemptCancelled
		}
		closeAttempt(status)
		if state == ledger.ActionUncertain {
			move(ledger.ActionApproved)
		}
		move(ledger.ActionCancelled) // a cancel the tool confirmed closed it cancelled already
	case Stop:
		closeAttempt(ledger.AttemptUncertain)
		if state == ledger.ActionApproved {
			move(ledger.ActionCancelled)
		} else {
			move(ledger.ActionFailed)
		}
		if !run.State.Terminal() && run.State != ledger.RunStopping {
			w.Run = &ledger.RunTransition{ID: run.ID, From: run.State, To: d.StopReason.TerminalState(),
				StopReason: d.StopReason, Actor: "recovery", Data: map[string]any{"action_id": a.ID, "rationale": d.Rationale}}
		}
	case Review:
		closeAttempt(ledger.AttemptUncertain)
		move(ledger.ActionNeedsReview)
		if run.State.CanMoveTo(ledger.RunNeedsReview) {
			w.Run = &ledger.RunTransition{ID: run.ID, From: run.State, To: ledger.RunNeedsReview,
				Actor: "recovery", Data: map[string]any{"action_id": a.ID, "rationale": d.Rationale}}
		}
	default:
		return fmt.Errorf("recover %s: cannot act on %q", a.ID, d.Kind)
	}
	return planErr
}

// establishedEffect is the effect of att once the observations of steps
// are recorded: the first established one, as the ledger keeps it.
func establishedEffect(att *ledger.Attempt, steps []ledger.RecoveryStep) ledger.EffectFact {
	if att.Effect != ledger.EffectUnknown {
		return att.Effect
	}
	for _, st := range steps {
		if o := st.Observation; o != nil && o.Effect != ledger.EffectUnknown {
			return o.Effect
		}
	}
	return ledger.EffectUnknown
}

// ScanReport counts what a scan decided.
type ScanReport struct {
	Actions   int          `json:"actions"`
	Decisions map[Kind]int `json:"decisions"`
	// Cancellations lists the cancellations the scan settled
	// (Store.SettleCancellations): too_late on a run that had ended,
	// accepted on a live one.
	Cancellations []*ledger.Cancellation `json:"cancellations,omitempty"`
	// Held counts the runs with actions to recover whose lease another
	// process holds (Config.Lease): that process recovers them.
	Held   int      `json:"held,omitempty"`
	Errors []string `json:"errors,omitempty"`
}

// Scan recovers every action of a non-terminal run that is approved,
// running or uncertain: at start-up, before the engine takes work, and on
// `ledger recover`. First it settles the cancellations an older build or a
// crash left half-done (Store.SettleCancellations), so that a run whose
// cancel was accepted is stopping before its actions are decided, and a
// cancellation of a run that ended before it took effect is too_late
// instead of waiting forever. The facts are read in pages of runs, each page in one
// read (Store.FindRecoveryFacts); runs are recovered Config.ScanWorkers at
// a time (the actions of one run one after another, in order), each
// action's pass written in one transaction, so that the group commit
// shares one commit among many runs. An error on one action is reported
// and the scan goes on with the others; a cancelled ctx stops it.
func (r *Recoverer) Scan(ctx context.Context) (ScanReport, error) {
	rep := ScanReport{Decisions: map[Kind]int{}}
	settled, err := r.cfg.Store.SettleCancellations(ctx)
	if err != nil {
		return rep, fmt.Errorf("recovery scan: settle cancellations: %w", err)
	}
	rep.Cancellations = settled
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		next = make(chan scanRun)
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
	held := func(n int) {
		mu.Lock()
		rep.Held += n
		mu.Unlock()
	}
	for range r.cfg.ScanWorkers {
		wg.Go(func() {
			for run := range next {
				r.scanRun(run, note)
			}
		})
	}
	err = r.dispatch(ctx, next, held)
	close(next)
	wg.Wait()
	if cerr := ctx.Err(); cerr != nil {
		return rep, cerr
	}
	return rep, err
}

// scanRun is one run's actions for a worker of the scan, with the
// context to recover them with (under the run's lease, with Config.Lease)
// and whether the facts were read before the run was claimed.
type scanRun struct {
	ctx     context.Context
	facts   []*ledger.RecoveryFacts
	claimed bool
}

// scanRun recovers one run's actions, one after another, and hands the
// run back (Config.Done) if it was claimed for the scan.
func (r *Recoverer) scanRun(run scanRun, note func(Decision, error)) {
	ctx := run.ctx
	if run.claimed && r.cfg.Done != nil {
		defer r.cfg.Done(ctx, run.facts[0].Run.ID)
	}
	for i, lf := range run.facts {
		if ctx.Err() != nil {
			return
		}
		if i > 0 || run.claimed {
			// The run's earlier action may have moved the run (stop,
			// review), and the page was read before the run was claimed,
			// when another process may have held it: read this action's
			// facts afresh.
			fresh, err := r.cfg.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{ActionID: &lf.Action.ID})
			if err != nil {
				note(Decision{}, fmt.Errorf("recovery scan: %w", err))
				return
			}
			lf = fresh[0]
		}
		if lf.Run.State.Terminal() {
			return
		}
		note(r.recover(ctx, lf))
	}
}

// dispatch hands the workers the actions of one run at a time, page after
// page. The pages go by run id, so an action that recovery moves (running
// → approved) is not met again in a later page: each is decided once per
// scan. With Config.Lease, each page's runs are claimed first, and a run
// another process holds is counted with held and left to it.
func (r *Recoverer) dispatch(ctx context.Context, next chan<- scanRun, held func(int)) error {
	var after *ledger.RunID
	for {
		page, err := r.cfg.Store.FindRecoveryFacts(ctx, ledger.RecoveryFilter{AfterRun: after, Runs: r.cfg.ScanPage})
		if err != nil {
			return fmt.Errorf("recovery scan: %w", err)
		}
		if len(page) == 0 {
			return nil
		}
		var leased map[ledger.RunID]context.Context
		if r.cfg.Lease != nil {
			var ids []ledger.RunID
			for _, lf := range page {
				if len(ids) == 0 || ids[len(ids)-1] != lf.Run.ID {
					ids = append(ids, lf.Run.ID)
				}
			}
			if leased, err = r.cfg.Lease(ctx, ids); err != nil {
				return fmt.Errorf("recovery scan: claim runs: %w", err)
			}
			held(len(ids) - len(leased))
		}
		var runs []scanRun
		for start := 0; start < len(page); {
			end := start + 1
			for end < len(page) && page[end].Run.ID == page[start].Run.ID {
				end++
			}
			run := scanRun{ctx: ctx, facts: page[start:end]}
			if r.cfg.Lease != nil {
				run.ctx, run.claimed = leased[page[start].Run.ID], true
			}
			if run.ctx != nil { // else another process holds it
				runs = append(runs, run)
			}
			start = end
		}
		for i, run := range runs {
			select {
			case next <- run:
			case <-ctx.Done():
				for _, left := range runs[i:] {
					if left.claimed && r.cfg.Done != nil {
						r.cfg.Done(ctx, left.facts[0].Run.ID)
					}
				}
				return ctx.Err()
			}
		}
		last := page[len(page)-1].Run.ID
		after = &last
	}
}
