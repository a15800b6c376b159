package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gowebpki/jcs"
)

// Row content. Every row an evidence report shows (run, budget, action,
// attempt, approval, cancellation, observation) is bound into its run's
// hash chain: each write that changes a row appends an event whose Rows
// carry the digest of the row's content after the write, so a row edited
// behind the ledger's back no longer matches the newest event that bound
// it.
//
// A row's content is every field the report shows of it, with the id of
// the row it belongs to (an attempt's action, an approval's action, …) and
// in the report's units (times as RFC 3339 in UTC, budget durations in
// whole milliseconds). Documents and free text that a report may redact
// (arguments, results, errors, details, reasons) enter the content as
// their tree digest (treedigest.go), so that a report which hides part of
// one can still be checked: it gives the digests of the parts it hid, and
// everything it shows is recomputed. An action's gate (the policy's
// decision, rule, reason and rules digest) enters as it is: the policy
// wrote it, not a person or a tool. Left out, each
// with its reason: versions and counters the report does not show
// (version, attempt_count, event_seq, event_hash), the run's input and
// idempotency keys (not shown; the request digest in the run's first event
// covers them), and a budget's deadline_after_ms, which is the deadline
// less the run's creation time, both bound.
//
// The digest of a content is the sha256 of its RFC 8785 canonical JSON,
// written directly (keys in order) since it runs for every row a write
// changes; TestContentDigestIsJCS holds each to the general path.

// RowKey names a row a chain binds: "<entity>/<id>", for example
// "approval/apr_…" or "budget/run_…" (a budget is its run's).
type RowKey string

// rowKey is the key of the row id of entity.
func rowKey(entity, id string) RowKey { return RowKey(entity + "/" + id) }

// Entity and ID split the key.
func (k RowKey) split() (entity, id string) {
	entity, id, _ = strings.Cut(string(k), "/")
	return entity, id
}

// Content is a row's content as its run's chain binds it. The types are
// RunContent, BudgetContent, ActionContent, AttemptContent,
// ApprovalContent, CancellationContent and ObservationContent.
type Content interface {
	// Key names the row.
	Key() RowKey
	// Digest is the sha256 of the content's canonical JSON.
	Digest() Digest
	// explain says, if it can tell cheaply, which field of the row
	// disagrees with last, the newest event that bound it; "" if not.
	explain(last *Event) string
}

// RunContent is what a run's digest covers.
type RunContent struct {
	ID          RunID      `json:"id"`
	Tenant      string     `json:"tenant"`
	Agent       string     `json:"agent"`
	State       RunState   `json:"state"`
	StopReason  StopReason `json:"stop_reason"` // "" is null
	SubmittedBy string     `json:"submitted_by"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
}

// RunContentOf is the content of r.
func RunContentOf(r *Run) RunContent {
	return RunContent{ID: r.ID, Tenant: r.Tenant, Agent: r.Agent, State: r.State, StopReason: r.StopReason,
		SubmittedBy: r.SubmittedBy, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
}

// Key implements Content.
func (c RunContent) Key() RowKey { return rowKey("run", string(c.ID)) }

// Digest implements Content.
func (c RunContent) Digest() Digest {
	var o canonObject
	o.str("agent", c.Agent)
	o.time("created_at", c.CreatedAt)
	o.str("id", string(c.ID))
	o.str("state", string(c.State))
	o.strOrNull("stop_reason", string(c.StopReason))
	o.str("submitted_by", c.SubmittedBy)
	o.str("tenant", c.Tenant)
	o.time("updated_at", c.UpdatedAt)
	return o.digest()
}

func (c RunContent) explain(last *Event) string { return stateHint(last, "run", string(c.State)) }

// BudgetContent is what a budget's digest covers: its limits (nil for
// none) and usage as a report shows them, durations in whole milliseconds
// (limits rounded up, usage down).
type BudgetContent struct {
	RunID                RunID      `json:"run_id"`
	MaxAttemptsPerAction *int64     `json:"max_attempts_per_action"`
	MaxAttemptsPerRun    *int64     `json:"max_attempts_per_run"`
	MaxExecutionMS       *int64     `json:"max_execution_ms"`
	MaxSteps             *int64     `json:"max_steps"`
	MaxTokens            *int64     `json:"max_tokens"`
	Deadline             *time.Time `json:"deadline"`
	Attempts             int64      `json:"attempts"`
	ExecutionMS          int64      `json:"execution_ms"`
	Steps                int64      `json:"steps"`
	Tokens               int64      `json:"tokens"`
	TokensUnavailable    bool       `json:"tokens_unavailable"`
}

// BudgetContentOf is the content of the budget b of run.
func BudgetContentOf(run RunID, b Budget) BudgetContent {
	l, u := b.Limits, b.Used
	return BudgetContent{
		RunID:                run,
		MaxAttemptsPerAction: LimitOf(l.MaxAttemptsPerAction),
		MaxAttemptsPerRun:    LimitOf(l.MaxAttemptsPerRun),
		MaxExecutionMS:       LimitOf(CeilMS(l.MaxExecution)),
		MaxSteps:             LimitOf(l.MaxSteps),
		MaxTokens:            LimitOf(l.MaxTokens),
		Deadline:             b.Deadline,
		Attempts:             u.Attempts,
		ExecutionMS:          u.Execution.Milliseconds(),
		Steps:                u.Steps,
		Tokens:               u.Tokens,
		TokensUnavailable:    u.TokensUnavailable,
	}
}

// CeilMS rounds a limit up to whole milliseconds, so that a limit under a
// millisecond does not read as none.
func CeilMS(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// LimitOf is a budget limit as reports show it: nil for none (zero).
func LimitOf(v int64) *int64 {
	if v <= 0 {
		return nil
	}
	return &v
}

// Key implements Content.
func (c BudgetContent) Key() RowKey { return rowKey("budget", string(c.RunID)) }

// Digest implements Content.
func (c BudgetContent) Digest() Digest {
	var o canonObject
	o.int("attempts", c.Attempts)
	o.timeOrNull("deadline", c.Deadline)
	o.int("execution_ms", c.ExecutionMS)
	o.intOrNull("max_attempts_per_action", c.MaxAttemptsPerAction)
	o.intOrNull("max_attempts_per_run", c.MaxAttemptsPerRun)
	o.intOrNull("max_execution_ms", c.MaxExecutionMS)
	o.intOrNull("max_steps", c.MaxSteps)
	o.intOrNull("max_tokens", c.MaxTokens)
	o.str("run_id", string(c.RunID))
	o.int("steps", c.Steps)
	o.int("tokens", c.Tokens)
	o.bool("tokens_unavailable", c.TokensUnavailable)
	return o.digest()
}

func (c BudgetContent) explain(*Event) string { return "" }

// ActionContent is what an action's digest covers; its arguments enter as
// their digest. An action recorded without a gate audit (Gate nil) has no
// "gate" key at all, so the rows bound before actions had one keep their
// digests.
type ActionContent struct {
	ID              ActionID    `json:"id"`
	RunID           RunID       `json:"run_id"`
	Seq             int64       `json:"seq"`
	Tool            string      `json:"tool"`
	ToolVersion     string      `json:"tool_version"`
	Effect          Effect      `json:"effect"`
	State           ActionState `json:"state"`
	ActionDigest    Digest      `json:"action_digest"`
	DedupKey        string      `json:"dedup_key"`
	Supersedes      ActionID    `json:"supersedes"` // "" is null
	ArgumentsDigest Digest      `json:"arguments"`
	CreatedAt       time.Time   `json:"created_at"`
	UpdatedAt       time.Time   `json:"updated_at"`
	// Gate is the gate's decision and audit; nil for none.
	Gate *GateContent `json:"gate,omitempty"`
	// Arguments, when known (not redacted), let a mismatch be explained
	// by recomputing the action digest; they are not part of the content
	// but through ArgumentsDigest.
	Arguments json.RawMessage `json:"-"`
}

// ActionContentOf is the content of a, whose arguments are canonical JSON
// as the ledger stores them.
func ActionContentOf(a *Action) ActionContent { return actionContent(a, docDigest(a.Arguments)) }

// actionContent is ActionContentOf with the tree digest of a's arguments
// already taken: a write that binds one action in several states (gate,
// attempt started) takes it once.
func actionContent(a *Action, args Digest) ActionContent {
	return ActionContent{ID: a.ID, RunID: a.RunID, Seq: a.Seq, Tool: a.Tool, ToolVersion: a.ToolVersion,
		Effect: a.Effect, State: a.State, ActionDigest: a.ActionDigest, DedupKey: a.DedupKey, Supersedes: a.Supersedes,
		ArgumentsDigest: args, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt, Gate: GateContentOf(a.Gate),
		Arguments: a.Arguments}
}

// GateContent is an action's gate as its content, its gate event and
// reports hold it: rule is null when the default decided. The reason is
// the policy's text, not a person's, and enters as it is.
type GateContent struct {
	Decision    ActionState `json:"decision"`
	Rule        *int64      `json:"rule"`
	Reason      string      `json:"reason"`
	RulesDigest Digest      `json:"rules_digest"`
}

// GateContentOf is the content of g; nil for nil.
func GateContentOf(g *ActionGate) *GateContent {
	if g == nil {
		return nil
	}
	c := &GateContent{Decision: g.Decision, Reason: g.Reason, RulesDigest: g.RulesDigest}
	if g.Rule >= 0 {
		rule := int64(g.Rule)
		c.Rule = &rule
	}
	return c
}

// Key implements Content.
func (c ActionContent) Key() RowKey { return rowKey("action", string(c.ID)) }

// Digest implements Content.
func (c ActionContent) Digest() Digest {
	var o canonObject
	o.str("action_digest", string(c.ActionDigest))
	o.strOrNull("arguments", string(c.ArgumentsDigest))
	o.time("created_at", c.CreatedAt)
	o.str("dedup_key", c.DedupKey)
	o.str("effect", string(c.Effect))
	if g := c.Gate; g != nil {
		var gate canonObject
		gate.str("decision", string(g.Decision))
		gate.str("reason", g.Reason)
		gate.intOrNull("rule", g.Rule)
		gate.str("rules_digest", string(g.RulesDigest))
		o.raw("gate", gate.close())
		gate.release()
	}
	o.str("id", string(c.ID))
	o.str("run_id", string(c.RunID))
	o.int("seq", c.Seq)
	o.str("state", string(c.State))
	o.strOrNull("supersedes", string(c.Supersedes))
	o.str("tool", c.Tool)
	o.str("tool_version", c.ToolVersion)
	o.time("updated_at", c.UpdatedAt)
	return o.digest()
}

func (c ActionContent) explain(last *Event) string {
	if len(c.Arguments) > 0 {
		d, err := ActionDigest(ActionDigestInput{Tool: c.Tool, ToolVersion: c.ToolVersion, Effect: c.Effect, Arguments: c.Arguments})
		if err != nil || d != c.ActionDigest {
			return fmt.Sprintf("its tool, version, effect or arguments no longer match its action digest %s", c.ActionDigest)
		}
	}
	return stateHint(last, "action", string(c.State))
}

// AttemptContent is what an attempt's digest covers; its result and error
// enter as their digests.
type AttemptContent struct {
	ID                AttemptID     `json:"id"`
	ActionID          ActionID      `json:"action_id"`
	No                int64         `json:"attempt_no"`
	Status            AttemptStatus `json:"status"`
	Effect            EffectFact    `json:"effect"`
	EffectObservation ObservationID `json:"effect_observation_id"` // "" is null
	ResultDigest      Digest        `json:"result"`                // "" is null
	ErrorDigest       Digest        `json:"error"`                 // "" is null
	StartedAt         time.Time     `json:"started_at"`
	FinishedAt        *time.Time    `json:"finished_at"`
}

// AttemptContentOf is the content of a, whose result is canonical JSON as
// the ledger stores it.
func AttemptContentOf(a *Attempt) AttemptContent {
	return AttemptContent{ID: a.ID, ActionID: a.ActionID, No: a.No, Status: a.Status, Effect: a.Effect,
		EffectObservation: a.EffectObservation, ResultDigest: docDigest(a.Result), ErrorDigest: ErrorDigest(a.Error),
		StartedAt: a.StartedAt, FinishedAt: a.FinishedAt}
}

// ErrorDigest is the digest of an attempt's error as its content holds it:
// the tree digest of the document {"code", "message"}; "" for none.
func ErrorDigest(e *AttemptError) Digest {
	if e == nil {
		return ""
	}
	var o canonObject
	o.str("code", e.Code)
	o.str("message", e.Message)
	d := docDigest(o.close())
	o.release()
	return d
}

// Key implements Content.
func (c AttemptContent) Key() RowKey { return rowKey("attempt", string(c.ID)) }

// Digest implements Content.
func (c AttemptContent) Digest() Digest {
	var o canonObject
	o.str("action_id", string(c.ActionID))
	o.int("attempt_no", c.No)
	o.str("effect", string(c.Effect))
	o.strOrNull("effect_observation_id", string(c.EffectObservation))
	o.strOrNull("error", string(c.ErrorDigest))
	o.timeOrNull("finished_at", c.FinishedAt)
	o.str("id", string(c.ID))
	o.strOrNull("result", string(c.ResultDigest))
	o.time("started_at", c.StartedAt)
	o.str("status", string(c.Status))
	return o.digest()
}

func (c AttemptContent) explain(last *Event) string {
	if last != nil && strings.HasPrefix(last.Type, "attempt.effect_") {
		if string(c.Effect) != last.ToState {
			return fmt.Sprintf("effect is %q, but event %d established %q", c.Effect, last.Seq, last.ToState)
		}
		return ""
	}
	return stateHint(last, "attempt", string(c.Status))
}

// ApprovalContent is what an approval's digest covers; its reason enters
// as its digest.
type ApprovalContent struct {
	ID           ApprovalID    `json:"id"`
	ActionID     ActionID      `json:"action_id"`
	State        ApprovalState `json:"state"`
	ActionDigest Digest        `json:"action_digest"`
	DecidedBy    string        `json:"decided_by"` // "" is null
	ReasonDigest Digest        `json:"reason"`     // "" is null
	RequestedAt  time.Time     `json:"requested_at"`
	ExpiresAt    *time.Time    `json:"expires_at"`
	DecidedAt    *time.Time    `json:"decided_at"`
	// ExecuteBy, StaleAt and StaleReasonDigest are keys only when set, so
	// approvals bound before approvals had them keep their digests.
	ExecuteBy         *time.Time `json:"execute_by,omitempty"`
	StaleAt           *time.Time `json:"stale_at,omitempty"`
	StaleReasonDigest Digest     `json:"stale_reason,omitempty"`
}

// ApprovalContentOf is the content of a.
func ApprovalContentOf(a *Approval) ApprovalContent {
	return ApprovalContent{ID: a.ID, ActionID: a.ActionID, State: a.State, ActionDigest: a.ActionDigest,
		DecidedBy: a.DecidedBy, ReasonDigest: TextDigest(a.Reason), RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt,
		DecidedAt: a.DecidedAt, ExecuteBy: a.ExecuteBy, StaleAt: a.StaleAt, StaleReasonDigest: TextDigest(a.StaleReason)}
}

// TextDigest is the digest of a free-text field as content holds it: of
// its canonical JSON string (its tree digest as a document); "" for none
// (the empty string).
func TextDigest(s string) Digest {
	if s == "" {
		return ""
	}
	var b bytes.Buffer
	jcsString(&b, s)
	return digestBytes(b.Bytes())
}

// Key implements Content.
func (c ApprovalContent) Key() RowKey { return rowKey("approval", string(c.ID)) }

// Digest implements Content.
func (c ApprovalContent) Digest() Digest {
	var o canonObject
	o.str("action_digest", string(c.ActionDigest))
	o.str("action_id", string(c.ActionID))
	o.timeOrNull("decided_at", c.DecidedAt)
	o.strOrNull("decided_by", c.DecidedBy)
	if c.ExecuteBy != nil {
		o.time("execute_by", *c.ExecuteBy)
	}
	o.timeOrNull("expires_at", c.ExpiresAt)
	o.str("id", string(c.ID))
	o.strOrNull("reason", string(c.ReasonDigest))
	o.time("requested_at", c.RequestedAt)
	if c.StaleAt != nil {
		o.time("stale_at", *c.StaleAt)
	}
	if c.StaleReasonDigest != "" {
		o.str("stale_reason", string(c.StaleReasonDigest))
	}
	o.str("state", string(c.State))
	return o.digest()
}

func (c ApprovalContent) explain(last *Event) string {
	if last != nil && last.EntityType == "approval" && (last.ToState == string(ApprovalGranted) || last.ToState == string(ApprovalDenied)) &&
		c.DecidedBy != last.Actor {
		return fmt.Sprintf("decided_by is %q, but event %d records the decision by %q", c.DecidedBy, last.Seq, last.Actor)
	}
	return stateHint(last, "approval", string(c.State))
}

// CancellationContent is what a cancellation's digest covers; its reason
// enters as its digest.
type CancellationContent struct {
	ID           CancellationID    `json:"id"`
	RunID        RunID             `json:"run_id"`
	State        CancellationState `json:"state"`
	RequestedBy  string            `json:"requested_by"`
	ReasonDigest Digest            `json:"reason"` // "" is null
	RequestedAt  time.Time         `json:"requested_at"`
	AcceptedAt   *time.Time        `json:"accepted_at"`
	StoppingAt   *time.Time        `json:"stopping_at"`
	StoppedAt    *time.Time        `json:"stopped_at"`
	TooLateAt    *time.Time        `json:"too_late_at"`
}

// CancellationContentOf is the content of c.
func CancellationContentOf(c *Cancellation) CancellationContent {
	return CancellationContent{ID: c.ID, RunID: c.RunID, State: c.State, RequestedBy: c.RequestedBy,
		ReasonDigest: TextDigest(c.Reason), RequestedAt: c.RequestedAt, AcceptedAt: c.AcceptedAt, StoppingAt: c.StoppingAt,
		StoppedAt: c.StoppedAt, TooLateAt: c.TooLateAt}
}

// Key implements Content.
func (c CancellationContent) Key() RowKey { return rowKey("cancellation", string(c.ID)) }

// Digest implements Content.
func (c CancellationContent) Digest() Digest {
	var o canonObject
	o.timeOrNull("accepted_at", c.AcceptedAt)
	o.str("id", string(c.ID))
	o.strOrNull("reason", string(c.ReasonDigest))
	o.time("requested_at", c.RequestedAt)
	o.str("requested_by", c.RequestedBy)
	o.str("run_id", string(c.RunID))
	o.str("state", string(c.State))
	o.timeOrNull("stopped_at", c.StoppedAt)
	o.timeOrNull("stopping_at", c.StoppingAt)
	o.timeOrNull("too_late_at", c.TooLateAt)
	return o.digest()
}

func (c CancellationContent) explain(last *Event) string {
	return stateHint(last, "cancellation", string(c.State))
}

// ObservationContent is what an observation's digest covers; its detail
// enters as its digest.
type ObservationContent struct {
	ID           ObservationID     `json:"id"`
	ActionID     ActionID          `json:"action_id"`
	AttemptID    AttemptID         `json:"attempt_id"` // "" is null
	Source       ObservationSource `json:"source"`
	Effect       EffectFact        `json:"effect"`
	DetailDigest Digest            `json:"detail"` // "" is null
	ObservedAt   time.Time         `json:"observed_at"`
}

// ObservationContentOf is the content of o, whose detail is canonical JSON
// as the ledger stores it.
func ObservationContentOf(o *Observation) ObservationContent {
	return ObservationContent{ID: o.ID, ActionID: o.ActionID, AttemptID: o.AttemptID, Source: o.Source, Effect: o.Effect,
		DetailDigest: docDigest(o.Detail), ObservedAt: o.ObservedAt}
}

// Key implements Content.
func (c ObservationContent) Key() RowKey { return rowKey("observation", string(c.ID)) }

// Digest implements Content.
func (c ObservationContent) Digest() Digest {
	var o canonObject
	o.str("action_id", string(c.ActionID))
	o.strOrNull("attempt_id", string(c.AttemptID))
	o.strOrNull("detail", string(c.DetailDigest))
	o.str("effect", string(c.Effect))
	o.str("id", string(c.ID))
	o.time("observed_at", c.ObservedAt)
	o.str("source", string(c.Source))
	return o.digest()
}

func (c ObservationContent) explain(*Event) string { return "" }

// stateHint explains a mismatch by the state the newest event of the row
// moved it to, if that event is a transition of entity and the row's
// state differs.
func stateHint(last *Event, entity, state string) string {
	if last == nil || last.EntityType != entity || last.ToState == "" || last.ToState == state {
		return ""
	}
	return fmt.Sprintf("state is %q, but event %d moved it to %q", state, last.Seq, last.ToState)
}

// canonObject writes a JSON object in RFC 8785 form; the caller adds the
// keys in their sorted order (all of them ASCII, so byte order is JCS's
// UTF-16 order). Its buffer comes from a pool, since a digest is taken of
// every row each write changes: digest (or release) gives it back.
type canonObject struct {
	b *bytes.Buffer
	n int
}

// canonBuffers are canonObject's buffers.
var canonBuffers = sync.Pool{New: func() any { b := new(bytes.Buffer); b.Grow(512); return b }}

func (o *canonObject) key(k string) {
	if o.b == nil {
		o.b = canonBuffers.Get().(*bytes.Buffer)
		o.b.Reset()
	}
	if o.n == 0 {
		o.b.WriteByte('{')
	} else {
		o.b.WriteByte(',')
	}
	o.n++
	jcsString(o.b, k)
	o.b.WriteByte(':')
}

func (o *canonObject) str(k, v string) {
	o.key(k)
	jcsString(o.b, v)
}

// strOrNull writes v, or null for "".
func (o *canonObject) strOrNull(k, v string) {
	if v == "" {
		o.key(k)
		o.b.WriteString("null")
		return
	}
	o.str(k, v)
}

func (o *canonObject) int(k string, v int64) {
	o.key(k)
	if v >= -1<<53 && v <= 1<<53 {
		var num [20]byte
		o.b.Write(strconv.AppendInt(num[:0], v, 10))
		return
	}
	n, err := jcs.NumberToJSON(float64(v)) // what RFC 8785 makes of a number past 2^53
	if err != nil {
		n = strconv.FormatInt(v, 10) // unreachable: every int64 is a finite double
	}
	o.b.WriteString(n)
}

func (o *canonObject) intOrNull(k string, v *int64) {
	if v == nil {
		o.key(k)
		o.b.WriteString("null")
		return
	}
	o.int(k, *v)
}

// raw writes v, which is canonical JSON already (a nested object).
func (o *canonObject) raw(k string, v []byte) {
	o.key(k)
	o.b.Write(v)
}

func (o *canonObject) bool(k string, v bool) {
	o.key(k)
	o.b.WriteString(strconv.FormatBool(v))
}

// time writes t as encoding/json does: RFC 3339 with the fraction only as
// long as it needs, in UTC; the text needs no escaping.
func (o *canonObject) time(k string, t time.Time) {
	o.key(k)
	var text [40]byte
	o.b.WriteByte('"')
	o.b.Write(t.UTC().AppendFormat(text[:0], time.RFC3339Nano))
	o.b.WriteByte('"')
}

func (o *canonObject) timeOrNull(k string, t *time.Time) {
	if t == nil {
		o.key(k)
		o.b.WriteString("null")
		return
	}
	o.time(k, *t)
}

// close ends the object and returns its text, valid until release.
func (o *canonObject) close() []byte {
	if o.b == nil {
		o.b = canonBuffers.Get().(*bytes.Buffer)
		o.b.Reset()
	}
	if o.n == 0 {
		o.b.WriteByte('{')
	}
	o.b.WriteByte('}')
	return o.b.Bytes()
}

// release gives the buffer back.
func (o *canonObject) release() {
	if o.b != nil {
		canonBuffers.Put(o.b)
		o.b = nil
	}
}

func (o *canonObject) digest() Digest {
	d := digestBytes(o.close())
	o.release()
	return d
}
