package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// StoreHealth watches the answers of the ledger stores it wraps (Watch):
// it counts the store's failures by operation, and knows whether writes
// fail now, so /readyz can say so and a full disk is seen. Writes fail from the first failed write until a write succeeds
// with no write failed for Hold: a disk that is nearly full lets some
// writes through (SQLite reuses its WAL after a checkpoint), and one lucky
// write must not make the store look sound. Once Hold has passed without a
// failed write, the engine's pool makes a probe write on its next pass
// (ledger.Store.ProbeWrite), so that a process with nothing else to write
// does not stay failing.
//
// A failure is an error the store could not help: CodeInternal (I/O, a
// full disk, a corrupt file) or CodeUnsupportedVersion. The domain's own
// answers (a lost race is CodeConflict, an unknown id CodeNotFound, and the
// other codes) mean the database answered: they are not failures, and,
// since they may be answered without writing, not successes either. Nor
// is a call that succeeds without writing: a replayed submit, a duplicate
// action, an existing cancellation, an expiry pass with nothing due, a
// recovery that records no decision. Errors of a cancelled context are
// neither.
type StoreHealth struct {
	now  func() time.Time
	log  *slog.Logger
	logs *failureLog
	hold time.Duration

	counts  map[string]*atomic.Uint64 // by op; every op is present
	failing atomic.Bool

	mu       sync.Mutex
	since    time.Time // first failed write of this episode
	last     time.Time // last failed write
	okAfter  bool      // a write succeeded after the last failed one
	failures int64     // failed writes in this episode
	first    error     // the first of them
	lastOK   time.Time // when "succeed again" was last logged
	// ok is closed when this episode ends: whoever backs off waits on it
	// too, to resume as soon as writes succeed again.
	ok chan struct{}
}

// StoreHealthConfig builds a StoreHealth.
type StoreHealthConfig struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives "store writes failing" when writes start to fail and
	// "store writes succeed again" when they stop; nil discards.
	Logger *slog.Logger
	// LogInterval is the most often either line is logged; a failure that
	// repeats within it is counted in the next line. 0 means 10s.
	LogInterval time.Duration
	// Hold is how long writes must have stopped failing before one that
	// succeeds ends the failing; 0 means 2s.
	Hold time.Duration
}

// NewStoreHealth returns a StoreHealth with nothing failing.
func NewStoreHealth(cfg StoreHealthConfig) *StoreHealth {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = defaultLogInterval
	}
	if cfg.Hold <= 0 {
		cfg.Hold = defaultHealthHold
	}
	h := &StoreHealth{now: cfg.Now, log: cfg.Logger, logs: newFailureLog(cfg.Logger, cfg.Now, cfg.LogInterval),
		hold: cfg.Hold, counts: map[string]*atomic.Uint64{}}
	for _, op := range append(storeWrites[:], storeReads[:]...) {
		h.counts[op] = new(atomic.Uint64)
	}
	return h
}

// The operations of the Store, as the op label of ledger_store_errors_total
// names them: a bounded set.
var (
	storeWrites = [...]string{"submit_run", "transition_run", "create_action", "transition_action", "start_attempt",
		"finish_attempt", "record_observation", "settle_review", "decide_approval", "expire_approvals", "reask_approval", "request_cancel",
		"transition_cancellation", "settle_cancellations", "add_usage", "record_recovery", "begin_attempt", "renew_lease",
		"claim_runs", "renew_run_leases", "release_run_lease", "probe_write", "put_rule_set"}
	storeReads = [...]string{"find_run_by_id", "find_runs", "find_action_by_id", "find_actions", "find_attempts",
		"find_observations", "find_approvals", "find_cancellation", "find_recovery_facts", "find_events", "find_events_after", "verify_chain",
		"find_chain", "count_by_state", "find_attempt_lease", "find_lapsed_leases", "find_agent_decision", "find_agent_decisions",
		"find_run_lease", "find_run_lease_owners", "find_rule_sets"}
)

// StoreOps lists the operations StoreHealth counts, writes first.
func StoreOps() []string { return append(storeWrites[:], storeReads[:]...) }

// Err is nil while writes succeed; while they fail, it says since when,
// how many failed and the first error.
func (h *StoreHealth) Err() error {
	if !h.failing.Load() {
		return nil
	}
	h.settle(context.Background())
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing.Load() {
		return nil
	}
	return fmt.Errorf("store writes failing since %s (%d failed): %w", h.since.UTC().Format(time.RFC3339), h.failures, h.first)
}

// Errors returns the number of failures so far by operation, every
// operation of StoreOps present.
func (h *StoreHealth) Errors() map[string]uint64 {
	out := make(map[string]uint64, len(h.counts))
	for op, n := range h.counts {
		out[op] = n.Load()
	}
	return out
}

// IsStoreFailure reports whether err is a failure of the store rather than
// one of its answers (see StoreHealth).
func IsStoreFailure(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch ledger.Code(err) {
	case ledger.CodeInternal, ledger.CodeUnsupportedVersion:
		return true
	}
	return false
}

// write notes the outcome of a write; wrote says whether a call that
// succeeded wrote anything.
func (h *StoreHealth) write(ctx context.Context, op string, err error, wrote bool) {
	switch {
	case err == nil && wrote:
		if h.failing.Load() {
			h.mu.Lock()
			h.okAfter = true
			h.mu.Unlock()
			h.settle(ctx)
		}
	case IsStoreFailure(err):
		h.counts[op].Add(1)
		now := h.now()
		h.mu.Lock()
		if !h.failing.Load() {
			h.since, h.failures, h.first, h.ok = now, 0, err, make(chan struct{})
			h.failing.Store(true)
		}
		h.failures++
		h.last, h.okAfter = now, false
		h.mu.Unlock()
		h.logs.Error(ctx, "store writes failing", err, "op", op)
	}
}

// read notes the outcome of a read: counted, but writes alone decide
// whether the store is failing (a read that fails is seen by /readyz's
// own read).
func (h *StoreHealth) read(op string, err error) {
	if IsStoreFailure(err) {
		h.counts[op].Add(1)
	}
}

// settle ends a failing episode once a write has succeeded and none has
// failed for Hold.
func (h *StoreHealth) settle(ctx context.Context) {
	h.mu.Lock()
	now := h.now()
	if !h.failing.Load() || !h.okAfter || now.Sub(h.last) < h.hold {
		h.mu.Unlock()
		return
	}
	h.failing.Store(false)
	close(h.ok)
	n, took := h.failures, now.Sub(h.since)
	quiet := now.Sub(h.lastOK) >= h.logs.every
	if quiet {
		h.lastOK = now
	}
	h.mu.Unlock()
	if quiet {
		h.log.InfoContext(ctx, "store writes succeed again", "failed", n, "after", took.Round(time.Millisecond).String())
	}
}

// probeDue reports whether a failing episode has gone Hold without a
// failed write, so that a probe write (ledger.Store.ProbeWrite) may end
// it: a process with nothing else to write would otherwise stay failing.
func (h *StoreHealth) probeDue() bool {
	if !h.failing.Load() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failing.Load() && h.now().Sub(h.last) >= h.hold
}

// recoveredC returns a channel closed when writes succeed again, or nil
// (never ready) while they do not fail.
func (h *StoreHealth) recoveredC() <-chan struct{} {
	if !h.failing.Load() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing.Load() {
		return nil
	}
	return h.ok
}

// flush writes the failure counts that are due, and ends a failing episode
// whose Hold is over (the pool calls it on each pass).
func (h *StoreHealth) flush(ctx context.Context) {
	h.logs.Flush(ctx)
	if h.failing.Load() {
		h.settle(ctx)
	}
}

// Watch returns s with every call's outcome noted in h. Watching a store h
// already watches returns it unchanged, so nothing is counted twice.
// Methods the Store gains later pass through unwatched until listed here.
func (h *StoreHealth) Watch(s ledger.Store) ledger.Store {
	if w, ok := s.(*watchedStore); ok && w.h == h {
		return s
	}
	return &watchedStore{store: s, h: h}
}

// watchedStore notes the outcome of each call in its StoreHealth. It
// holds the store as a field, not embedded, so that a method the Store
// gains does not pass through unwatched: the build fails until it is
// written here, and its op added to storeWrites or storeReads.
type watchedStore struct {
	store ledger.Store
	h     *StoreHealth
}

// Close implements ledger.Store; closing is neither failure nor success.
func (s *watchedStore) Close() error { return s.store.Close() }

// The writes.

func (s *watchedStore) SubmitRun(ctx context.Context, p ledger.SubmitRunParams) (ledger.SubmitRunResult, error) {
	r, err := s.store.SubmitRun(ctx, p)
	s.h.write(ctx, "submit_run", err, !r.Replayed)
	return r, err
}

func (s *watchedStore) TransitionRun(ctx context.Context, p ledger.RunTransition) (*ledger.Run, error) {
	r, err := s.store.TransitionRun(ctx, p)
	s.h.write(ctx, "transition_run", err, true)
	return r, err
}

func (s *watchedStore) CreateAction(ctx context.Context, p ledger.CreateActionParams) (ledger.CreateActionResult, error) {
	r, err := s.store.CreateAction(ctx, p)
	s.h.write(ctx, "create_action", err, !r.Duplicate)
	return r, err
}

func (s *watchedStore) TransitionAction(ctx context.Context, p ledger.ActionTransition) (*ledger.Action, error) {
	r, err := s.store.TransitionAction(ctx, p)
	s.h.write(ctx, "transition_action", err, true)
	return r, err
}

func (s *watchedStore) StartAttempt(ctx context.Context, p ledger.StartAttemptParams) (*ledger.Attempt, error) {
	r, err := s.store.StartAttempt(ctx, p)
	s.h.write(ctx, "start_attempt", err, true)
	return r, err
}

func (s *watchedStore) FinishAttempt(ctx context.Context, p ledger.FinishAttemptParams) (ledger.FinishAttemptResult, error) {
	r, err := s.store.FinishAttempt(ctx, p)
	s.h.write(ctx, "finish_attempt", err, true)
	return r, err
}

func (s *watchedStore) RecordObservation(ctx context.Context, p ledger.RecordObservationParams) (*ledger.Observation, *ledger.Attempt, error) {
	o, a, err := s.store.RecordObservation(ctx, p)
	s.h.write(ctx, "record_observation", err, true)
	return o, a, err
}

func (s *watchedStore) SettleReview(ctx context.Context, p ledger.SettleReviewParams) (*ledger.Action, error) {
	r, err := s.store.SettleReview(ctx, p)
	s.h.write(ctx, "settle_review", err, true)
	return r, err
}

func (s *watchedStore) DecideApproval(ctx context.Context, p ledger.DecideApprovalParams) (ledger.DecideApprovalResult, error) {
	r, err := s.store.DecideApproval(ctx, p)
	s.h.write(ctx, "decide_approval", err, true)
	return r, err
}

func (s *watchedStore) ExpireApprovals(ctx context.Context) ([]*ledger.Approval, error) {
	r, err := s.store.ExpireApprovals(ctx)
	s.h.write(ctx, "expire_approvals", err, len(r) > 0)
	return r, err
}

func (s *watchedStore) ReaskApproval(ctx context.Context, p ledger.ReaskApprovalParams) (ledger.ReaskApprovalResult, error) {
	r, err := s.store.ReaskApproval(ctx, p)
	s.h.write(ctx, "reask_approval", err, true)
	return r, err
}

func (s *watchedStore) SettleCancellations(ctx context.Context) ([]*ledger.Cancellation, error) {
	r, err := s.store.SettleCancellations(ctx)
	s.h.write(ctx, "settle_cancellations", err, len(r) > 0)
	return r, err
}

func (s *watchedStore) RequestCancel(ctx context.Context, p ledger.RequestCancelParams) (ledger.RequestCancelResult, error) {
	r, err := s.store.RequestCancel(ctx, p)
	s.h.write(ctx, "request_cancel", err, r.Created)
	return r, err
}

func (s *watchedStore) TransitionCancellation(ctx context.Context, p ledger.CancellationTransition) (*ledger.Cancellation, error) {
	r, err := s.store.TransitionCancellation(ctx, p)
	s.h.write(ctx, "transition_cancellation", err, true)
	return r, err
}

func (s *watchedStore) AddUsage(ctx context.Context, p ledger.AddUsageParams) (*ledger.Budget, error) {
	r, err := s.store.AddUsage(ctx, p)
	s.h.write(ctx, "add_usage", err, true)
	return r, err
}

func (s *watchedStore) RecordRecovery(ctx context.Context, p ledger.RecordRecoveryParams) (ledger.RecordRecoveryResult, error) {
	r, err := s.store.RecordRecovery(ctx, p)
	s.h.write(ctx, "record_recovery", err, len(r.Decisions) > 0)
	return r, err
}

func (s *watchedStore) ClaimRuns(ctx context.Context, p ledger.ClaimRunsParams) ([]ledger.RunLease, error) {
	r, err := s.store.ClaimRuns(ctx, p)
	s.h.write(ctx, "claim_runs", err, len(r) > 0)
	return r, err
}

func (s *watchedStore) RenewRunLeases(ctx context.Context, owner string, leases []ledger.RunLease, ttl time.Duration) ([]ledger.RunLease, error) {
	r, err := s.store.RenewRunLeases(ctx, owner, leases, ttl)
	s.h.write(ctx, "renew_run_leases", err, len(r) > 0)
	return r, err
}

func (s *watchedStore) ReleaseRunLease(ctx context.Context, l ledger.RunLease) error {
	err := s.store.ReleaseRunLease(ctx, l)
	s.h.write(ctx, "release_run_lease", err, true)
	return err
}

// ProbeWrite implements ledger.Store: a write that always writes.
func (s *watchedStore) ProbeWrite(ctx context.Context) error {
	err := s.store.ProbeWrite(ctx)
	s.h.write(ctx, "probe_write", err, true)
	return err
}

// PutRuleSet implements ledger.Store.
func (s *watchedStore) PutRuleSet(ctx context.Context, document json.RawMessage) (ledger.PutRuleSetResult, error) {
	r, err := s.store.PutRuleSet(ctx, document)
	s.h.write(ctx, "put_rule_set", err, r.Created)
	return r, err
}

// The reads.

func (s *watchedStore) FindRuleSets(ctx context.Context, f ledger.RuleSetFilter) ([]*ledger.RuleSet, error) {
	r, err := s.store.FindRuleSets(ctx, f)
	s.h.read("find_rule_sets", err)
	return r, err
}

func (s *watchedStore) FindRunLeaseOwners(ctx context.Context) ([]string, error) {
	r, err := s.store.FindRunLeaseOwners(ctx)
	s.h.read("find_run_lease_owners", err)
	return r, err
}

func (s *watchedStore) FindRunLease(ctx context.Context, run ledger.RunID) (ledger.RunLease, error) {
	r, err := s.store.FindRunLease(ctx, run)
	s.h.read("find_run_lease", err)
	return r, err
}

func (s *watchedStore) FindRunByID(ctx context.Context, id ledger.RunID) (*ledger.Run, error) {
	r, err := s.store.FindRunByID(ctx, id)
	s.h.read("find_run_by_id", err)
	return r, err
}

func (s *watchedStore) FindRuns(ctx context.Context, f ledger.RunFilter) ([]*ledger.Run, error) {
	r, err := s.store.FindRuns(ctx, f)
	s.h.read("find_runs", err)
	return r, err
}

func (s *watchedStore) FindActionByID(ctx context.Context, id ledger.ActionID) (*ledger.Action, error) {
	r, err := s.store.FindActionByID(ctx, id)
	s.h.read("find_action_by_id", err)
	return r, err
}

func (s *watchedStore) FindActions(ctx context.Context, f ledger.ActionFilter) ([]*ledger.Action, error) {
	r, err := s.store.FindActions(ctx, f)
	s.h.read("find_actions", err)
	return r, err
}

func (s *watchedStore) BeginAttempt(ctx context.Context, p ledger.BeginAttemptParams) (ledger.BeginAttemptResult, error) {
	r, err := s.store.BeginAttempt(ctx, p)
	s.h.write(ctx, "begin_attempt", err, !r.Replayed)
	return r, err
}

func (s *watchedStore) RenewLease(ctx context.Context, p ledger.RenewLeaseParams) (*ledger.AttemptLease, error) {
	r, err := s.store.RenewLease(ctx, p)
	s.h.write(ctx, "renew_lease", err, true)
	return r, err
}

func (s *watchedStore) FindAttemptLease(ctx context.Context, id ledger.AttemptID) (*ledger.AttemptLease, error) {
	r, err := s.store.FindAttemptLease(ctx, id)
	s.h.read("find_attempt_lease", err)
	return r, err
}

func (s *watchedStore) FindLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*ledger.AttemptLease, error) {
	r, err := s.store.FindLapsedLeases(ctx, before, limit)
	s.h.read("find_lapsed_leases", err)
	return r, err
}

func (s *watchedStore) FindAgentDecisions(ctx context.Context, f ledger.AgentDecisionFilter) ([]*ledger.AgentDecision, error) {
	r, err := s.store.FindAgentDecisions(ctx, f)
	s.h.read("find_agent_decisions", err)
	return r, err
}

func (s *watchedStore) FindAgentDecision(ctx context.Context, id ledger.ActionID) (ledger.AgentDecision, error) {
	r, err := s.store.FindAgentDecision(ctx, id)
	s.h.read("find_agent_decision", err)
	return r, err
}

func (s *watchedStore) FindAttempts(ctx context.Context, f ledger.AttemptFilter) ([]*ledger.Attempt, error) {
	r, err := s.store.FindAttempts(ctx, f)
	s.h.read("find_attempts", err)
	return r, err
}

func (s *watchedStore) FindObservations(ctx context.Context, f ledger.ObservationFilter) ([]*ledger.Observation, error) {
	r, err := s.store.FindObservations(ctx, f)
	s.h.read("find_observations", err)
	return r, err
}

func (s *watchedStore) FindApprovals(ctx context.Context, f ledger.ApprovalFilter) ([]*ledger.Approval, error) {
	r, err := s.store.FindApprovals(ctx, f)
	s.h.read("find_approvals", err)
	return r, err
}

func (s *watchedStore) FindCancellation(ctx context.Context, run ledger.RunID) (*ledger.Cancellation, error) {
	r, err := s.store.FindCancellation(ctx, run)
	s.h.read("find_cancellation", err)
	return r, err
}

func (s *watchedStore) FindRecoveryFacts(ctx context.Context, f ledger.RecoveryFilter) ([]*ledger.RecoveryFacts, error) {
	r, err := s.store.FindRecoveryFacts(ctx, f)
	s.h.read("find_recovery_facts", err)
	return r, err
}

func (s *watchedStore) FindEvents(ctx context.Context, run ledger.RunID) ([]*ledger.Event, error) {
	r, err := s.store.FindEvents(ctx, run)
	s.h.read("find_events", err)
	return r, err
}

func (s *watchedStore) FindEventsAfter(ctx context.Context, f ledger.EventFilter) ([]*ledger.Event, error) {
	r, err := s.store.FindEventsAfter(ctx, f)
	s.h.read("find_events_after", err)
	return r, err
}

func (s *watchedStore) VerifyChain(ctx context.Context, run ledger.RunID) (ledger.ChainReport, error) {
	r, err := s.store.VerifyChain(ctx, run)
	s.h.read("verify_chain", err)
	return r, err
}

func (s *watchedStore) CountByState(ctx context.Context) (*ledger.Counts, error) {
	r, err := s.store.CountByState(ctx)
	s.h.read("count_by_state", err)
	return r, err
}

func (s *watchedStore) FindChain(ctx context.Context, run ledger.RunID) (*ledger.Chain, error) {
	r, err := s.store.FindChain(ctx, run)
	s.h.read("find_chain", err)
	return r, err
}
