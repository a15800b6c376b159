package postgres

import (
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// Row structs mirror the tables of migrations/0001_schema.sql; they never
// leave the package. Times are unix microseconds; nullable columns are
// pointers. Each column list below and its Scan targets must stay in the
// same order.

type runRow struct {
	ID             string
	Tenant         string
	IdempotencyKey string
	RequestDigest  string
	SubmittedBy    string
	Agent          string
	Input          string
	State          string
	StopReason     *string
	Version        int64
	EventSeq       int64
	EventHash      string
	CreatedAt      int64
	UpdatedAt      int64
}

const runCols = `id, tenant, idempotency_key, request_digest, submitted_by, agent, input, state, stop_reason, version,
	event_seq, event_hash, created_at, updated_at`

func (r *runRow) targets() []any {
	return []any{&r.ID, &r.Tenant, &r.IdempotencyKey, &r.RequestDigest, &r.SubmittedBy, &r.Agent, &r.Input, &r.State,
		&r.StopReason, &r.Version, &r.EventSeq, &r.EventHash, &r.CreatedAt, &r.UpdatedAt}
}

type budgetRow struct {
	RunID                string
	MaxAttemptsPerAction int64
	MaxAttemptsPerRun    int64
	MaxExecutionUs       int64
	MaxSteps             int64
	MaxTokens            int64
	DeadlineAt           *int64
	AttemptsUsed         int64
	ExecutionUsedUs      int64
	StepsUsed            int64
	TokensUsed           int64
	TokensUnavailable    bool
	Version              int64
}

const budgetCols = `run_id, max_attempts_per_action, max_attempts_per_run, max_execution_us, max_steps, max_tokens,
	deadline_at, attempts_used, execution_used_us, steps_used, tokens_used, tokens_unavailable, version`

func (b *budgetRow) targets() []any {
	return []any{&b.RunID, &b.MaxAttemptsPerAction, &b.MaxAttemptsPerRun, &b.MaxExecutionUs, &b.MaxSteps, &b.MaxTokens,
		&b.DeadlineAt, &b.AttemptsUsed, &b.ExecutionUsedUs, &b.StepsUsed, &b.TokensUsed, &b.TokensUnavailable, &b.Version}
}

// runBudgetCols is a run (alias r) with its budget (alias b).
var runBudgetCols = qualified("r", runCols) + ", " + qualified("b", budgetCols)

func runBudgetTargets(r *runRow, b *budgetRow) []any { return append(r.targets(), b.targets()...) }

func runOf(r *runRow, b *budgetRow) *ledger.Run {
	run := &ledger.Run{
		ID:             ledger.RunID(r.ID),
		Tenant:         r.Tenant,
		IdempotencyKey: r.IdempotencyKey,
		RequestDigest:  ledger.Digest(r.RequestDigest),
		SubmittedBy:    r.SubmittedBy,
		Agent:          r.Agent,
		Input:          json.RawMessage(r.Input),
		State:          ledger.RunState(r.State),
		StopReason:     ledger.StopReason(deref(r.StopReason)),
		Version:        r.Version,
		EventSeq:       r.EventSeq,
		EventHash:      r.EventHash,
		CreatedAt:      fromMicros(r.CreatedAt),
		UpdatedAt:      fromMicros(r.UpdatedAt),
	}
	if b != nil {
		run.Budget = budgetOf(b, r.CreatedAt)
	}
	return run
}

// budgetOf needs the run's creation time: the deadline is stored absolute
// and shown both ways.
func budgetOf(b *budgetRow, runCreatedAt int64) ledger.Budget {
	var after time.Duration
	if b.DeadlineAt != nil {
		after = time.Duration(*b.DeadlineAt-runCreatedAt) * time.Microsecond
	}
	return ledger.Budget{
		Deadline: timePtr(b.DeadlineAt),
		Limits: ledger.BudgetLimits{
			MaxAttemptsPerAction: b.MaxAttemptsPerAction,
			MaxAttemptsPerRun:    b.MaxAttemptsPerRun,
			MaxExecution:         time.Duration(b.MaxExecutionUs) * time.Microsecond,
			MaxSteps:             b.MaxSteps,
			MaxTokens:            b.MaxTokens,
			DeadlineAfter:        after,
		},
		Used: ledger.BudgetUsage{
			Attempts:          b.AttemptsUsed,
			Execution:         time.Duration(b.ExecutionUsedUs) * time.Microsecond,
			Steps:             b.StepsUsed,
			Tokens:            b.TokensUsed,
			TokensUnavailable: b.TokensUnavailable,
		},
	}
}

// budgetRowOf is the row of run's budget b.
func budgetRowOf(run ledger.RunID, b ledger.Budget) budgetRow {
	return budgetRow{
		RunID: string(run), MaxAttemptsPerAction: b.Limits.MaxAttemptsPerAction,
		MaxAttemptsPerRun: b.Limits.MaxAttemptsPerRun, MaxExecutionUs: b.Limits.MaxExecution.Microseconds(),
		MaxSteps: b.Limits.MaxSteps, MaxTokens: b.Limits.MaxTokens, DeadlineAt: microsPtr(b.Deadline),
		AttemptsUsed: b.Used.Attempts, ExecutionUsedUs: b.Used.Execution.Microseconds(), StepsUsed: b.Used.Steps,
		TokensUsed: b.Used.Tokens, TokensUnavailable: b.Used.TokensUnavailable,
	}
}

type actionRow struct {
	ID             string
	RunID          string
	Tenant         string
	Seq            int64
	IdempotencyKey string
	Tool           string
	ToolVersion    string
	Effect         string
	Arguments      string
	ActionDigest   string
	DedupKey       string
	Supersedes     *string
	State          string
	AttemptCount   int64
	Version        int64
	CreatedAt      int64
	UpdatedAt      int64
	GateDecision   *string
	GateRule       *int64
	GateReason     *string
	RulesDigest    *string
}

const actionCols = `id, run_id, tenant, seq, idempotency_key, tool, tool_version, effect, arguments, action_digest,
	dedup_key, supersedes, state, attempt_count, version, created_at, updated_at,
	gate_decision, gate_rule, gate_reason, rules_digest`

func (r *actionRow) targets() []any {
	return []any{&r.ID, &r.RunID, &r.Tenant, &r.Seq, &r.IdempotencyKey, &r.Tool, &r.ToolVersion, &r.Effect,
		&r.Arguments, &r.ActionDigest, &r.DedupKey, &r.Supersedes, &r.State, &r.AttemptCount, &r.Version,
		&r.CreatedAt, &r.UpdatedAt, &r.GateDecision, &r.GateRule, &r.GateReason, &r.RulesDigest}
}

func actionRowOf(a *ledger.Action) actionRow {
	r := actionRow{
		ID: string(a.ID), RunID: string(a.RunID), Tenant: a.Tenant, Seq: a.Seq, IdempotencyKey: a.IdempotencyKey,
		Tool: a.Tool, ToolVersion: a.ToolVersion, Effect: string(a.Effect), Arguments: string(a.Arguments),
		ActionDigest: string(a.ActionDigest), DedupKey: a.DedupKey, Supersedes: strPtr(string(a.Supersedes)),
		State: string(a.State), AttemptCount: a.AttemptCount, Version: a.Version,
		CreatedAt: micros(a.CreatedAt), UpdatedAt: micros(a.UpdatedAt),
	}
	if g := a.Gate; g != nil {
		rule := int64(g.Rule)
		r.GateDecision, r.GateRule, r.GateReason, r.RulesDigest = new(string(g.Decision)), &rule, new(g.Reason),
			new(string(g.RulesDigest))
	}
	return r
}

func (r *actionRow) action() *ledger.Action {
	a := &ledger.Action{
		ID:             ledger.ActionID(r.ID),
		RunID:          ledger.RunID(r.RunID),
		Tenant:         r.Tenant,
		Seq:            r.Seq,
		IdempotencyKey: r.IdempotencyKey,
		Tool:           r.Tool,
		ToolVersion:    r.ToolVersion,
		Effect:         ledger.Effect(r.Effect),
		Arguments:      json.RawMessage(r.Arguments),
		ActionDigest:   ledger.Digest(r.ActionDigest),
		DedupKey:       r.DedupKey,
		Supersedes:     ledger.ActionID(deref(r.Supersedes)),
		State:          ledger.ActionState(r.State),
		AttemptCount:   r.AttemptCount,
		Version:        r.Version,
		CreatedAt:      fromMicros(r.CreatedAt),
		UpdatedAt:      fromMicros(r.UpdatedAt),
	}
	if r.GateDecision != nil {
		a.Gate = &ledger.ActionGate{Decision: ledger.ActionState(*r.GateDecision), Reason: deref(r.GateReason),
			RulesDigest: ledger.Digest(deref(r.RulesDigest)), Rule: -1}
		if r.GateRule != nil {
			a.Gate.Rule = int(*r.GateRule)
		}
	}
	return a
}

type attemptRow struct {
	ID                  string
	ActionID            string
	RunID               string
	AttemptNo           int64
	Status              string
	Effect              string
	EffectObservationID *string
	Result              *string
	Error               *string
	Version             int64
	StartedAt           int64
	FinishedAt          *int64
}

const attemptCols = `id, action_id, run_id, attempt_no, status, effect, effect_observation_id, result, error, version,
	started_at, finished_at`

func (r *attemptRow) targets() []any {
	return []any{&r.ID, &r.ActionID, &r.RunID, &r.AttemptNo, &r.Status, &r.Effect, &r.EffectObservationID,
		&r.Result, &r.Error, &r.Version, &r.StartedAt, &r.FinishedAt}
}

// attemptErrorText is the stored form of an attempt's error: its JSON.
func attemptErrorText(e *ledger.AttemptError) (*string, error) {
	if e == nil {
		return nil, nil
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, ledger.Errorf(ledger.CodeInvalid, "attempt error: %w", err)
	}
	return new(string(b)), nil
}

func attemptRowOf(a *ledger.Attempt) (attemptRow, error) {
	errText, err := attemptErrorText(a.Error)
	return attemptRow{
		ID: string(a.ID), ActionID: string(a.ActionID), RunID: string(a.RunID), AttemptNo: a.No,
		Status: string(a.Status), Effect: string(a.Effect), EffectObservationID: strPtr(string(a.EffectObservation)),
		Result: rawPtr(a.Result), Error: errText, Version: a.Version, StartedAt: micros(a.StartedAt),
		FinishedAt: microsPtr(a.FinishedAt),
	}, err
}

func (r *attemptRow) attempt() (*ledger.Attempt, error) {
	a := &ledger.Attempt{
		ID:                ledger.AttemptID(r.ID),
		ActionID:          ledger.ActionID(r.ActionID),
		RunID:             ledger.RunID(r.RunID),
		No:                r.AttemptNo,
		Status:            ledger.AttemptStatus(r.Status),
		Effect:            ledger.EffectFact(r.Effect),
		EffectObservation: ledger.ObservationID(deref(r.EffectObservationID)),
		Result:            ptrRaw(r.Result),
		Version:           r.Version,
		StartedAt:         fromMicros(r.StartedAt),
		FinishedAt:        timePtr(r.FinishedAt),
	}
	if r.Error != nil {
		a.Error = &ledger.AttemptError{}
		if err := json.Unmarshal([]byte(*r.Error), a.Error); err != nil {
			return nil, ledger.Errorf(ledger.CodeInternal, "attempt %s: stored error: %w", r.ID, err)
		}
	}
	return a, nil
}

// nullableAttemptRow is an attempt row read through a LEFT JOIN: every
// column may be NULL when the action has no attempt.
type nullableAttemptRow struct {
	ID                  sql.NullString
	AttemptNo           sql.NullInt64
	Status              sql.NullString
	Effect              sql.NullString
	EffectObservationID *string
	Result              *string
	Error               *string
	Version             sql.NullInt64
	StartedAt           sql.NullInt64
	FinishedAt          *int64
}

// joinedAttemptCols is an attempt (alias t) read through a LEFT JOIN, its
// action and run known from the other side.
const joinedAttemptCols = `t.id, t.attempt_no, t.status, t.effect, t.effect_observation_id, t.result, t.error, t.version,
	t.started_at, t.finished_at`

func (t *nullableAttemptRow) targets() []any {
	return []any{&t.ID, &t.AttemptNo, &t.Status, &t.Effect, &t.EffectObservationID, &t.Result, &t.Error, &t.Version,
		&t.StartedAt, &t.FinishedAt}
}

// attempt is the attempt of action (of run) the row holds, nil if none.
func (t *nullableAttemptRow) attempt(action, run string) (*ledger.Attempt, error) {
	if !t.ID.Valid {
		return nil, nil
	}
	row := attemptRow{ID: t.ID.String, ActionID: action, RunID: run, AttemptNo: t.AttemptNo.Int64,
		Status: t.Status.String, Effect: t.Effect.String, EffectObservationID: t.EffectObservationID, Result: t.Result,
		Error: t.Error, Version: t.Version.Int64, StartedAt: t.StartedAt.Int64, FinishedAt: t.FinishedAt}
	return row.attempt()
}

type approvalRow struct {
	ID           string
	ActionID     string
	RunID        string
	Tenant       string
	ActionDigest string
	State        string
	DecidedBy    *string
	Reason       *string
	Version      int64
	RequestedAt  int64
	ExpiresAt    *int64
	DecidedAt    *int64
}

const approvalCols = `id, action_id, run_id, tenant, action_digest, state, decided_by, reason, version, requested_at,
	expires_at, decided_at`

func (r *approvalRow) targets() []any {
	return []any{&r.ID, &r.ActionID, &r.RunID, &r.Tenant, &r.ActionDigest, &r.State, &r.DecidedBy, &r.Reason, &r.Version,
		&r.RequestedAt, &r.ExpiresAt, &r.DecidedAt}
}

func approvalRowOf(a *ledger.Approval) approvalRow {
	return approvalRow{
		ID: string(a.ID), ActionID: string(a.ActionID), RunID: string(a.RunID), Tenant: a.Tenant,
		ActionDigest: string(a.ActionDigest), State: string(a.State), DecidedBy: strPtr(a.DecidedBy),
		Reason: strPtr(a.Reason), Version: a.Version, RequestedAt: micros(a.RequestedAt),
		ExpiresAt: microsPtr(a.ExpiresAt), DecidedAt: microsPtr(a.DecidedAt),
	}
}

func (r *approvalRow) approval() *ledger.Approval {
	return &ledger.Approval{
		ID:           ledger.ApprovalID(r.ID),
		ActionID:     ledger.ActionID(r.ActionID),
		RunID:        ledger.RunID(r.RunID),
		Tenant:       r.Tenant,
		ActionDigest: ledger.Digest(r.ActionDigest),
		State:        ledger.ApprovalState(r.State),
		DecidedBy:    deref(r.DecidedBy),
		Reason:       deref(r.Reason),
		Version:      r.Version,
		RequestedAt:  fromMicros(r.RequestedAt),
		ExpiresAt:    timePtr(r.ExpiresAt),
		DecidedAt:    timePtr(r.DecidedAt),
	}
}

type cancellationRow struct {
	ID          string
	RunID       string
	Tenant      string
	State       string
	RequestedBy string
	Reason      *string
	Version     int64
	RequestedAt int64
	AcceptedAt  *int64
	StoppingAt  *int64
	StoppedAt   *int64
	TooLateAt   *int64
}

const cancellationCols = `id, run_id, tenant, state, requested_by, reason, version, requested_at,
	accepted_at, stopping_at, stopped_at, too_late_at`

func (r *cancellationRow) targets() []any {
	return []any{&r.ID, &r.RunID, &r.Tenant, &r.State, &r.RequestedBy, &r.Reason, &r.Version, &r.RequestedAt,
		&r.AcceptedAt, &r.StoppingAt, &r.StoppedAt, &r.TooLateAt}
}

func cancellationRowOf(c *ledger.Cancellation) cancellationRow {
	return cancellationRow{
		ID: string(c.ID), RunID: string(c.RunID), Tenant: c.Tenant, State: string(c.State), RequestedBy: c.RequestedBy,
		Reason: strPtr(c.Reason), Version: c.Version, RequestedAt: micros(c.RequestedAt),
		AcceptedAt: microsPtr(c.AcceptedAt), StoppingAt: microsPtr(c.StoppingAt), StoppedAt: microsPtr(c.StoppedAt),
		TooLateAt: microsPtr(c.TooLateAt),
	}
}

func (r *cancellationRow) cancellation() *ledger.Cancellation {
	return &ledger.Cancellation{
		ID:          ledger.CancellationID(r.ID),
		RunID:       ledger.RunID(r.RunID),
		Tenant:      r.Tenant,
		State:       ledger.CancellationState(r.State),
		RequestedBy: r.RequestedBy,
		Reason:      deref(r.Reason),
		Version:     r.Version,
		RequestedAt: fromMicros(r.RequestedAt),
		AcceptedAt:  timePtr(r.AcceptedAt),
		StoppingAt:  timePtr(r.StoppingAt),
		StoppedAt:   timePtr(r.StoppedAt),
		TooLateAt:   timePtr(r.TooLateAt),
	}
}

type observationRow struct {
	ID         string
	RunID      string
	ActionID   string
	AttemptID  *string
	Source     string
	Effect     string
	Detail     *string
	ObservedAt int64
}

const observationCols = `id, run_id, action_id, attempt_id, source, effect, detail, observed_at`

func (r *observationRow) targets() []any {
	return []any{&r.ID, &r.RunID, &r.ActionID, &r.AttemptID, &r.Source, &r.Effect, &r.Detail, &r.ObservedAt}
}

func observationRowOf(o *ledger.Observation) observationRow {
	return observationRow{
		ID: string(o.ID), RunID: string(o.RunID), ActionID: string(o.ActionID), AttemptID: strPtr(string(o.AttemptID)),
		Source: string(o.Source), Effect: string(o.Effect), Detail: rawPtr(o.Detail), ObservedAt: micros(o.ObservedAt),
	}
}

func (r *observationRow) observation() *ledger.Observation {
	return &ledger.Observation{
		ID:         ledger.ObservationID(r.ID),
		RunID:      ledger.RunID(r.RunID),
		ActionID:   ledger.ActionID(r.ActionID),
		AttemptID:  ledger.AttemptID(deref(r.AttemptID)),
		Source:     ledger.ObservationSource(r.Source),
		Effect:     ledger.EffectFact(r.Effect),
		Detail:     ptrRaw(r.Detail),
		ObservedAt: fromMicros(r.ObservedAt),
	}
}

type leaseRow struct {
	AttemptID     string
	ActionID      string
	RunID         string
	BeginKey      string
	TokenSHA256   string
	LeaseUs       int64
	LeaseUntil    int64
	MaxUntil      int64
	Heartbeats    int64
	Progress      *string
	OutcomeDigest *string
	Outcome       *string
}

const leaseCols = `attempt_id, action_id, run_id, begin_key, token_sha256, lease_us, lease_until, max_until, heartbeats,
	progress, outcome_digest, outcome`

func (r *leaseRow) targets() []any {
	return []any{&r.AttemptID, &r.ActionID, &r.RunID, &r.BeginKey, &r.TokenSHA256, &r.LeaseUs, &r.LeaseUntil,
		&r.MaxUntil, &r.Heartbeats, &r.Progress, &r.OutcomeDigest, &r.Outcome}
}

func leaseRowOf(l *ledger.AttemptLease) leaseRow {
	return leaseRow{
		AttemptID: string(l.AttemptID), ActionID: string(l.ActionID), RunID: string(l.RunID), BeginKey: l.BeginKey,
		TokenSHA256: l.TokenSHA256, LeaseUs: l.Lease.Microseconds(), LeaseUntil: micros(l.Until),
		MaxUntil: micros(l.MaxUntil), Heartbeats: l.Heartbeats, Progress: rawPtr(l.Progress),
		OutcomeDigest: strPtr(string(l.OutcomeDigest)), Outcome: rawPtr(l.Outcome),
	}
}

func (r *leaseRow) lease() *ledger.AttemptLease {
	return &ledger.AttemptLease{
		AttemptID: ledger.AttemptID(r.AttemptID), ActionID: ledger.ActionID(r.ActionID), RunID: ledger.RunID(r.RunID),
		BeginKey: r.BeginKey, TokenSHA256: r.TokenSHA256, Lease: time.Duration(r.LeaseUs) * time.Microsecond,
		Until: fromMicros(r.LeaseUntil), MaxUntil: fromMicros(r.MaxUntil), Heartbeats: r.Heartbeats,
		Progress: ptrRaw(r.Progress), OutcomeDigest: ledger.Digest(deref(r.OutcomeDigest)), Outcome: ptrRaw(r.Outcome),
	}
}

type decisionRow struct {
	ActionID   string
	DecisionID string
	Kind       string
	Answered   bool
	DecidedAt  int64
}

const decisionCols = `action_id, decision_id, kind, answered, decided_at`

func (r *decisionRow) targets() []any {
	return []any{&r.ActionID, &r.DecisionID, &r.Kind, &r.Answered, &r.DecidedAt}
}

func (r *decisionRow) decision() *ledger.AgentDecision {
	return &ledger.AgentDecision{ActionID: ledger.ActionID(r.ActionID), DecisionID: r.DecisionID, Kind: r.Kind,
		Answered: r.Answered, DecidedAt: fromMicros(r.DecidedAt)}
}

const eventCols = `id, run_id, seq, type, entity_type, entity_id, from_state, to_state, actor, data, created_at,
	prev_hash, hash, format, row_digests`

type signatureRow struct {
	RunID     string
	Seq       int64
	Hash      string
	SignedAt  int64
	KeyID     string
	Signature string
}

const signatureCols = `run_id, seq, hash, signed_at, key_id, signature`

func (r *signatureRow) targets() []any {
	return []any{&r.RunID, &r.Seq, &r.Hash, &r.SignedAt, &r.KeyID, &r.Signature}
}

// signature is the row's signature, stored as base64. A signature that is
// not base64 (an edit) is kept as its text, which verifies as nothing.
func (r *signatureRow) signature() *ledger.HeadSignature {
	sig, err := base64.StdEncoding.DecodeString(r.Signature)
	if err != nil {
		sig = []byte(r.Signature)
	}
	return &ledger.HeadSignature{RunID: ledger.RunID(r.RunID), Seq: r.Seq, Hash: r.Hash, SignedAt: fromMicros(r.SignedAt),
		KeyID: r.KeyID, Signature: sig}
}

func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func microsPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	return new(t.UnixMicro())
}

func timePtr(us *int64) *time.Time {
	if us == nil {
		return nil
	}
	return new(fromMicros(*us))
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func rawPtr(r json.RawMessage) *string {
	if len(r) == 0 {
		return nil
	}
	return new(string(r))
}

func ptrRaw(s *string) json.RawMessage {
	if s == nil {
		return nil
	}
	return json.RawMessage(*s)
}

// qualified is the column list cols with every column qualified by alias.
func qualified(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
