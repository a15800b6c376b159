package sqlrows

import (
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// The row structs mirror the tables of the drivers' migrations. GORM would
// fill int64 fields named CreatedAt/UpdatedAt with unix seconds on its own;
// the tags switch that off, since every write sets its times itself.

// Run is a row of runs.
type Run struct {
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
	CreatedAt      int64 `gorm:"autoCreateTime:false"`
	UpdatedAt      int64 `gorm:"autoUpdateTime:false"`
}

// TableName is the row's table, for GORM.
func (Run) TableName() string { return "runs" }

// RunCols are the columns of Run, in the order of its Targets.
const RunCols = `id, tenant, idempotency_key, request_digest, submitted_by, agent, input, state, stop_reason, version,
	event_seq, event_hash, created_at, updated_at`

// Targets are the Scan targets of RunCols.
func (r *Run) Targets() []any {
	return []any{&r.ID, &r.Tenant, &r.IdempotencyKey, &r.RequestDigest, &r.SubmittedBy, &r.Agent, &r.Input, &r.State,
		&r.StopReason, &r.Version, &r.EventSeq, &r.EventHash, &r.CreatedAt, &r.UpdatedAt}
}

// RunContentCols are the columns of a run's content (ledger.RunContent).
const RunContentCols = `id, tenant, agent, state, stop_reason, submitted_by, created_at, updated_at`

// ContentTargets are the Scan targets of RunContentCols.
func (r *Run) ContentTargets() []any {
	return []any{&r.ID, &r.Tenant, &r.Agent, &r.State, &r.StopReason, &r.SubmittedBy, &r.CreatedAt, &r.UpdatedAt}
}

// RunOf is the row of r (without its budget).
func RunOf(r *ledger.Run) Run {
	return Run{ID: string(r.ID), Tenant: r.Tenant, IdempotencyKey: r.IdempotencyKey, RequestDigest: string(r.RequestDigest),
		SubmittedBy: r.SubmittedBy, Agent: r.Agent, Input: string(r.Input), State: string(r.State),
		StopReason: StrPtr(string(r.StopReason)), Version: r.Version, EventSeq: r.EventSeq, EventHash: r.EventHash,
		CreatedAt: Micros(r.CreatedAt), UpdatedAt: Micros(r.UpdatedAt)}
}

// ToRun is the row's run, with budget b if b is not nil.
func (r *Run) ToRun(b *Budget) *ledger.Run {
	run := &ledger.Run{
		ID:             ledger.RunID(r.ID),
		Tenant:         r.Tenant,
		IdempotencyKey: r.IdempotencyKey,
		RequestDigest:  ledger.Digest(r.RequestDigest),
		SubmittedBy:    r.SubmittedBy,
		Agent:          r.Agent,
		Input:          json.RawMessage(r.Input),
		State:          ledger.RunState(r.State),
		StopReason:     ledger.StopReason(Deref(r.StopReason)),
		Version:        r.Version,
		EventSeq:       r.EventSeq,
		EventHash:      r.EventHash,
		CreatedAt:      FromMicros(r.CreatedAt),
		UpdatedAt:      FromMicros(r.UpdatedAt),
	}
	if b != nil {
		run.Budget = b.ToBudget(r.CreatedAt)
	}
	return run
}

// Budget is a row of budgets.
type Budget struct {
	RunID                string `gorm:"primaryKey"`
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

// TableName is the row's table, for GORM.
func (Budget) TableName() string { return "budgets" }

// BudgetCols are the columns of Budget, in the order of its Targets.
const BudgetCols = `run_id, max_attempts_per_action, max_attempts_per_run, max_execution_us, max_steps, max_tokens,
	deadline_at, attempts_used, execution_used_us, steps_used, tokens_used, tokens_unavailable, version`

// Targets are the Scan targets of BudgetCols.
func (b *Budget) Targets() []any {
	return []any{&b.RunID, &b.MaxAttemptsPerAction, &b.MaxAttemptsPerRun, &b.MaxExecutionUs, &b.MaxSteps, &b.MaxTokens,
		&b.DeadlineAt, &b.AttemptsUsed, &b.ExecutionUsedUs, &b.StepsUsed, &b.TokensUsed, &b.TokensUnavailable, &b.Version}
}

// BudgetOf is the row of run's budget b as it is inserted: version 1.
func BudgetOf(run ledger.RunID, b ledger.Budget) Budget {
	l, u := b.Limits, b.Used
	return Budget{RunID: string(run), MaxAttemptsPerAction: l.MaxAttemptsPerAction, MaxAttemptsPerRun: l.MaxAttemptsPerRun,
		MaxExecutionUs: l.MaxExecution.Microseconds(), MaxSteps: l.MaxSteps, MaxTokens: l.MaxTokens,
		DeadlineAt: MicrosPtr(b.Deadline), AttemptsUsed: u.Attempts, ExecutionUsedUs: u.Execution.Microseconds(),
		StepsUsed: u.Steps, TokensUsed: u.Tokens, TokensUnavailable: u.TokensUnavailable, Version: 1}
}

// ToBudget is the row's budget. It needs the run's creation time: the
// deadline is stored absolute and shown both ways.
func (b *Budget) ToBudget(runCreatedAt int64) ledger.Budget {
	var after time.Duration
	if b.DeadlineAt != nil {
		after = time.Duration(*b.DeadlineAt-runCreatedAt) * time.Microsecond
	}
	return ledger.Budget{
		Deadline: TimePtr(b.DeadlineAt),
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

// RunBudgetCols is a run (alias r) with its budget (alias b), the budget's
// run_id left out: it is the run's id.
const RunBudgetCols = `r.id, r.tenant, r.idempotency_key, r.request_digest, r.submitted_by, r.agent, r.input,
	r.state, r.stop_reason, r.version, r.event_seq, r.event_hash, r.created_at, r.updated_at,
	b.max_attempts_per_action, b.max_attempts_per_run, b.max_execution_us, b.max_steps, b.max_tokens,
	b.deadline_at, b.attempts_used, b.execution_used_us, b.steps_used, b.tokens_used, b.tokens_unavailable, b.version`

// RunBudgetTargets are the Scan targets of RunBudgetCols; b.RunID is left
// as it is.
func RunBudgetTargets(r *Run, b *Budget) []any {
	return []any{&r.ID, &r.Tenant, &r.IdempotencyKey, &r.RequestDigest, &r.SubmittedBy, &r.Agent, &r.Input,
		&r.State, &r.StopReason, &r.Version, &r.EventSeq, &r.EventHash, &r.CreatedAt, &r.UpdatedAt,
		&b.MaxAttemptsPerAction, &b.MaxAttemptsPerRun, &b.MaxExecutionUs, &b.MaxSteps, &b.MaxTokens,
		&b.DeadlineAt, &b.AttemptsUsed, &b.ExecutionUsedUs, &b.StepsUsed, &b.TokensUsed, &b.TokensUnavailable, &b.Version}
}

// ScanRun scans a row of RunBudgetCols into a run with its budget.
func ScanRun(rows *sql.Rows) (*ledger.Run, error) {
	var (
		r Run
		b Budget
	)
	if err := rows.Scan(RunBudgetTargets(&r, &b)...); err != nil {
		return nil, err
	}
	b.RunID = r.ID
	return r.ToRun(&b), nil
}

// Action is a row of actions.
type Action struct {
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
	CreatedAt      int64 `gorm:"autoCreateTime:false"`
	UpdatedAt      int64 `gorm:"autoUpdateTime:false"`
	// The gate's audit: all four NULL for an action recorded before the
	// gate was audited, or without an audit.
	GateDecision *string
	GateRule     *int64
	GateReason   *string
	RulesDigest  *string
}

// TableName is the row's table, for GORM.
func (Action) TableName() string { return "actions" }

// ActionCols are the columns of Action, in the order of its Targets.
const ActionCols = `id, run_id, tenant, seq, idempotency_key, tool, tool_version, effect, arguments, action_digest,
	dedup_key, supersedes, state, attempt_count, version, created_at, updated_at,
	gate_decision, gate_rule, gate_reason, rules_digest`

// Targets are the Scan targets of ActionCols.
func (r *Action) Targets() []any {
	return []any{&r.ID, &r.RunID, &r.Tenant, &r.Seq, &r.IdempotencyKey, &r.Tool, &r.ToolVersion, &r.Effect,
		&r.Arguments, &r.ActionDigest, &r.DedupKey, &r.Supersedes, &r.State, &r.AttemptCount, &r.Version,
		&r.CreatedAt, &r.UpdatedAt, &r.GateDecision, &r.GateRule, &r.GateReason, &r.RulesDigest}
}

// ActionOf is the row of a. A gate's fields are stored as they are, empty
// ones too, for the schema's CHECKs to judge.
func ActionOf(a *ledger.Action) Action {
	row := Action{ID: string(a.ID), RunID: string(a.RunID), Tenant: a.Tenant, Seq: a.Seq, IdempotencyKey: a.IdempotencyKey,
		Tool: a.Tool, ToolVersion: a.ToolVersion, Effect: string(a.Effect), Arguments: string(a.Arguments),
		ActionDigest: string(a.ActionDigest), DedupKey: a.DedupKey, Supersedes: StrPtr(string(a.Supersedes)),
		State: string(a.State), AttemptCount: a.AttemptCount, Version: a.Version,
		CreatedAt: Micros(a.CreatedAt), UpdatedAt: Micros(a.UpdatedAt)}
	if g := a.Gate; g != nil {
		decision, rule, digest := string(g.Decision), int64(g.Rule), string(g.RulesDigest)
		row.GateDecision, row.GateRule, row.GateReason, row.RulesDigest = &decision, &rule, &g.Reason, &digest
	}
	return row
}

// ToAction is the row's action.
func (r *Action) ToAction() *ledger.Action {
	return &ledger.Action{
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
		Supersedes:     ledger.ActionID(Deref(r.Supersedes)),
		State:          ledger.ActionState(r.State),
		AttemptCount:   r.AttemptCount,
		Version:        r.Version,
		CreatedAt:      FromMicros(r.CreatedAt),
		UpdatedAt:      FromMicros(r.UpdatedAt),
		Gate:           r.gate(),
	}
}

// gate is the action's recorded gate; nil if the row has none.
func (r *Action) gate() *ledger.ActionGate {
	if r.GateDecision == nil {
		return nil
	}
	g := &ledger.ActionGate{Decision: ledger.ActionState(*r.GateDecision), Reason: Deref(r.GateReason),
		RulesDigest: ledger.Digest(Deref(r.RulesDigest)), Rule: -1}
	if r.GateRule != nil {
		g.Rule = int(*r.GateRule)
	}
	return g
}

// ScanAction scans a row of ActionCols.
func ScanAction(rows *sql.Rows) (*ledger.Action, error) {
	var a Action
	if err := rows.Scan(a.Targets()...); err != nil {
		return nil, err
	}
	return a.ToAction(), nil
}

// Attempt is a row of attempts.
type Attempt struct {
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

// TableName is the row's table, for GORM.
func (Attempt) TableName() string { return "attempts" }

// AttemptCols are the columns of Attempt, in the order of its Targets.
const AttemptCols = `id, action_id, run_id, attempt_no, status, effect, effect_observation_id, result, error, version,
	started_at, finished_at`

// Targets are the Scan targets of AttemptCols.
func (r *Attempt) Targets() []any {
	return []any{&r.ID, &r.ActionID, &r.RunID, &r.AttemptNo, &r.Status, &r.Effect, &r.EffectObservationID,
		&r.Result, &r.Error, &r.Version, &r.StartedAt, &r.FinishedAt}
}

// AttemptErrorText is the stored form of an attempt's error, its JSON;
// nil for none.
func AttemptErrorText(e *ledger.AttemptError) (*string, error) {
	if e == nil {
		return nil, nil
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, ledger.Errorf(ledger.CodeInvalid, "attempt error: %w", err)
	}
	s := string(b)
	return &s, nil
}

// AttemptOf is the row of a.
func AttemptOf(a *ledger.Attempt) (Attempt, error) {
	errText, err := AttemptErrorText(a.Error)
	return Attempt{
		ID: string(a.ID), ActionID: string(a.ActionID), RunID: string(a.RunID), AttemptNo: a.No,
		Status: string(a.Status), Effect: string(a.Effect), EffectObservationID: StrPtr(string(a.EffectObservation)),
		Result: RawPtr(a.Result), Error: errText, Version: a.Version, StartedAt: Micros(a.StartedAt),
		FinishedAt: MicrosPtr(a.FinishedAt),
	}, err
}

// ToAttempt is the row's attempt; a stored error that is not JSON is
// CodeInternal.
func (r *Attempt) ToAttempt() (*ledger.Attempt, error) {
	a := &ledger.Attempt{
		ID:                ledger.AttemptID(r.ID),
		ActionID:          ledger.ActionID(r.ActionID),
		RunID:             ledger.RunID(r.RunID),
		No:                r.AttemptNo,
		Status:            ledger.AttemptStatus(r.Status),
		Effect:            ledger.EffectFact(r.Effect),
		EffectObservation: ledger.ObservationID(Deref(r.EffectObservationID)),
		Result:            PtrRaw(r.Result),
		Version:           r.Version,
		StartedAt:         FromMicros(r.StartedAt),
		FinishedAt:        TimePtr(r.FinishedAt),
	}
	if r.Error != nil {
		a.Error = &ledger.AttemptError{}
		if err := json.Unmarshal([]byte(*r.Error), a.Error); err != nil {
			return nil, ledger.Errorf(ledger.CodeInternal, "attempt %s: stored error: %w", r.ID, err)
		}
	}
	return a, nil
}

// ScanAttempt scans a row of AttemptCols.
func ScanAttempt(rows *sql.Rows) (*ledger.Attempt, error) {
	var a Attempt
	if err := rows.Scan(a.Targets()...); err != nil {
		return nil, err
	}
	return a.ToAttempt()
}

// JoinedAttempt is an attempt row read through a LEFT JOIN: every column
// may be NULL when the action has no attempt.
type JoinedAttempt struct {
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

// JoinedAttemptCols is an attempt (alias t) read through a LEFT JOIN, its
// action and run known from the other side.
const JoinedAttemptCols = `t.id, t.attempt_no, t.status, t.effect, t.effect_observation_id, t.result, t.error, t.version,
	t.started_at, t.finished_at`

// Targets are the Scan targets of JoinedAttemptCols.
func (t *JoinedAttempt) Targets() []any {
	return []any{&t.ID, &t.AttemptNo, &t.Status, &t.Effect, &t.EffectObservationID, &t.Result, &t.Error, &t.Version,
		&t.StartedAt, &t.FinishedAt}
}

// ToAttempt is the attempt of action (of run) the row holds; nil if it
// holds none.
func (t *JoinedAttempt) ToAttempt(action, run string) (*ledger.Attempt, error) {
	if !t.ID.Valid {
		return nil, nil
	}
	row := Attempt{ID: t.ID.String, ActionID: action, RunID: run, AttemptNo: t.AttemptNo.Int64,
		Status: t.Status.String, Effect: t.Effect.String, EffectObservationID: t.EffectObservationID, Result: t.Result,
		Error: t.Error, Version: t.Version.Int64, StartedAt: t.StartedAt.Int64, FinishedAt: t.FinishedAt}
	return row.ToAttempt()
}

// Approval is a row of approvals.
type Approval struct {
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
	ExecuteBy    *int64
	StaleAt      *int64
	StaleReason  *string
}

// TableName is the row's table, for GORM.
func (Approval) TableName() string { return "approvals" }

// ApprovalCols are the columns of Approval, in the order of its Targets.
const ApprovalCols = `id, action_id, run_id, tenant, action_digest, state, decided_by, reason, version, requested_at,
	expires_at, decided_at, execute_by, stale_at, stale_reason`

// Targets are the Scan targets of ApprovalCols.
func (r *Approval) Targets() []any {
	return []any{&r.ID, &r.ActionID, &r.RunID, &r.Tenant, &r.ActionDigest, &r.State, &r.DecidedBy, &r.Reason, &r.Version,
		&r.RequestedAt, &r.ExpiresAt, &r.DecidedAt, &r.ExecuteBy, &r.StaleAt, &r.StaleReason}
}

// ApprovalOf is the row of a.
func ApprovalOf(a *ledger.Approval) Approval {
	return Approval{ID: string(a.ID), ActionID: string(a.ActionID), RunID: string(a.RunID), Tenant: a.Tenant,
		ActionDigest: string(a.ActionDigest), State: string(a.State), DecidedBy: StrPtr(a.DecidedBy), Reason: StrPtr(a.Reason),
		Version: a.Version, RequestedAt: Micros(a.RequestedAt), ExpiresAt: MicrosPtr(a.ExpiresAt), DecidedAt: MicrosPtr(a.DecidedAt),
		ExecuteBy: MicrosPtr(a.ExecuteBy), StaleAt: MicrosPtr(a.StaleAt), StaleReason: StrPtr(a.StaleReason)}
}

// ToApproval is the row's approval.
func (r *Approval) ToApproval() *ledger.Approval {
	return &ledger.Approval{
		ID:           ledger.ApprovalID(r.ID),
		ActionID:     ledger.ActionID(r.ActionID),
		RunID:        ledger.RunID(r.RunID),
		Tenant:       r.Tenant,
		ActionDigest: ledger.Digest(r.ActionDigest),
		State:        ledger.ApprovalState(r.State),
		DecidedBy:    Deref(r.DecidedBy),
		Reason:       Deref(r.Reason),
		Version:      r.Version,
		RequestedAt:  FromMicros(r.RequestedAt),
		ExpiresAt:    TimePtr(r.ExpiresAt),
		DecidedAt:    TimePtr(r.DecidedAt),
		ExecuteBy:    TimePtr(r.ExecuteBy),
		StaleAt:      TimePtr(r.StaleAt),
		StaleReason:  Deref(r.StaleReason),
	}
}

// ScanApproval scans a row of ApprovalCols.
func ScanApproval(rows *sql.Rows) (*ledger.Approval, error) {
	var a Approval
	if err := rows.Scan(a.Targets()...); err != nil {
		return nil, err
	}
	return a.ToApproval(), nil
}

// Cancellation is a row of cancellations.
type Cancellation struct {
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

// TableName is the row's table, for GORM.
func (Cancellation) TableName() string { return "cancellations" }

// CancellationCols are the columns of Cancellation, in the order of its
// Targets.
const CancellationCols = `id, run_id, tenant, state, requested_by, reason, version, requested_at,
	accepted_at, stopping_at, stopped_at, too_late_at`

// Targets are the Scan targets of CancellationCols.
func (r *Cancellation) Targets() []any {
	return []any{&r.ID, &r.RunID, &r.Tenant, &r.State, &r.RequestedBy, &r.Reason, &r.Version, &r.RequestedAt,
		&r.AcceptedAt, &r.StoppingAt, &r.StoppedAt, &r.TooLateAt}
}

// CancellationOf is the row of c.
func CancellationOf(c *ledger.Cancellation) Cancellation {
	return Cancellation{ID: string(c.ID), RunID: string(c.RunID), Tenant: c.Tenant, State: string(c.State),
		RequestedBy: c.RequestedBy, Reason: StrPtr(c.Reason), Version: c.Version, RequestedAt: Micros(c.RequestedAt),
		AcceptedAt: MicrosPtr(c.AcceptedAt), StoppingAt: MicrosPtr(c.StoppingAt), StoppedAt: MicrosPtr(c.StoppedAt),
		TooLateAt: MicrosPtr(c.TooLateAt)}
}

// ToCancellation is the row's cancellation.
func (r *Cancellation) ToCancellation() *ledger.Cancellation {
	return &ledger.Cancellation{
		ID:          ledger.CancellationID(r.ID),
		RunID:       ledger.RunID(r.RunID),
		Tenant:      r.Tenant,
		State:       ledger.CancellationState(r.State),
		RequestedBy: r.RequestedBy,
		Reason:      Deref(r.Reason),
		Version:     r.Version,
		RequestedAt: FromMicros(r.RequestedAt),
		AcceptedAt:  TimePtr(r.AcceptedAt),
		StoppingAt:  TimePtr(r.StoppingAt),
		StoppedAt:   TimePtr(r.StoppedAt),
		TooLateAt:   TimePtr(r.TooLateAt),
	}
}

// ScanCancellation scans a row of CancellationCols.
func ScanCancellation(rows *sql.Rows) (*ledger.Cancellation, error) {
	var c Cancellation
	if err := rows.Scan(c.Targets()...); err != nil {
		return nil, err
	}
	return c.ToCancellation(), nil
}

// Observation is a row of observations.
type Observation struct {
	ID         string
	RunID      string
	ActionID   string
	AttemptID  *string
	Source     string
	Effect     string
	Detail     *string
	ObservedAt int64
}

// TableName is the row's table, for GORM.
func (Observation) TableName() string { return "observations" }

// ObservationCols are the columns of Observation, in the order of its
// Targets.
const ObservationCols = `id, run_id, action_id, attempt_id, source, effect, detail, observed_at`

// Targets are the Scan targets of ObservationCols.
func (r *Observation) Targets() []any {
	return []any{&r.ID, &r.RunID, &r.ActionID, &r.AttemptID, &r.Source, &r.Effect, &r.Detail, &r.ObservedAt}
}

// ObservationOf is the row of o.
func ObservationOf(o *ledger.Observation) Observation {
	return Observation{ID: string(o.ID), RunID: string(o.RunID), ActionID: string(o.ActionID), AttemptID: StrPtr(string(o.AttemptID)),
		Source: string(o.Source), Effect: string(o.Effect), Detail: RawPtr(o.Detail), ObservedAt: Micros(o.ObservedAt)}
}

// ToObservation is the row's observation.
func (r *Observation) ToObservation() *ledger.Observation {
	return &ledger.Observation{
		ID:         ledger.ObservationID(r.ID),
		RunID:      ledger.RunID(r.RunID),
		ActionID:   ledger.ActionID(r.ActionID),
		AttemptID:  ledger.AttemptID(Deref(r.AttemptID)),
		Source:     ledger.ObservationSource(r.Source),
		Effect:     ledger.EffectFact(r.Effect),
		Detail:     PtrRaw(r.Detail),
		ObservedAt: FromMicros(r.ObservedAt),
	}
}

// ScanObservation scans a row of ObservationCols.
func ScanObservation(rows *sql.Rows) (*ledger.Observation, error) {
	var o Observation
	if err := rows.Scan(o.Targets()...); err != nil {
		return nil, err
	}
	return o.ToObservation(), nil
}

// Lease is a row of attempt_leases.
type Lease struct {
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

// TableName is the row's table, for GORM.
func (Lease) TableName() string { return "attempt_leases" }

// LeaseCols are the columns of Lease, in the order of its Targets.
const LeaseCols = `attempt_id, action_id, run_id, begin_key, token_sha256, lease_us, lease_until, max_until, heartbeats,
	progress, outcome_digest, outcome`

// Targets are the Scan targets of LeaseCols.
func (r *Lease) Targets() []any {
	return []any{&r.AttemptID, &r.ActionID, &r.RunID, &r.BeginKey, &r.TokenSHA256, &r.LeaseUs, &r.LeaseUntil,
		&r.MaxUntil, &r.Heartbeats, &r.Progress, &r.OutcomeDigest, &r.Outcome}
}

// LeaseOf is the row of l.
func LeaseOf(l *ledger.AttemptLease) Lease {
	return Lease{AttemptID: string(l.AttemptID), ActionID: string(l.ActionID), RunID: string(l.RunID), BeginKey: l.BeginKey,
		TokenSHA256: l.TokenSHA256, LeaseUs: l.Lease.Microseconds(), LeaseUntil: Micros(l.Until), MaxUntil: Micros(l.MaxUntil),
		Heartbeats: l.Heartbeats, Progress: RawPtr(l.Progress), OutcomeDigest: StrPtr(string(l.OutcomeDigest)), Outcome: RawPtr(l.Outcome)}
}

// ToLease is the row's lease.
func (r *Lease) ToLease() *ledger.AttemptLease {
	return &ledger.AttemptLease{AttemptID: ledger.AttemptID(r.AttemptID), ActionID: ledger.ActionID(r.ActionID), RunID: ledger.RunID(r.RunID),
		BeginKey: r.BeginKey, TokenSHA256: r.TokenSHA256, Lease: time.Duration(r.LeaseUs) * time.Microsecond,
		Until: FromMicros(r.LeaseUntil), MaxUntil: FromMicros(r.MaxUntil), Heartbeats: r.Heartbeats,
		Progress: PtrRaw(r.Progress), OutcomeDigest: ledger.Digest(Deref(r.OutcomeDigest)), Outcome: PtrRaw(r.Outcome)}
}

// ScanLease scans a row of LeaseCols.
func ScanLease(rows *sql.Rows) (*ledger.AttemptLease, error) {
	var l Lease
	if err := rows.Scan(l.Targets()...); err != nil {
		return nil, err
	}
	return l.ToLease(), nil
}

// Decision is a row of agent_decisions.
type Decision struct {
	ActionID   string `gorm:"primaryKey"`
	DecisionID string
	Kind       string
	Answered   bool
	DecidedAt  int64
}

// TableName is the row's table, for GORM.
func (Decision) TableName() string { return "agent_decisions" }

// DecisionCols are the columns of Decision, in the order of its Targets.
const DecisionCols = `action_id, decision_id, kind, answered, decided_at`

// Targets are the Scan targets of DecisionCols.
func (r *Decision) Targets() []any {
	return []any{&r.ActionID, &r.DecisionID, &r.Kind, &r.Answered, &r.DecidedAt}
}

// DecisionOf is the row of d.
func DecisionOf(d *ledger.AgentDecision) Decision {
	return Decision{ActionID: string(d.ActionID), DecisionID: d.DecisionID, Kind: d.Kind, Answered: d.Answered,
		DecidedAt: Micros(d.DecidedAt)}
}

// ToDecision is the row's decision.
func (r *Decision) ToDecision() *ledger.AgentDecision {
	return &ledger.AgentDecision{ActionID: ledger.ActionID(r.ActionID), DecisionID: r.DecisionID, Kind: r.Kind,
		Answered: r.Answered, DecidedAt: FromMicros(r.DecidedAt)}
}

// Signature is a row of chain_signatures; the signature is stored as
// base64.
type Signature struct {
	RunID     string
	Seq       int64
	Hash      string
	SignedAt  int64
	KeyID     string
	Signature string
}

// TableName is the row's table, for GORM.
func (Signature) TableName() string { return "chain_signatures" }

// SignatureCols are the columns of Signature, in the order of its Targets.
const SignatureCols = `run_id, seq, hash, signed_at, key_id, signature`

// Targets are the Scan targets of SignatureCols.
func (r *Signature) Targets() []any {
	return []any{&r.RunID, &r.Seq, &r.Hash, &r.SignedAt, &r.KeyID, &r.Signature}
}

// SignatureOf is the row of h.
func SignatureOf(h *ledger.HeadSignature) Signature {
	return Signature{RunID: string(h.RunID), Seq: h.Seq, Hash: h.Hash, SignedAt: Micros(h.SignedAt), KeyID: h.KeyID,
		Signature: base64.StdEncoding.EncodeToString(h.Signature)}
}

// ToSignature is the row's signature. A signature that is not base64 (an
// edit) is kept as its text, which verifies as nothing.
func (r *Signature) ToSignature() *ledger.HeadSignature {
	sig, err := base64.StdEncoding.DecodeString(r.Signature)
	if err != nil {
		sig = []byte(r.Signature)
	}
	return &ledger.HeadSignature{RunID: ledger.RunID(r.RunID), Seq: r.Seq, Hash: r.Hash, SignedAt: FromMicros(r.SignedAt),
		KeyID: r.KeyID, Signature: sig}
}

// RunLease is a run's lease columns (on runs) as RunLeaseCols reads them.
type RunLease struct {
	ID, Owner    string
	Token, Until int64
}

// RunLeaseCols are a run's id and lease columns, the owner ” when free,
// in the order of RunLease's Targets.
const RunLeaseCols = `id, COALESCE(lease_owner, ''), lease_token, lease_until`

// Targets are the Scan targets of RunLeaseCols.
func (r *RunLease) Targets() []any { return []any{&r.ID, &r.Owner, &r.Token, &r.Until} }

// ToRunLease is the row's lease; a free one has no Until.
func (r *RunLease) ToRunLease() ledger.RunLease {
	l := ledger.RunLease{Run: ledger.RunID(r.ID), Owner: r.Owner, Token: r.Token}
	if r.Owner != "" {
		l.Until = FromMicros(r.Until)
	}
	return l
}

// ScanRunLease scans a row of RunLeaseCols (or of id, lease_owner,
// lease_token, lease_until where the owner cannot be NULL).
func ScanRunLease(rows *sql.Rows) (ledger.RunLease, error) {
	var l RunLease
	err := rows.Scan(l.Targets()...)
	return l.ToRunLease(), err
}

// EventCols are the columns of events, in the order ScanEvents reads them.
const EventCols = `id, run_id, seq, type, entity_type, entity_id, from_state, to_state, actor, data, created_at,
	prev_hash, hash, format, row_digests`

// RuleSet is a row of rule_sets.
type RuleSet struct {
	Digest   string
	Document string
	StoredAt int64
}

// RuleSetCols are the columns of RuleSet, in the order of its Targets.
const RuleSetCols = `digest, document, stored_at`

// Targets are the Scan targets of RuleSetCols.
func (r *RuleSet) Targets() []any { return []any{&r.Digest, &r.Document, &r.StoredAt} }

// RuleSetOf is the row of r.
func RuleSetOf(r *ledger.RuleSet) RuleSet {
	return RuleSet{Digest: string(r.Digest), Document: string(r.Document), StoredAt: Micros(r.StoredAt)}
}

// ToRuleSet is the row's rule set.
func (r *RuleSet) ToRuleSet() *ledger.RuleSet {
	return &ledger.RuleSet{Digest: ledger.Digest(r.Digest), Document: json.RawMessage(r.Document), StoredAt: FromMicros(r.StoredAt)}
}

// ScanRuleSet scans one row of RuleSetCols.
func ScanRuleSet(rows *sql.Rows) (*ledger.RuleSet, error) {
	var r RuleSet
	if err := rows.Scan(r.Targets()...); err != nil {
		return nil, err
	}
	return r.ToRuleSet(), nil
}
