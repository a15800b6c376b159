package ledger

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"gorm.io/gorm"
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
	// FindAgentDecision returns the decision the agent was last told for
	// an action (id, kind, whether answered); CodeNotFound if none.
	FindAgentDecision(ctx context.Context, action ActionID) (AgentDecision, error)
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

type leaseRow struct {
	AttemptID     string `gorm:"primaryKey"`
	ActionID      string
	RunID         string
	BeginKey      string
	TokenSHA256   string `gorm:"column:token_sha256"`
	LeaseUs       int64
	LeaseUntil    int64
	MaxUntil      int64
	Heartbeats    int64
	Progress      *string
	OutcomeDigest *string
	Outcome       *string
}

func (leaseRow) TableName() string { return "attempt_leases" }

func (r *leaseRow) toLease() *AttemptLease {
	l := &AttemptLease{AttemptID: AttemptID(r.AttemptID), ActionID: ActionID(r.ActionID), RunID: RunID(r.RunID),
		BeginKey: r.BeginKey, TokenSHA256: r.TokenSHA256, Lease: time.Duration(r.LeaseUs) * time.Microsecond,
		Until: fromMicros(r.LeaseUntil), MaxUntil: fromMicros(r.MaxUntil), Heartbeats: r.Heartbeats}
	if r.Progress != nil {
		l.Progress = json.RawMessage(*r.Progress)
	}
	if r.OutcomeDigest != nil {
		l.OutcomeDigest = Digest(*r.OutcomeDigest)
	}
	if r.Outcome != nil {
		l.Outcome = json.RawMessage(*r.Outcome)
	}
	return l
}

type agentDecisionRow struct {
	ActionID   string `gorm:"primaryKey"`
	DecisionID string
	Kind       string
	Answered   bool
	DecidedAt  int64
}

func (agentDecisionRow) TableName() string { return "agent_decisions" }

// validTokenHash reports whether h is a SHA-256 in lowercase hex, as
// tokens are stored.
func validTokenHash(h string) bool {
	b, err := hex.DecodeString(h)
	return err == nil && len(b) == sha256.Size && h == strings.ToLower(h)
}

// BeginAttempt implements Store.
func (s *GormStore) BeginAttempt(ctx context.Context, p BeginAttemptParams) (BeginAttemptResult, error) {
	switch {
	case !ValidIdempotencyKey(p.Key):
		return BeginAttemptResult{}, Errorf(CodeInvalid, "begin attempt: the key must be 1–255 printable ASCII characters")
	case !validTokenHash(p.TokenSHA256):
		return BeginAttemptResult{}, Errorf(CodeInvalid, "begin attempt: the token hash must be 64 lowercase hex digits")
	case p.Lease <= 0 || p.MaxDuration < p.Lease:
		return BeginAttemptResult{}, Errorf(CodeInvalid, "begin attempt: the lease must be positive and no longer than the maximum")
	}
	var out BeginAttemptResult
	err := s.inTx(ctx, "begin attempt", func(tx *txn) error {
		out = BeginAttemptResult{}
		var prior leaseRow
		err := tx.db.Where("action_id = ? AND begin_key = ?", string(p.ActionID), p.Key).Take(&prior).Error
		switch {
		case err == nil:
			att, err := tx.findAttempt(AttemptID(prior.AttemptID))
			out = BeginAttemptResult{Attempt: att, Lease: prior.toLease(), Replayed: true}
			return err
		case !errors.Is(err, gorm.ErrRecordNotFound):
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
		row := leaseRow{AttemptID: string(att.ID), ActionID: string(att.ActionID), RunID: string(att.RunID), BeginKey: p.Key,
			TokenSHA256: p.TokenSHA256, LeaseUs: p.Lease.Microseconds(), LeaseUntil: micros(tx.now.Add(p.Lease)),
			MaxUntil: micros(tx.now.Add(p.MaxDuration))}
		if err := tx.db.Create(&row).Error; err != nil {
			return err
		}
		out = BeginAttemptResult{Attempt: att, Lease: row.toLease()}
		return nil
	})
	return out, err
}

// RenewLease implements Store.
func (s *GormStore) RenewLease(ctx context.Context, p RenewLeaseParams) (*AttemptLease, error) {
	var progress []byte
	if len(p.Progress) > 0 {
		var err error
		if progress, err = Canonicalize(p.Progress); err != nil {
			return nil, wrapErr("renew lease", err)
		}
	}
	var out *AttemptLease
	err := s.inTx(ctx, "renew lease", func(tx *txn) error {
		row, att, err := tx.leaseOf(p.AttemptID, p.TokenSHA256)
		if err != nil {
			return err
		}
		now := micros(tx.now)
		if att.Status != AttemptStarted || now >= row.LeaseUntil {
			return Errorf(CodeConflict, "attempt %s is closed: its lease lapsed or it was finished", att.ID)
		}
		row.LeaseUntil = min(now+row.LeaseUs, row.MaxUntil)
		row.Heartbeats++
		if progress != nil {
			row.Progress = strPtr(string(progress))
		}
		if err := tx.db.Model(&leaseRow{}).Where("attempt_id = ?", row.AttemptID).
			Updates(map[string]any{"lease_until": row.LeaseUntil, "heartbeats": row.Heartbeats, "progress": row.Progress}).Error; err != nil {
			return err
		}
		out = row.toLease()
		return nil
	})
	return out, err
}

// leaseOf reads an attempt's lease and the attempt, checking the token.
func (tx *txn) leaseOf(id AttemptID, tokenSHA256 string) (*leaseRow, *Attempt, error) {
	var row leaseRow
	if err := tx.db.Where("attempt_id = ?", string(id)).Take(&row).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, nil, Errorf(CodeNotFound, "attempt %s has no lease", id)
		}
		return nil, nil, err
	}
	if !validTokenHash(tokenSHA256) || subtle.ConstantTimeCompare([]byte(row.TokenSHA256), []byte(tokenSHA256)) != 1 {
		return nil, nil, Errorf(CodeForbidden, "that is not the token of attempt %s", id)
	}
	att, err := tx.findAttempt(id)
	return &row, att, err
}

// completeLease checks, within FinishAttempt's transaction, that the lease
// o completes through holds (its token, not lapsed, not completed) and
// keeps the outcome's digest on it.
func (tx *txn) completeLease(id AttemptID, o *LeaseOutcome) error {
	row, _, err := tx.leaseOf(id, o.TokenSHA256)
	if err != nil {
		return err
	}
	if row.OutcomeDigest != nil || micros(tx.now) >= row.LeaseUntil {
		return Errorf(CodeConflict, "attempt %s is closed: its lease lapsed or it was completed", id)
	}
	return tx.db.Model(&leaseRow{}).Where("attempt_id = ?", row.AttemptID).
		Updates(map[string]any{"outcome_digest": string(o.Digest), "outcome": string(o.Outcome)}).Error
}

// FindAttemptLease implements Store.
func (s *GormStore) FindAttemptLease(ctx context.Context, id AttemptID) (*AttemptLease, error) {
	var row leaseRow
	if err := s.r.WithContext(ctx).Where("attempt_id = ?", string(id)).Take(&row).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return nil, Errorf(CodeNotFound, "attempt %s has no lease", id)
		}
		return nil, wrapErr("find attempt lease", err)
	}
	return row.toLease(), nil
}

// FindLapsedLeases implements Store.
func (s *GormStore) FindLapsedLeases(ctx context.Context, before time.Time, limit int) ([]*AttemptLease, error) {
	var rows []leaseRow
	q := s.r.WithContext(ctx).Where("outcome_digest IS NULL AND lease_until < ? AND attempt_id IN (SELECT id FROM attempts WHERE status = ?)",
		micros(before), string(AttemptStarted)).Order("lease_until, attempt_id")
	if limit > 0 {
		q = q.Limit(limit)
	}
	if err := q.Find(&rows).Error; err != nil {
		return nil, wrapErr("find lapsed leases", err)
	}
	out := make([]*AttemptLease, len(rows))
	for i := range rows {
		out[i] = rows[i].toLease()
	}
	return out, nil
}

// FindAgentDecision implements Store.
func (s *GormStore) FindAgentDecision(ctx context.Context, action ActionID) (AgentDecision, error) {
	var row agentDecisionRow
	if err := s.r.WithContext(ctx).Where("action_id = ?", string(action)).Take(&row).Error; err != nil {
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return AgentDecision{}, Errorf(CodeNotFound, "no decision was told about action %s", action)
		}
		return AgentDecision{}, wrapErr("find agent decision", err)
	}
	return AgentDecision{ActionID: ActionID(row.ActionID), DecisionID: row.DecisionID, Kind: row.Kind, Answered: row.Answered,
		DecidedAt: fromMicros(row.DecidedAt)}, nil
}

// tellDecision records, within a recovery write, that the agent is told
// decision id about action; false if it was told that already (the write
// then records nothing).
func (tx *txn) tellDecision(action ActionID, id, kind string) (bool, error) {
	var row agentDecisionRow
	err := tx.db.Where("action_id = ?", string(action)).Take(&row).Error
	switch {
	case err == nil && row.DecisionID == id:
		return false, nil
	case err == nil:
		return true, tx.db.Model(&agentDecisionRow{}).Where("action_id = ?", string(action)).
			Updates(map[string]any{"decision_id": id, "kind": kind, "answered": false, "decided_at": micros(tx.now)}).Error
	case errors.Is(err, gorm.ErrRecordNotFound):
		return true, tx.db.Create(&agentDecisionRow{ActionID: string(action), DecisionID: id, Kind: kind, DecidedAt: micros(tx.now)}).Error
	default:
		return false, err
	}
}

// answerDecision marks, within an observation's write, the decision the
// observation answers; CodeConflict if it is not the current one or was
// answered already.
func (tx *txn) answerDecision(action ActionID, id string) error {
	res := tx.db.Model(&agentDecisionRow{}).Where("action_id = ? AND decision_id = ? AND answered = ?", string(action), id, false).
		Update("answered", true)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return Errorf(CodeConflict, "decision %s about action %s is not the current one, or was answered already", id, action)
	}
	return nil
}
