package sqlite

import (
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"github.com/actionledger/ledger/ledger"
	"strings"
	"time"
)

// Row structs mirror the tables of migrations/; they never leave the
// package. Times are unix microseconds; nullable columns are pointers. GORM
// would fill int64 fields named CreatedAt/UpdatedAt with unix seconds on its
// own; the tags switch that off, since every write sets its times itself.

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
	CreatedAt      int64 `gorm:"autoCreateTime:false"`
	UpdatedAt      int64 `gorm:"autoUpdateTime:false"`
}

func (runRow) TableName() string { return "runs" }

type budgetRow struct {
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

func (budgetRow) TableName() string { return "budgets" }

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
	CreatedAt      int64 `gorm:"autoCreateTime:false"`
	UpdatedAt      int64 `gorm:"autoUpdateTime:false"`
	// The gate's audit (0006): all four NULL for an action recorded before
	// the gate was audited, or without an audit.
	GateDecision *string
	GateRule     *int64
	GateReason   *string
	RulesDigest  *string
}

func (actionRow) TableName() string { return "actions" }

// gate is the action's recorded gate; nil if the row has none.
func (r *actionRow) gate() *ledger.ActionGate {
	if r.GateDecision == nil {
		return nil
	}
	g := &ledger.ActionGate{Decision: ledger.ActionState(*r.GateDecision), Reason: deref(r.GateReason), RulesDigest: ledger.Digest(deref(r.RulesDigest)), Rule: -1}
	if r.GateRule != nil {
		g.Rule = int(*r.GateRule)
	}
	return g
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

func (attemptRow) TableName() string { return "attempts" }

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

func (approvalRow) TableName() string { return "approvals" }

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

func (cancellationRow) TableName() string { return "cancellations" }

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

func (observationRow) TableName() string { return "observations" }

func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func timePtr(us *int64) *time.Time {
	if us == nil {
		return nil
	}
	t := fromMicros(*us)
	return &t
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
	s := string(r)
	return &s
}

func ptrRaw(s *string) json.RawMessage {
	if s == nil {
		return nil
	}
	return json.RawMessage(*s)
}

func (r *runRow) toRun(b *budgetRow) *ledger.Run {
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
		run.Budget = b.toBudget(r.CreatedAt)
	}
	return run
}

// toBudget needs the run's creation time: the deadline is stored absolute
// and shown both ways.
func (b *budgetRow) toBudget(runCreatedAt int64) ledger.Budget {
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

func (r *actionRow) toAction() *ledger.Action {
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
		Supersedes:     ledger.ActionID(deref(r.Supersedes)),
		State:          ledger.ActionState(r.State),
		AttemptCount:   r.AttemptCount,
		Version:        r.Version,
		CreatedAt:      fromMicros(r.CreatedAt),
		UpdatedAt:      fromMicros(r.UpdatedAt),
		Gate:           r.gate(),
	}
}

func (r *attemptRow) toAttempt() (*ledger.Attempt, error) {
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

func (r *approvalRow) toApproval() *ledger.Approval {
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

func (r *cancellationRow) toCancellation() *ledger.Cancellation {
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

func (r *observationRow) toObservation() *ledger.Observation {
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

// Column lists and Scan targets of the rows read by plain SQL (stmts.go,
// recoveryfacts.go): each list and its targets must stay in the same order.
// The lists of a run with its budget and of an attempt through a LEFT JOIN
// are qualified by the aliases their queries use (r, b, t).

const actionCols = `id, run_id, tenant, seq, idempotency_key, tool, tool_version, effect, arguments, action_digest,
	dedup_key, supersedes, state, attempt_count, version, created_at, updated_at,
	gate_decision, gate_rule, gate_reason, rules_digest`

// targets are the Scan targets of actionCols.
func (r *actionRow) targets() []any {
	return []any{&r.ID, &r.RunID, &r.Tenant, &r.Seq, &r.IdempotencyKey, &r.Tool, &r.ToolVersion, &r.Effect,
		&r.Arguments, &r.ActionDigest, &r.DedupKey, &r.Supersedes, &r.State, &r.AttemptCount, &r.Version,
		&r.CreatedAt, &r.UpdatedAt, &r.GateDecision, &r.GateRule, &r.GateReason, &r.RulesDigest}
}

func scanAction(rows *sql.Rows, r *actionRow) error { return rows.Scan(r.targets()...) }

const attemptCols = `id, action_id, run_id, attempt_no, status, effect, effect_observation_id, result, error, version,
	started_at, finished_at`

// targets are the Scan targets of attemptCols.
func (r *attemptRow) targets() []any {
	return []any{&r.ID, &r.ActionID, &r.RunID, &r.AttemptNo, &r.Status, &r.Effect, &r.EffectObservationID,
		&r.Result, &r.Error, &r.Version, &r.StartedAt, &r.FinishedAt}
}

func scanAttempt(rows *sql.Rows, r *attemptRow) error { return rows.Scan(r.targets()...) }

// runContentCols are the columns of a run's content (RunContent).
const runContentCols = `id, tenant, agent, state, stop_reason, submitted_by, created_at, updated_at`

// contentTargets are the Scan targets of runContentCols.
func (r *runRow) contentTargets() []any {
	return []any{&r.ID, &r.Tenant, &r.Agent, &r.State, &r.StopReason, &r.SubmittedBy, &r.CreatedAt, &r.UpdatedAt}
}

const budgetCols = `run_id, max_attempts_per_action, max_attempts_per_run, max_execution_us, max_steps, max_tokens,
	deadline_at, attempts_used, execution_used_us, steps_used, tokens_used, tokens_unavailable, version`

// targets are the Scan targets of budgetCols.
func (b *budgetRow) targets() []any {
	return []any{&b.RunID, &b.MaxAttemptsPerAction, &b.MaxAttemptsPerRun, &b.MaxExecutionUs, &b.MaxSteps, &b.MaxTokens,
		&b.DeadlineAt, &b.AttemptsUsed, &b.ExecutionUsedUs, &b.StepsUsed, &b.TokensUsed, &b.TokensUnavailable, &b.Version}
}

const approvalCols = `id, action_id, run_id, tenant, action_digest, state, decided_by, reason, version, requested_at,
	expires_at, decided_at`

// targets are the Scan targets of approvalCols.
func (r *approvalRow) targets() []any {
	return []any{&r.ID, &r.ActionID, &r.RunID, &r.Tenant, &r.ActionDigest, &r.State, &r.DecidedBy, &r.Reason, &r.Version,
		&r.RequestedAt, &r.ExpiresAt, &r.DecidedAt}
}

// runBudgetCols is a run (alias r) with its budget (alias b).
const runBudgetCols = `r.id, r.tenant, r.idempotency_key, r.request_digest, r.submitted_by, r.agent, r.input,
	r.state, r.stop_reason, r.version, r.event_seq, r.event_hash, r.created_at, r.updated_at,
	b.max_attempts_per_action, b.max_attempts_per_run, b.max_execution_us, b.max_steps, b.max_tokens,
	b.deadline_at, b.attempts_used, b.execution_used_us, b.steps_used, b.tokens_used, b.tokens_unavailable, b.version`

// runBudgetTargets are the Scan targets of runBudgetCols.
func runBudgetTargets(r *runRow, b *budgetRow) []any {
	return []any{&r.ID, &r.Tenant, &r.IdempotencyKey, &r.RequestDigest, &r.SubmittedBy, &r.Agent, &r.Input,
		&r.State, &r.StopReason, &r.Version, &r.EventSeq, &r.EventHash, &r.CreatedAt, &r.UpdatedAt,
		&b.MaxAttemptsPerAction, &b.MaxAttemptsPerRun, &b.MaxExecutionUs, &b.MaxSteps, &b.MaxTokens,
		&b.DeadlineAt, &b.AttemptsUsed, &b.ExecutionUsedUs, &b.StepsUsed, &b.TokensUsed, &b.TokensUnavailable, &b.Version}
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

// toAttempt is the attempt of action (of run) the row holds; the row must
// hold one (ID valid).
func (t *nullableAttemptRow) toAttempt(action ledger.ActionID, run ledger.RunID) (*ledger.Attempt, error) {
	row := attemptRow{ID: t.ID.String, ActionID: string(action), RunID: string(run), AttemptNo: t.AttemptNo.Int64,
		Status: t.Status.String, Effect: t.Effect.String, EffectObservationID: t.EffectObservationID, Result: t.Result,
		Error: t.Error, Version: t.Version.Int64, StartedAt: t.StartedAt.Int64, FinishedAt: t.FinishedAt}
	return row.toAttempt()
}

// joinedAttemptCols is an attempt (alias t) read through a LEFT JOIN, its
// action and run known from the other side.
const joinedAttemptCols = `t.id, t.attempt_no, t.status, t.effect, t.effect_observation_id, t.result, t.error, t.version,
	t.started_at, t.finished_at`

// targets are the Scan targets of joinedAttemptCols.
func (t *nullableAttemptRow) targets() []any {
	return []any{&t.ID, &t.AttemptNo, &t.Status, &t.Effect, &t.EffectObservationID, &t.Result, &t.Error, &t.Version,
		&t.StartedAt, &t.FinishedAt}
}

// qualified is the column list cols with every column qualified by alias.
func qualified(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}

const cancellationCols = `id, run_id, tenant, state, requested_by, reason, version, requested_at,
	accepted_at, stopping_at, stopped_at, too_late_at`

// targets are the Scan targets of cancellationCols.
func (r *cancellationRow) targets() []any {
	return []any{&r.ID, &r.RunID, &r.Tenant, &r.State, &r.RequestedBy, &r.Reason, &r.Version, &r.RequestedAt,
		&r.AcceptedAt, &r.StoppingAt, &r.StoppedAt, &r.TooLateAt}
}

// The rows of the ledger's objects, for inserting them.

func microsPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	us := micros(*t)
	return &us
}

func runRowOf(r *ledger.Run) runRow {
	return runRow{ID: string(r.ID), Tenant: r.Tenant, IdempotencyKey: r.IdempotencyKey, RequestDigest: string(r.RequestDigest),
		SubmittedBy: r.SubmittedBy, Agent: r.Agent, Input: string(r.Input), State: string(r.State),
		StopReason: strPtr(string(r.StopReason)), Version: r.Version, EventSeq: r.EventSeq, EventHash: r.EventHash,
		CreatedAt: micros(r.CreatedAt), UpdatedAt: micros(r.UpdatedAt)}
}

func budgetRowOf(r *ledger.Run) budgetRow {
	l, u := r.Budget.Limits, r.Budget.Used
	return budgetRow{RunID: string(r.ID), MaxAttemptsPerAction: l.MaxAttemptsPerAction, MaxAttemptsPerRun: l.MaxAttemptsPerRun,
		MaxExecutionUs: l.MaxExecution.Microseconds(), MaxSteps: l.MaxSteps, MaxTokens: l.MaxTokens,
		DeadlineAt: microsPtr(r.Budget.Deadline), AttemptsUsed: u.Attempts, ExecutionUsedUs: u.Execution.Microseconds(),
		StepsUsed: u.Steps, TokensUsed: u.Tokens, TokensUnavailable: u.TokensUnavailable, Version: 1}
}

func actionRowOf(a *ledger.Action) actionRow {
	row := actionRow{ID: string(a.ID), RunID: string(a.RunID), Tenant: a.Tenant, Seq: a.Seq, IdempotencyKey: a.IdempotencyKey,
		Tool: a.Tool, ToolVersion: a.ToolVersion, Effect: string(a.Effect), Arguments: string(a.Arguments),
		ActionDigest: string(a.ActionDigest), DedupKey: a.DedupKey, Supersedes: strPtr(string(a.Supersedes)),
		State: string(a.State), AttemptCount: a.AttemptCount, Version: a.Version,
		CreatedAt: micros(a.CreatedAt), UpdatedAt: micros(a.UpdatedAt)}
	if g := a.Gate; g != nil {
		rule := int64(g.Rule)
		row.GateDecision, row.GateRule, row.GateReason, row.RulesDigest = strPtr(string(g.Decision)), &rule, &g.Reason, strPtr(string(g.RulesDigest))
	}
	return row
}

func approvalRowOf(a *ledger.Approval) approvalRow {
	return approvalRow{ID: string(a.ID), ActionID: string(a.ActionID), RunID: string(a.RunID), Tenant: a.Tenant,
		ActionDigest: string(a.ActionDigest), State: string(a.State), DecidedBy: strPtr(a.DecidedBy), Reason: strPtr(a.Reason),
		Version: a.Version, RequestedAt: micros(a.RequestedAt), ExpiresAt: microsPtr(a.ExpiresAt), DecidedAt: microsPtr(a.DecidedAt)}
}

func cancellationRowOf(c *ledger.Cancellation) cancellationRow {
	return cancellationRow{ID: string(c.ID), RunID: string(c.RunID), Tenant: c.Tenant, State: string(c.State),
		RequestedBy: c.RequestedBy, Reason: strPtr(c.Reason), Version: c.Version, RequestedAt: micros(c.RequestedAt),
		AcceptedAt: microsPtr(c.AcceptedAt), StoppingAt: microsPtr(c.StoppingAt), StoppedAt: microsPtr(c.StoppedAt),
		TooLateAt: microsPtr(c.TooLateAt)}
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

func leaseRowOf(l *ledger.AttemptLease) leaseRow {
	return leaseRow{AttemptID: string(l.AttemptID), ActionID: string(l.ActionID), RunID: string(l.RunID), BeginKey: l.BeginKey,
		TokenSHA256: l.TokenSHA256, LeaseUs: l.Lease.Microseconds(), LeaseUntil: micros(l.Until), MaxUntil: micros(l.MaxUntil),
		Heartbeats: l.Heartbeats, Progress: rawPtr(l.Progress), OutcomeDigest: strPtr(string(l.OutcomeDigest)), Outcome: rawPtr(l.Outcome)}
}

func (r *leaseRow) toLease() *ledger.AttemptLease {
	return &ledger.AttemptLease{AttemptID: ledger.AttemptID(r.AttemptID), ActionID: ledger.ActionID(r.ActionID), RunID: ledger.RunID(r.RunID),
		BeginKey: r.BeginKey, TokenSHA256: r.TokenSHA256, Lease: time.Duration(r.LeaseUs) * time.Microsecond,
		Until: fromMicros(r.LeaseUntil), MaxUntil: fromMicros(r.MaxUntil), Heartbeats: r.Heartbeats,
		Progress: ptrRaw(r.Progress), OutcomeDigest: ledger.Digest(deref(r.OutcomeDigest)), Outcome: ptrRaw(r.Outcome)}
}

type agentDecisionRow struct {
	ActionID   string `gorm:"primaryKey"`
	DecisionID string
	Kind       string
	Answered   bool
	DecidedAt  int64
}

func (agentDecisionRow) TableName() string { return "agent_decisions" }

func (r *agentDecisionRow) toDecision() *ledger.AgentDecision {
	return &ledger.AgentDecision{ActionID: ledger.ActionID(r.ActionID), DecisionID: r.DecisionID, Kind: r.Kind,
		Answered: r.Answered, DecidedAt: fromMicros(r.DecidedAt)}
}

// signatureRow is a row of chain_signatures.
type signatureRow struct {
	RunID     string
	Seq       int64
	Hash      string
	SignedAt  int64
	KeyID     string
	Signature string
}

func (signatureRow) TableName() string { return "chain_signatures" }

// toSignature is the row's signature. A signature that is not base64 (an
// edit) is kept as its text, which verifies as nothing.
func (r *signatureRow) toSignature() *ledger.HeadSignature {
	sig, err := base64.StdEncoding.DecodeString(r.Signature)
	if err != nil {
		sig = []byte(r.Signature)
	}
	return &ledger.HeadSignature{RunID: ledger.RunID(r.RunID), Seq: r.Seq, Hash: r.Hash, SignedAt: fromMicros(r.SignedAt),
		KeyID: r.KeyID, Signature: sig}
}
