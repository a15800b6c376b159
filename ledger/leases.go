package ledger

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"
)

// AttemptLease is the lease of an attempt a client executes (the agent
// protocol, docs/agent-protocol.md): the attempt's secret token as its
// SHA-256, until when the lease holds, how far heartbeats may renew it, and
// once the attempt is completed through it, the digest of that outcome.
// Leases are operational state: the attempt row and its events are the
// evidence.
type AttemptLease struct {
	AttemptID   AttemptID
	ActionID    ActionID
	RunID       RunID
	BeginKey    string
	TokenSHA256 string
	// Lease is how long each heartbeat extends the lease.
	Lease time.Duration
	// Until is when the lease lapses unless renewed; MaxUntil is the
	// latest a heartbeat may renew it to.
	Until, MaxUntil time.Time
	Heartbeats      int64
	Progress        json.RawMessage
	// OutcomeDigest is the digest of the outcome the attempt was completed
	// with through this lease, and Outcome that outcome; empty until then.
	OutcomeDigest Digest
	Outcome       json.RawMessage
}

// Lapsed reports whether the lease has lapsed at now.
func (l *AttemptLease) Lapsed(now time.Time) bool { return !now.Before(l.Until) }

// BeginAttemptParams begins an attempt that a client executes.
type BeginAttemptParams struct {
	ActionID ActionID
	// Key makes the begin idempotent per action: the same key returns the
	// same attempt and lease.
	Key         string
	TokenSHA256 string
	// Lease is the lease's length, renewed by each heartbeat, never past
	// MaxDuration after the begin.
	Lease, MaxDuration time.Duration
	Actor              string
}

// BeginAttemptResult is the attempt, its lease, and whether the key had
// begun it before.
type BeginAttemptResult struct {
	Attempt  *Attempt
	Lease    *AttemptLease
	Replayed bool
}

// RenewLeaseParams renews an attempt's lease by a heartbeat.
type RenewLeaseParams struct {
	AttemptID   AttemptID
	TokenSHA256 string
	// Progress, if set, replaces the stored progress (redacted by the
	// caller).
	Progress json.RawMessage
}

// LeaseOutcome is the lease a FinishAttempt completes through: the
// token presented and the digest of the outcome reported, kept for
// replays.
type LeaseOutcome struct {
	TokenSHA256 string
	Digest      Digest
	Outcome     json.RawMessage // canonical
}

// LeaseStore is the part of Store the agent protocol uses: leases of
// attempts a client executes, and the decisions its agent was told.
type LeaseStore interface {
	// BeginAttempt starts an attempt as StartAttempt does and gives it a
	// lease, in one transaction; a repeat of (action, key) returns the
	// same attempt and lease with Replayed set, whatever happened since.
	// CodeConflict if the action is running (another attempt is open).
	BeginAttempt(ctx context.Context, p BeginAttemptParams) (BeginAttemptResult, error)
	// RenewLease extends an open lease by its length, up to its maximum,
	// and stores the progress. CodeForbidden for another token;
	// CodeConflict once the attempt is closed or the lease has lapsed.
	RenewLease(ctx context.Context, p RenewLeaseParams) (*AttemptLease, error)
	// FindAttemptLease returns an attempt's lease; CodeNotFound if the
	// attempt has none.
	FindAttemptLease(ctx context.Context, id AttemptID) (*AttemptLease, error)
	// FindLapsedLeases lists, oldest first, the leases of attempts still
	// started whose lease lapsed before the time given, at most limit.
	FindLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*AttemptLease, error)
	// FindAgentDecisions lists, oldest first, the decisions agents were
	// told and have not answered, about actions that are approved, running
	// or uncertain: those a decision timeout may hand to a person.
	FindAgentDecisions(ctx context.Context, f AgentDecisionFilter) ([]*AgentDecision, error)
	// FindAgentDecision returns the decision the agent was last told for
	// an action (id, kind, whether answered); CodeNotFound if none.
	FindAgentDecision(ctx context.Context, action ActionID) (AgentDecision, error)
}

// AgentDecisionFilter selects told decisions nobody has answered yet
// (Store.FindAgentDecisions).
type AgentDecisionFilter struct {
	// DecidedBefore: only decisions told at or before it.
	DecidedBefore time.Time
	// After, if set, is the cursor: only decisions after it in
	// (DecidedAt, ActionID) order.
	After *AgentDecision
	// Limit ≤ 0 is no limit.
	Limit int
}

// AgentDecision is the recovery decision an agent was last told about an
// action, and whether an observation answered it.
type AgentDecision struct {
	ActionID   ActionID
	DecisionID string
	Kind       string
	Answered   bool
	DecidedAt  time.Time
}

// validTokenHash reports whether h is a SHA-256 in lowercase hex, as
// tokens are stored.
func validTokenHash(h string) bool {
	b, err := hex.DecodeString(h)
	return err == nil && len(b) == sha256.Size && h == strings.ToLower(h)
}

// BeginAttempt implements Store.
func (s *DB) BeginAttempt(ctx context.Context, p BeginAttemptParams) (BeginAttemptResult, error) {
	switch {
	case !ValidIdempotencyKey(p.Key):
		return BeginAttemptResult{}, Errorf(CodeInvalid, "begin attempt: the key must be 1–255 printable ASCII characters")
	case !validTokenHash(p.TokenSHA256):
		return BeginAttemptResult{}, Errorf(CodeInvalid, "begin attempt: the token hash must be 64 lowercase hex digits")
	case p.Lease <= 0 || p.MaxDuration < p.Lease:
		return BeginAttemptResult{}, Errorf(CodeInvalid, "begin attempt: the lease must be positive and no longer than the maximum")
	}
	var out BeginAttemptResult
	err := s.inTx(ctx, "begin_attempt", func(tx *txn) error {
		out = BeginAttemptResult{}
		prior, err := tx.d.GetAttemptLeaseByKey(tx.ctx, p.ActionID, p.Key)
		switch {
		case err == nil:
			att, err := tx.findAttempt(prior.AttemptID)
			out = BeginAttemptResult{Attempt: att, Lease: prior, Replayed: true}
			return err
		case Code(err) != CodeNotFound:
			return err
		}
		action, err := tx.findAction(p.ActionID)
		if err != nil {
			return err
		}
		if action.State == ActionRunning {
			return Errorf(CodeConflict, "action %s has an attempt open", action.ID)
		}
		att, err := tx.startAttempt(StartAttemptParams{ActionID: p.ActionID, Actor: p.Actor})
		if err != nil {
			return err
		}
		lease := &AttemptLease{AttemptID: att.ID, ActionID: att.ActionID, RunID: att.RunID, BeginKey: p.Key,
			TokenSHA256: p.TokenSHA256, Lease: p.Lease.Truncate(time.Microsecond),
			Until: tx.now.Add(p.Lease).Truncate(time.Microsecond), MaxUntil: tx.now.Add(p.MaxDuration).Truncate(time.Microsecond)}
		if err := tx.d.InsertAttemptLease(tx.ctx, lease); err != nil {
			return err
		}
		out = BeginAttemptResult{Attempt: att, Lease: lease}
		return nil
	})
	return out, err
}

// RenewLease implements Store.
func (s *DB) RenewLease(ctx context.Context, p RenewLeaseParams) (*AttemptLease, error) {
	var progress []byte
	if len(p.Progress) > 0 {
		var err error
		if progress, err = Canonicalize(p.Progress); err != nil {
			return nil, wrapErr("renew lease", err)
		}
	}
	var out *AttemptLease
	err := s.inTx(ctx, "renew_lease", func(tx *txn) error {
		lease, att, err := tx.leaseOf(p.AttemptID, p.TokenSHA256)
		if err != nil {
			return err
		}
		if att.Status != AttemptStarted || !tx.now.Before(lease.Until) {
			return Errorf(CodeConflict, "attempt %s is closed: its lease lapsed or it was finished", att.ID)
		}
		if until := tx.now.Add(lease.Lease); until.Before(lease.MaxUntil) {
			lease.Until = until
		} else {
			lease.Until = lease.MaxUntil
		}
		lease.Heartbeats++
		if progress != nil {
			lease.Progress = progress
		}
		if err := tx.d.UpdateAttemptLease(tx.ctx, lease); err != nil {
			return err
		}
		tx.wrote = true
		out = lease
		return nil
	})
	return out, err
}

// leaseOf reads the lease of attempt id and its attempt, if tokenSHA256 is
// its token's hash: CodeNotFound if it has none, CodeForbidden for another
// token.
func (tx *txn) leaseOf(id AttemptID, tokenSHA256 string) (*AttemptLease, *Attempt, error) {
	lease, err := tx.d.GetAttemptLease(tx.ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if !validTokenHash(tokenSHA256) || subtle.ConstantTimeCompare([]byte(lease.TokenSHA256), []byte(tokenSHA256)) != 1 {
		return nil, nil, Errorf(CodeForbidden, "that is not the token of attempt %s", id)
	}
	att, err := tx.findAttempt(id)
	return lease, att, err
}

// completeLease records, on the lease of attempt id, the outcome it is
// completed with: CodeConflict if it was completed or has lapsed.
func (tx *txn) completeLease(id AttemptID, o *LeaseOutcome) error {
	lease, _, err := tx.leaseOf(id, o.TokenSHA256)
	if err != nil {
		return err
	}
	if lease.OutcomeDigest != "" || !tx.now.Before(lease.Until) {
		return Errorf(CodeConflict, "attempt %s is closed: its lease lapsed or it was completed", id)
	}
	lease.OutcomeDigest, lease.Outcome = o.Digest, o.Outcome
	tx.wrote = true
	return tx.d.UpdateAttemptLease(tx.ctx, lease)
}

// FindAttemptLease implements Store.
func (s *DB) FindAttemptLease(ctx context.Context, id AttemptID) (*AttemptLease, error) {
	return read(ctx, s, "find_attempt_lease", func(r Reader) (*AttemptLease, error) { return r.GetAttemptLease(ctx, id) })
}

// FindLapsedLeases implements Store.
func (s *DB) FindLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*AttemptLease, error) {
	return read(ctx, s, "find_lapsed_leases", func(r Reader) ([]*AttemptLease, error) { return r.ListLapsedLeases(ctx, before, limit) })
}

// FindAgentDecisions implements Store.
func (s *DB) FindAgentDecisions(ctx context.Context, f AgentDecisionFilter) ([]*AgentDecision, error) {
	return read(ctx, s, "find_agent_decisions", func(r Reader) ([]*AgentDecision, error) { return r.ListAgentDecisions(ctx, f) })
}

// FindAgentDecision implements Store.
func (s *DB) FindAgentDecision(ctx context.Context, action ActionID) (AgentDecision, error) {
	d, err := read(ctx, s, "find_agent_decision", func(r Reader) (*AgentDecision, error) { return r.GetAgentDecision(ctx, action) })
	if err != nil {
		return AgentDecision{}, err
	}
	return *d, nil
}

// tellDecision records that the decision id of kind is told about action,
// replacing an earlier one; false if it was told already (the same id).
func (tx *txn) tellDecision(action ActionID, id, kind string) (bool, error) {
	d, err := tx.d.GetAgentDecision(tx.ctx, action)
	switch {
	case err == nil && d.DecisionID == id:
		return false, nil
	case err == nil, Code(err) == CodeNotFound:
		tx.wrote = true
		return true, tx.d.PutAgentDecision(tx.ctx, &AgentDecision{ActionID: action, DecisionID: id, Kind: kind, DecidedAt: tx.now})
	default:
		return false, err
	}
}

// answerDecision marks the decision id about action answered:
// CodeConflict if it is not the current one or was answered already.
func (tx *txn) answerDecision(action ActionID, id string) error {
	ok, err := tx.d.AnswerAgentDecision(tx.ctx, action, id)
	if err != nil {
		return err
	}
	tx.wrote = tx.wrote || ok
	if !ok {
		return Errorf(CodeConflict, "decision %s about action %s is not the current one, or was answered already", id, action)
	}
	return nil
}
