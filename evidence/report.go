package evidence

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/redact"
)

// SchemaVersion is the schema_version of the reports this build writes
// (contracts.SchemaReport). 1.1 added what a third party needs to check a
// report without the database: each row's digest and the digests of what
// redaction hid (redacted_fields), each event's hash format, bound rows
// and data digest, the rows the chain verdict checked, and the signed
// chain head. 1.2 added each action's gate: which rule of which rule set
// chose the state it entered, and why. 1.3 added the rule sets the gates
// cite (rule_sets), each checked by its digest, and each action's
// deciding_rule, the rule of that set that decided; and each approval's
// execute_by, and when and why a granted one went stale.
const SchemaVersion = "1.3"

// DecisionEventType is the type of the events recording recovery decisions.
const DecisionEventType = "recovery.decision"

// Report is a run's evidence: what the ledger recorded about it, redacted.
// It mirrors contracts/schemas/report.v1.json field for field; absent facts
// are null in JSON, never omitted.
//
// Every row a report shows carries Digest, the digest of its content as
// the ledger stored it (ledger.Content), and RedactedFields, the digests of
// the stored nodes redaction hid (hidden.go); every event its format, the
// rows it bound and RedactedData, the same for its data. With them Verify
// checks a report without the database (verify.go).
type Report struct {
	SchemaVersion     string             `json:"schema_version"`
	GeneratedAt       time.Time          `json:"generated_at"`
	Run               RunSummary         `json:"run"`
	Actions           []Action           `json:"actions"`
	Cancellation      *Cancellation      `json:"cancellation"`
	Budget            Budget             `json:"budget"`
	RecoveryDecisions []RecoveryDecision `json:"recovery_decisions"`
	Observations      []Observation      `json:"observations"`
	Timeline          []TimelineEvent    `json:"timeline"`
	Chain             Chain              `json:"chain"`
	// RuleSets are the stored rule sets the actions' gates cite, in the
	// order of their first citation; a cited rule set the ledger does not
	// hold (an action recorded before rule sets were stored) is missing.
	RuleSets []RuleSet `json:"rule_sets"`
	// Signature is the newest signature of the run's chain head; nil if
	// the ledger signed none.
	Signature *Signature `json:"signature"`
	Redaction Redaction  `json:"redaction"`
}

// RunSummary is the run a report is about.
type RunSummary struct {
	ID          ledger.RunID       `json:"id"`
	Tenant      string             `json:"tenant"`
	Agent       string             `json:"agent"`
	State       ledger.RunState    `json:"state"`
	StopReason  *ledger.StopReason `json:"stop_reason"`
	SubmittedBy string             `json:"submitted_by"`
	CreatedAt   time.Time          `json:"created_at"`
	UpdatedAt   time.Time          `json:"updated_at"`
	Digest      ledger.Digest      `json:"digest"`
}

// Action is one action with its attempts and approvals. Arguments are
// redacted: a JSON object, or a single marker string when the export does
// not know the tool's secret paths.
type Action struct {
	ID             ledger.ActionID    `json:"id"`
	Seq            int64              `json:"seq"`
	Tool           string             `json:"tool"`
	ToolVersion    string             `json:"tool_version"`
	Effect         ledger.Effect      `json:"effect"`
	State          ledger.ActionState `json:"state"`
	ActionDigest   ledger.Digest      `json:"action_digest"`
	DedupKey       string             `json:"dedup_key"`
	Supersedes     *ledger.ActionID   `json:"supersedes"`
	Arguments      json.RawMessage    `json:"arguments"`
	CreatedAt      time.Time          `json:"created_at"`
	UpdatedAt      time.Time          `json:"updated_at"`
	Attempts       []Attempt          `json:"attempts"`
	Approvals      []Approval         `json:"approvals"`
	Digest         ledger.Digest      `json:"digest"`
	RedactedFields RedactedFields     `json:"redacted_fields"`
	// Gate is what the gate decided when the action was recorded and why,
	// as the action's content holds it (rule null: the default decided);
	// nil for an action recorded before the gate was audited. The policy
	// writes its reason, so nothing of it is redacted.
	Gate *ledger.GateContent `json:"gate"`
	// DecidingRule is the rule that decided, as the rule set the gate cites
	// holds it (rule_sets): nil when the default decided, when there is no
	// gate, or when that rule set is not in the report.
	DecidingRule json.RawMessage `json:"deciding_rule"`
}

// RuleSet is an approval rule set a gate cites: its digest and the
// document the digest covers (the rules in file order and the defaults),
// as the ledger stored it (ledger.RuleSet).
type RuleSet struct {
	Digest   ledger.Digest   `json:"digest"`
	Document json.RawMessage `json:"document"`
}

// Attempt is one try at executing an action. Status (what was seen of the
// call) and Effect (whether the world changed) are separate facts.
type Attempt struct {
	ID                  ledger.AttemptID      `json:"id"`
	No                  int64                 `json:"attempt_no"`
	Status              ledger.AttemptStatus  `json:"status"`
	Effect              ledger.EffectFact     `json:"effect"`
	EffectObservationID *ledger.ObservationID `json:"effect_observation_id"`
	// Result is the tool's answer, redacted; JSON null if none.
	Result         json.RawMessage      `json:"result"`
	Error          *ledger.AttemptError `json:"error"`
	StartedAt      time.Time            `json:"started_at"`
	FinishedAt     *time.Time           `json:"finished_at"`
	Digest         ledger.Digest        `json:"digest"`
	RedactedFields RedactedFields       `json:"redacted_fields"`
}

// Approval is one request for a person to allow an action's digest.
type Approval struct {
	ID           ledger.ApprovalID    `json:"id"`
	State        ledger.ApprovalState `json:"state"`
	ActionDigest ledger.Digest        `json:"action_digest"`
	DecidedBy    *string              `json:"decided_by"`
	Reason       *string              `json:"reason"`
	RequestedAt  time.Time            `json:"requested_at"`
	ExpiresAt    *time.Time           `json:"expires_at"`
	DecidedAt    *time.Time           `json:"decided_at"`
	// ExecuteBy, StaleAt and StaleReason (1.3) are a granted approval's
	// limit and, once it stopped covering its action, when and why; null
	// otherwise.
	ExecuteBy      *time.Time     `json:"execute_by"`
	StaleAt        *time.Time     `json:"stale_at"`
	StaleReason    *string        `json:"stale_reason"`
	Digest         ledger.Digest  `json:"digest"`
	RedactedFields RedactedFields `json:"redacted_fields"`
}

// Cancellation is the run's cancellation: requested, accepted, stopping and
// stopped (confirmed), each with its time; or too late, when the run ended
// before the cancel took effect.
type Cancellation struct {
	ID             ledger.CancellationID    `json:"id"`
	State          ledger.CancellationState `json:"state"`
	RequestedBy    string                   `json:"requested_by"`
	Reason         *string                  `json:"reason"`
	RequestedAt    time.Time                `json:"requested_at"`
	AcceptedAt     *time.Time               `json:"accepted_at"`
	StoppingAt     *time.Time               `json:"stopping_at"`
	StoppedAt      *time.Time               `json:"stopped_at"`
	TooLateAt      *time.Time               `json:"too_late_at"`
	Digest         ledger.Digest            `json:"digest"`
	RedactedFields RedactedFields           `json:"redacted_fields"`
}

// Budget is the run's limits and usage. Durations are whole milliseconds.
type Budget struct {
	Limits   BudgetLimits  `json:"limits"`
	Deadline *time.Time    `json:"deadline"`
	Used     BudgetUsage   `json:"used"`
	Digest   ledger.Digest `json:"digest"`
}

// BudgetLimits are a run's limits; nil means none.
type BudgetLimits struct {
	MaxAttemptsPerAction *int64 `json:"max_attempts_per_action"`
	MaxAttemptsPerRun    *int64 `json:"max_attempts_per_run"`
	MaxExecutionMS       *int64 `json:"max_execution_ms"`
	MaxSteps             *int64 `json:"max_steps"`
	MaxTokens            *int64 `json:"max_tokens"`
	DeadlineAfterMS      *int64 `json:"deadline_after_ms"`
}

// BudgetUsage is what a run has used.
type BudgetUsage struct {
	Attempts    int64 `json:"attempts"`
	ExecutionMS int64 `json:"execution_ms"`
	Steps       int64 `json:"steps"`
	Tokens      int64 `json:"tokens"`
	// TokensUnavailable: a step reported no usage, so Tokens is a lower
	// bound.
	TokensUnavailable bool `json:"tokens_unavailable"`
}

// RecoveryDecision is one decision recovery recorded, with its rationale.
type RecoveryDecision struct {
	Seq       int64             `json:"seq"`
	EventID   ledger.EventID    `json:"event_id"`
	ActionID  ledger.ActionID   `json:"action_id"`
	AttemptID *ledger.AttemptID `json:"attempt_id"`
	Decision  string            `json:"decision"`
	Rationale string            `json:"rationale"`
	// Facts are the event's other data (the tool's guarantees, a stop
	// reason…), redacted; always an object.
	Facts     json.RawMessage `json:"facts"`
	Actor     string          `json:"actor"`
	DecidedAt time.Time       `json:"decided_at"`
}

// Observation is tool-side or human evidence about an attempt's effect.
type Observation struct {
	ID        ledger.ObservationID     `json:"id"`
	ActionID  ledger.ActionID          `json:"action_id"`
	AttemptID *ledger.AttemptID        `json:"attempt_id"`
	Source    ledger.ObservationSource `json:"source"`
	Effect    ledger.EffectFact        `json:"effect"`
	// Detail is what the source said, redacted; JSON null if nothing.
	Detail         json.RawMessage `json:"detail"`
	ObservedAt     time.Time       `json:"observed_at"`
	Digest         ledger.Digest   `json:"digest"`
	RedactedFields RedactedFields  `json:"redacted_fields"`
}

// TimelineEvent is one event of the run's chain. Redacted is true when
// redaction changed Data, so the event's Hash covers data the report does
// not show: for an event of format 2, RedactedData then gives the digests
// of the nodes it hid, from which and the rest of Data the digest its hash
// covers is recomputed. Rows are the rows the event bound
// (ledger.Event.Rows); nil if none.
type TimelineEvent struct {
	Seq          int64           `json:"seq"`
	ID           ledger.EventID  `json:"id"`
	Type         string          `json:"type"`
	EntityType   string          `json:"entity_type"`
	EntityID     string          `json:"entity_id"`
	FromState    *string         `json:"from_state"`
	ToState      *string         `json:"to_state"`
	Actor        *string         `json:"actor"`
	Data         json.RawMessage `json:"data"`
	Redacted     bool            `json:"redacted"`
	CreatedAt    time.Time       `json:"created_at"`
	Hash         string          `json:"hash"`
	PrevHash     string          `json:"prev_hash"`
	Format       int             `json:"format"`
	Rows         json.RawMessage `json:"rows"`
	RedactedData Hidden          `json:"redacted_data"`
}

// Chain is the verdict on the run's event chain and its rows
// (ledger.ChainReport).
type Chain struct {
	OK        bool    `json:"ok"`
	Events    int     `json:"events"`
	BrokenSeq *int64  `json:"broken_seq"`
	Reason    *string `json:"reason"`
	// Rows is how many rows were checked against the chain; UnboundRows
	// how many of them were last written before rows were bound, which
	// the chain cannot vouch for.
	Rows        int `json:"rows"`
	UnboundRows int `json:"unbound_rows"`
}

// Signature is a signature of the run's chain head (ledger.HeadSignature):
// the key that made it, the head it signs and when, and the Ed25519
// signature in standard base64.
type Signature struct {
	Algorithm string    `json:"algorithm"`
	KeyID     string    `json:"key_id"`
	Seq       int64     `json:"seq"`
	Hash      string    `json:"hash"`
	SignedAt  time.Time `json:"signed_at"`
	Signature string    `json:"signature"`
}

// Redaction says how secrets were hidden.
type Redaction struct {
	Algorithm string `json:"algorithm"`
	KeyID     string `json:"key_id"`
}

// Options configure Build.
type Options struct {
	// Redactor hides secrets. Required: there is no unredacted report.
	Redactor *redact.Redactor
	// Tools returns the secret paths (RFC 6901 pointers into the arguments)
	// of a tool by name. An action whose tool it does not know, or every
	// action when Tools is nil, has its arguments replaced as a whole:
	// nothing says which of them are secret.
	Tools func(name string) (secretPaths []string, ok bool)
	// Now is the clock for generated_at. Required.
	Now func() time.Time
}

// Build gathers everything the store holds about run into a redacted
// Report. The run's facts, its events and the chain's verdict on them come
// from one snapshot (ledger.Store.FindChain), so the rows a report shows
// are the rows the verdict checked.
//
// Errors: ledger.ErrNotFound for an unknown run; redact.ErrRedaction when anything
// cannot be redacted (the report is then not built at all); store errors
// as they come.
func Build(ctx context.Context, store ledger.Store, run ledger.RunID, opts Options) (*Report, error) {
	if opts.Redactor == nil {
		return nil, fmt.Errorf("%w: no redactor", redact.ErrRedaction)
	}
	if opts.Now == nil {
		return nil, errors.New("evidence: Options.Now is required")
	}
	b := builder{ctx: ctx, store: store, opts: opts}
	rep, err := b.build(run)
	if err != nil {
		return nil, fmt.Errorf("evidence: run %s: %w", run, err)
	}
	return rep, nil
}

type builder struct {
	ctx   context.Context
	store ledger.Store
	opts  Options
}

func (b *builder) build(id ledger.RunID) (*Report, error) {
	r := b.opts.Redactor
	fc, err := b.store.FindChain(b.ctx, id)
	if err != nil {
		return nil, err
	}
	run := fc.Run
	rep := &Report{
		SchemaVersion: SchemaVersion,
		GeneratedAt:   b.opts.Now().UTC(),
		Run: RunSummary{ID: run.ID, Tenant: run.Tenant, Agent: run.Agent, State: run.State,
			StopReason: nonEmpty(run.StopReason), SubmittedBy: run.SubmittedBy,
			CreatedAt: run.CreatedAt.UTC(), UpdatedAt: run.UpdatedAt.UTC(), Digest: ledger.RunContentOf(run).Digest()},
		Budget:    budgetOf(run),
		Redaction: Redaction{Algorithm: "hmac-sha256", KeyID: r.KeyID()},
		Signature: signatureOf(fc.Signature),
		// Empty lists are [] in JSON, never null.
		Actions: []Action{}, RecoveryDecisions: []RecoveryDecision{}, Observations: []Observation{}, Timeline: []TimelineEvent{},
		RuleSets: []RuleSet{},
	}
	if err := b.actions(rep, fc); err != nil {
		return nil, err
	}
	if err := rep.addRuleSets(fc.RuleSets); err != nil {
		return nil, err
	}
	if fc.Cancellation != nil {
		rep.Cancellation = b.cancellation(fc.Cancellation)
	}
	if err := b.observations(rep, fc.Observations); err != nil {
		return nil, err
	}
	if err := b.timeline(rep, fc.Events, fc.Report.OK); err != nil {
		return nil, err
	}
	chain := fc.Report
	rep.Chain = Chain{OK: chain.OK, Events: chain.Events, Rows: chain.Rows, UnboundRows: chain.Unbound}
	if !chain.OK {
		reason := b.opts.Redactor.RedactString(chain.Reason)
		rep.Chain.BrokenSeq, rep.Chain.Reason = &chain.BrokenSeq, &reason
	}
	return rep, nil
}

// signatureOf is the report's form of a head signature.
func signatureOf(h *ledger.HeadSignature) *Signature {
	if h == nil {
		return nil
	}
	return &Signature{Algorithm: SignatureAlgorithm, KeyID: h.KeyID, Seq: h.Seq, Hash: h.Hash, SignedAt: h.SignedAt.UTC(),
		Signature: base64.StdEncoding.EncodeToString(h.Signature)}
}

// SignatureAlgorithm is the algorithm of head signatures.
const SignatureAlgorithm = "ed25519"

func (b *builder) actions(rep *Report, fc *ledger.Chain) error {
	r := b.opts.Redactor
	byAction := map[ledger.ActionID]*Action{}
	for _, a := range fc.Actions {
		args, changed, err := b.arguments(a)
		if err != nil {
			return err
		}
		c := ledger.ActionContentOf(a)
		hidden := RedactedFields{}
		if changed {
			if hidden["arguments"], err = hiddenNodes(a.Arguments, args); err != nil {
				return fmt.Errorf("action %s arguments: %w", a.ID, err)
			}
		}
		rep.Actions = append(rep.Actions, Action{
			ID: a.ID, Seq: a.Seq, Tool: a.Tool, ToolVersion: a.ToolVersion, Effect: a.Effect, State: a.State,
			ActionDigest: a.ActionDigest, DedupKey: a.DedupKey, Supersedes: nonEmpty(a.Supersedes), Arguments: args,
			CreatedAt: a.CreatedAt.UTC(), UpdatedAt: a.UpdatedAt.UTC(), Attempts: []Attempt{}, Approvals: []Approval{},
			Digest: c.Digest(), RedactedFields: hidden, Gate: c.Gate,
		})
	}
	for i := range rep.Actions {
		byAction[rep.Actions[i].ID] = &rep.Actions[i]
	}
	for _, at := range fc.Attempts {
		a, ok := byAction[at.ActionID]
		if !ok {
			return fmt.Errorf("attempt %s belongs to action %s, which the run does not have", at.ID, at.ActionID)
		}
		c := ledger.AttemptContentOf(at)
		hidden := RedactedFields{}
		result, changed, err := r.RedactJSONChanged(at.Result, nil)
		if err != nil {
			return fmt.Errorf("attempt %s result: %w", at.ID, err)
		}
		if changed {
			if hidden["result"], err = hiddenNodes(at.Result, result); err != nil {
				return fmt.Errorf("attempt %s result: %w", at.ID, err)
			}
		}
		var attErr *ledger.AttemptError
		if at.Error != nil {
			attErr = &ledger.AttemptError{Code: r.RedactString(at.Error.Code), Message: r.RedactString(at.Error.Message)}
			nodes, err := errorNodes(at.Error, attErr)
			if err != nil {
				return fmt.Errorf("attempt %s error: %w", at.ID, err)
			}
			if nodes != nil {
				hidden["error"] = nodes
			}
		}
		a.Attempts = append(a.Attempts, Attempt{
			ID: at.ID, No: at.No, Status: at.Status, Effect: at.Effect, EffectObservationID: nonEmpty(at.EffectObservation),
			Result: orNull(result), Error: attErr, StartedAt: at.StartedAt.UTC(), FinishedAt: utcPtr(at.FinishedAt),
			Digest: c.Digest(), RedactedFields: hidden,
		})
	}
	for _, ap := range fc.Approvals {
		a, ok := byAction[ap.ActionID]
		if !ok {
			return fmt.Errorf("approval %s belongs to action %s, which the run does not have", ap.ID, ap.ActionID)
		}
		c := ledger.ApprovalContentOf(ap)
		reason, hidden := redactText(r, ap.Reason)
		a.Approvals = append(a.Approvals, Approval{
			ID: ap.ID, State: ap.State, ActionDigest: ap.ActionDigest, DecidedBy: nonEmpty(ap.DecidedBy),
			Reason: nonEmpty(reason), RequestedAt: ap.RequestedAt.UTC(),
			ExpiresAt: utcPtr(ap.ExpiresAt), DecidedAt: utcPtr(ap.DecidedAt), ExecuteBy: utcPtr(ap.ExecuteBy),
			StaleAt: utcPtr(ap.StaleAt), StaleReason: nonEmpty(ap.StaleReason), Digest: c.Digest(), RedactedFields: hidden,
		})
	}
	// The store's orders are documented, but a report must not depend on
	// them to be stable.
	for i := range rep.Actions {
		slices.SortStableFunc(rep.Actions[i].Attempts, func(x, y Attempt) int { return cmp.Compare(x.No, y.No) })
		slices.SortStableFunc(rep.Actions[i].Approvals, func(x, y Approval) int {
			return cmp.Or(x.RequestedAt.Compare(y.RequestedAt), cmp.Compare(x.ID, y.ID))
		})
	}
	slices.SortStableFunc(rep.Actions, func(x, y Action) int { return cmp.Compare(x.Seq, y.Seq) })
	return nil
}

// redactText redacts a row's reason and, if that changed it, names it in
// the row's RedactedFields.
func redactText(r *redact.Redactor, s string) (string, RedactedFields) {
	hidden := RedactedFields{}
	out := r.RedactString(s)
	if nodes := textNodes(s, out); nodes != nil {
		hidden["reason"] = nodes
	}
	return out, hidden
}

// arguments redacts an action's arguments with its tool's secret paths, or
// replaces them as a whole when the tool's secret paths are unknown, and
// reports whether that changed them.
func (b *builder) arguments(a *ledger.Action) (json.RawMessage, bool, error) {
	r := b.opts.Redactor
	var (
		paths []string
		known bool
	)
	if b.opts.Tools != nil {
		paths, known = b.opts.Tools(a.Tool)
	}
	if !known {
		paths = []string{""}
	}
	args, changed, err := r.RedactJSONChanged(a.Arguments, paths)
	if err != nil {
		return nil, false, fmt.Errorf("action %s arguments: %w", a.ID, err)
	}
	return orNull(args), changed, nil
}

func (b *builder) cancellation(c *ledger.Cancellation) *Cancellation {
	content := ledger.CancellationContentOf(c)
	reason, hidden := redactText(b.opts.Redactor, c.Reason)
	return &Cancellation{
		ID: c.ID, State: c.State, RequestedBy: c.RequestedBy, Reason: nonEmpty(reason),
		RequestedAt: c.RequestedAt.UTC(), AcceptedAt: utcPtr(c.AcceptedAt), StoppingAt: utcPtr(c.StoppingAt),
		StoppedAt: utcPtr(c.StoppedAt), TooLateAt: utcPtr(c.TooLateAt), Digest: content.Digest(), RedactedFields: hidden,
	}
}

func (b *builder) observations(rep *Report, obs []*ledger.Observation) error {
	for _, o := range obs {
		detail, changed, err := b.opts.Redactor.RedactJSONChanged(o.Detail, nil)
		if err != nil {
			return fmt.Errorf("observation %s detail: %w", o.ID, err)
		}
		c := ledger.ObservationContentOf(o)
		hidden := RedactedFields{}
		if changed {
			if hidden["detail"], err = hiddenNodes(o.Detail, detail); err != nil {
				return fmt.Errorf("observation %s detail: %w", o.ID, err)
			}
		}
		rep.Observations = append(rep.Observations, Observation{
			ID: o.ID, ActionID: o.ActionID, AttemptID: nonEmpty(o.AttemptID), Source: o.Source, Effect: o.Effect,
			Detail: orNull(detail), ObservedAt: o.ObservedAt.UTC(), Digest: c.Digest(), RedactedFields: hidden,
		})
	}
	slices.SortStableFunc(rep.Observations, func(x, y Observation) int {
		return cmp.Or(x.ObservedAt.Compare(y.ObservedAt), cmp.Compare(x.ID, y.ID))
	})
	return nil
}

// decisionData is the part of a recovery.decision event's data the report
// lifts into its own fields.
type decisionData struct {
	Decision  string           `json:"decision"`
	Rationale string           `json:"rationale"`
	AttemptID ledger.AttemptID `json:"attempt_id"`
}

// timeline redacts the events into rep.Timeline, sized for them at once,
// and lifts the recovery decisions. The states and actors the events point
// at are kept in one slab rather than allocated one by one. chainOK is the
// verdict on events, whose rows it then need not check again.
func (b *builder) timeline(rep *Report, events []*ledger.Event, chainOK bool) error {
	r := b.opts.Redactor
	rep.Timeline = slices.Grow(rep.Timeline, len(events))
	texts := make([]string, 0, 3*len(events))
	text := func(s string) *string {
		if s == "" {
			return nil
		}
		texts = append(texts, s) // within its capacity: never moves
		return &texts[len(texts)-1]
	}
	for _, e := range events {
		data, changed, err := r.RedactJSONChanged(e.Data, nil)
		if err != nil {
			return fmt.Errorf("event %d data: %w", e.Seq, err)
		}
		// A chain that verified has read every event's rows already.
		if !chainOK && len(e.Rows) > 0 && (e.Rows[0] != '{' || !json.Valid(e.Rows)) {
			return fmt.Errorf("event %d: the rows it binds are not a JSON object", e.Seq)
		}
		var hidden Hidden
		if changed && e.Format == ledger.EventFormat {
			if hidden, err = hiddenNodes(e.Data, data); err != nil {
				return fmt.Errorf("event %d data: %w", e.Seq, err)
			}
		}
		rep.Timeline = append(rep.Timeline, TimelineEvent{
			Seq: e.Seq, ID: e.ID, Type: e.Type, EntityType: e.EntityType, EntityID: e.EntityID,
			FromState: text(e.FromState), ToState: text(e.ToState), Actor: text(e.Actor),
			Data: orNull(data), Redacted: changed, CreatedAt: e.CreatedAt.UTC(), Hash: e.Hash, PrevHash: e.PrevHash,
			Format: max(e.Format, 1), Rows: orNull(e.Rows), RedactedData: hidden,
		})
		if e.Type == DecisionEventType {
			d, err := b.decision(e)
			if err != nil {
				return err
			}
			rep.RecoveryDecisions = append(rep.RecoveryDecisions, d)
		}
	}
	return nil
}

// decision lifts a recovery.decision event into a RecoveryDecision: the
// decision, its rationale and attempt become fields, the rest are Facts.
func (b *builder) decision(e *ledger.Event) (RecoveryDecision, error) {
	r := b.opts.Redactor
	var d decisionData
	facts := map[string]json.RawMessage{}
	if len(e.Data) > 0 {
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return RecoveryDecision{}, fmt.Errorf("%w: event %d: malformed decision data", redact.ErrRedaction, e.Seq)
		}
		if err := json.Unmarshal(e.Data, &facts); err != nil {
			return RecoveryDecision{}, fmt.Errorf("%w: event %d: malformed decision data", redact.ErrRedaction, e.Seq)
		}
	}
	delete(facts, "decision")
	delete(facts, "rationale")
	delete(facts, "attempt_id")
	raw, err := json.Marshal(facts)
	if err != nil {
		return RecoveryDecision{}, fmt.Errorf("event %d facts: %w", e.Seq, err)
	}
	redacted, _, err := r.RedactJSONChanged(raw, nil)
	if err != nil {
		return RecoveryDecision{}, fmt.Errorf("event %d facts: %w", e.Seq, err)
	}
	return RecoveryDecision{
		Seq: e.Seq, EventID: e.ID, ActionID: ledger.ActionID(e.EntityID), AttemptID: nonEmpty(d.AttemptID),
		Decision: r.RedactString(d.Decision), Rationale: r.RedactString(d.Rationale), Facts: redacted,
		Actor: e.Actor, DecidedAt: e.CreatedAt.UTC(),
	}, nil
}

// budgetOf is the run's budget as a report shows it: its content
// (ledger.BudgetContent) and the deadline relative to the run's start.
func budgetOf(run *ledger.Run) Budget {
	c := ledger.BudgetContentOf(run.ID, run.Budget)
	return Budget{
		Limits: BudgetLimits{
			MaxAttemptsPerAction: c.MaxAttemptsPerAction,
			MaxAttemptsPerRun:    c.MaxAttemptsPerRun,
			MaxExecutionMS:       c.MaxExecutionMS,
			MaxSteps:             c.MaxSteps,
			MaxTokens:            c.MaxTokens,
			DeadlineAfterMS:      ledger.LimitOf(ledger.CeilMS(run.Budget.Limits.DeadlineAfter)),
		},
		Deadline: utcPtr(c.Deadline),
		Used: BudgetUsage{Attempts: c.Attempts, ExecutionMS: c.ExecutionMS, Steps: c.Steps, Tokens: c.Tokens,
			TokensUnavailable: c.TokensUnavailable},
		Digest: c.Digest(),
	}
}

// nonEmpty returns nil for the zero value, so JSON shows null.
func nonEmpty[T ~string](v T) *T {
	if v == "" {
		return nil
	}
	return &v
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

var jsonNull = json.RawMessage("null")

// orNull makes an absent document JSON null.
func orNull(doc json.RawMessage) json.RawMessage {
	if len(doc) == 0 {
		return jsonNull
	}
	return doc
}

// addRuleSets puts the rule sets the actions cite into the report and
// gives each gated action the rule that decided it.
func (r *Report) addRuleSets(sets []*ledger.RuleSet) error {
	for _, rs := range sets {
		r.RuleSets = append(r.RuleSets, RuleSet{Digest: rs.Digest, Document: rs.Document})
	}
	for i := range r.Actions {
		rule, err := r.gateRule(&r.Actions[i])
		if err != nil {
			return err
		}
		r.Actions[i].DecidingRule = rule
	}
	return nil
}

// gateRule is the rule that decided a, from the report's rule set its gate
// cites; nil if the default decided, a has no gate or the report lacks
// that rule set. A rule the set does not have is an error.
func (r *Report) gateRule(a *Action) (json.RawMessage, error) {
	if a.Gate == nil || a.Gate.Rule == nil {
		return nil, nil
	}
	i := slices.IndexFunc(r.RuleSets, func(rs RuleSet) bool { return rs.Digest == a.Gate.RulesDigest })
	if i < 0 {
		return nil, nil
	}
	var doc struct {
		Rules []json.RawMessage `json:"rules"`
	}
	if err := json.Unmarshal(r.RuleSets[i].Document, &doc); err != nil {
		return nil, fmt.Errorf("rule set %s: %w", a.Gate.RulesDigest, err)
	}
	n := *a.Gate.Rule
	if n < 0 || n >= int64(len(doc.Rules)) {
		return nil, fmt.Errorf("action %s: its gate names rule %d, but rule set %s has %d rules", a.ID, n, a.Gate.RulesDigest, len(doc.Rules))
	}
	return doc.Rules[n], nil
}
