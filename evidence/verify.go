package evidence

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// Offline verification: a report checked against itself and, if one is
// given, the public key of the ledger's signing key, without the
// database. Verify recomputes every event's hash and the chain's links,
// checks every row the report shows against the digest the newest event
// that recorded it carries (and that every row an event recorded is in the
// report), checks the recovery decisions against their events and, with a
// key, the signature of the chain head.
//
// What redaction hid is covered by digests only: documents enter hashes
// and row contents as tree digests (ledger.HiddenDocDigest), and the report
// gives the digest of each node it hid, so everything it shows is checked
// and each hidden node is taken on trust of its digest. What it shows in a
// hidden node's place must hold a redaction marker; Verified.Hidden counts
// them.
//
// Without a signature, a report that verifies is consistent, not genuine:
// whoever can rewrite the database, or the file, can make a consistent
// report. With one, rewriting the chain and its head together is caught,
// since the head's signature no longer matches; cutting the chain back to
// an older signed head is not (ledger.HeadSignature says why).

// ErrUnverified is matched (errors.Is) by every error of ReadReport and
// Verify about what a report holds: it is not a report, or it does not
// verify. Those errors are *VerifyError.
var ErrUnverified = errors.New("evidence: the report does not verify")

// VerifyError says why a report does not verify.
type VerifyError struct {
	// RunID is the run of the report; "" if the file is not a report.
	RunID  ledger.RunID
	Reason string
	Err    error // what the reason comes from, if anything
}

func (e *VerifyError) Error() string {
	if e.RunID == "" {
		return "evidence: " + e.Reason
	}
	return fmt.Sprintf("evidence: the report of run %s does not verify: %s", e.RunID, e.Reason)
}

// Unwrap returns the error the reason comes from.
func (e *VerifyError) Unwrap() error { return e.Err }

// Is matches ErrUnverified.
func (e *VerifyError) Is(target error) bool { return target == ErrUnverified }

// Verified is what Verify checked of a report that verifies.
type Verified struct {
	RunID ledger.RunID
	// Events is how many events' hashes and links were recomputed; Rows
	// how many rows were checked against them; Unbound how many of those
	// were last written before rows were bound, which the chain cannot
	// vouch for.
	Events, Rows, Unbound int
	// Hidden is how many event data and row fields redaction hid: covered
	// by their digests, not shown.
	Hidden int
	// Signature is the head signature checked against the key, or nil if
	// no key was given.
	Signature *Signature
}

// ReadReport decodes a JSON report after checking it against the report
// schema. Errors match ErrUnverified.
func ReadReport(data []byte) (*Report, error) {
	if err := contracts.Validate(contracts.SchemaReport, data); err != nil {
		return nil, &VerifyError{Reason: "not a valid report: " + err.Error(), Err: err}
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, &VerifyError{Reason: "not a valid report: " + err.Error(), Err: err}
	}
	if r.RuleSets == nil {
		r.RuleSets = []RuleSet{} // a report before 1.3 has none
	}
	return &r, nil
}

// markerText finds a redaction marker in a document or text.
var markerText = regexp.MustCompile(`\[redacted:[0-9a-f]{8}\]`)

// Verify checks the report offline (see above); pub, if not nil, is the
// public key whose signature the chain head must carry. The first problem
// found is the error, which matches ErrUnverified.
func (r *Report) Verify(pub ed25519.PublicKey) (Verified, error) {
	v := Verified{RunID: r.Run.ID, Events: len(r.Timeline)}
	fail := func(format string, args ...any) (Verified, error) {
		return v, &VerifyError{RunID: r.Run.ID, Reason: fmt.Sprintf(format, args...)}
	}
	if r.Chain.Events != len(r.Timeline) {
		return fail("the report says the chain holds %d events, but its timeline shows %d", r.Chain.Events, len(r.Timeline))
	}
	events, hidden, err := r.events()
	if err != nil {
		return fail("%v", err)
	}
	rows, hiddenFields, err := r.contents()
	if err != nil {
		return fail("%v", err)
	}
	v.Hidden = hidden + hiddenFields
	var headSeq int64
	var headHash string
	if n := len(events); n > 0 {
		headSeq, headHash = events[n-1].Seq, events[n-1].Hash
	}
	chain := ledger.VerifyRun(r.Run.ID, events, headSeq, headHash, rows)
	if !chain.OK {
		if chain.Entity != "" {
			return fail("%s", chain.Reason)
		}
		return fail("event %d: %s", chain.BrokenSeq, chain.Reason)
	}
	v.Rows, v.Unbound = chain.Rows, chain.Unbound
	if err := r.checkRowDigests(rows); err != nil {
		return fail("%v", err)
	}
	if err := r.checkDecisions(); err != nil {
		return fail("%v", err)
	}
	if err := r.checkRuleSets(); err != nil {
		return fail("%v", err)
	}
	if !r.Chain.OK {
		return fail("the ledger found its chain broken when it exported the report: %s", strText(r.Chain.Reason))
	}
	if pub != nil {
		sig, err := r.headSignature()
		if err != nil {
			return fail("%v", err)
		}
		if err := ledger.VerifySignedHead(sig, pub, r.Run.ID, headSeq, headHash); err != nil {
			return fail("%v", err)
		}
		v.Signature = r.Signature
	}
	return v, nil
}

// events rebuilds the ledger's events from the timeline, with the data
// canonical again where the report shows it and the digest the report
// gives where it hid it; hidden counts the latter.
func (r *Report) events() ([]*ledger.Event, int, error) {
	out := make([]*ledger.Event, len(r.Timeline))
	hidden := 0
	for i := range r.Timeline {
		t := &r.Timeline[i]
		e := &ledger.Event{ID: t.ID, RunID: r.Run.ID, Seq: t.Seq, Type: t.Type, EntityType: t.EntityType, EntityID: t.EntityID,
			FromState: strText(t.FromState), ToState: strText(t.ToState), Actor: strText(t.Actor), CreatedAt: t.CreatedAt,
			PrevHash: t.PrevHash, Hash: t.Hash, Format: max(t.Format, 1)}
		switch {
		case !t.Redacted:
			data, err := ledger.DocDigest(t.Data) // checks that it is one document
			if err != nil {
				return nil, 0, fmt.Errorf("event %d: data: %v", t.Seq, err)
			}
			if data != "" {
				if e.Data, err = ledger.Canonicalize(t.Data); err != nil {
					return nil, 0, fmt.Errorf("event %d: data: %v", t.Seq, err)
				}
			}
		case e.Format < ledger.EventFormat:
			return nil, 0, fmt.Errorf("event %d was written before rows were bound (format 1) and the report redacted its data: "+
				"its hash covers that data, so it cannot be recomputed from the report", t.Seq)
		case len(t.RedactedData) == 0:
			return nil, 0, fmt.Errorf("event %d: the report redacted its data but gives no digests of what it hid", t.Seq)
		default:
			d, err := ledger.HiddenDocDigest(t.Data, t.RedactedData, markerCheck)
			if err != nil {
				return nil, 0, fmt.Errorf("event %d: data: %v", t.Seq, err)
			}
			e.DataDigest = d
			hidden += len(t.RedactedData)
		}
		if rows := bytes.TrimSpace(t.Rows); len(rows) > 0 && string(rows) != "null" {
			var err error
			if e.Rows, err = ledger.Canonicalize(rows); err != nil {
				return nil, 0, fmt.Errorf("event %d: rows: %v", t.Seq, err)
			}
		}
		out[i] = e
	}
	return out, hidden, nil
}

// markerCheck refuses a hidden node that shows no redaction marker: what
// a report shows in place of what it hid must say that it is hidden.
func markerCheck(pointer string, node []byte) error {
	if !markerText.Match(node) {
		return fmt.Errorf("the report says it hid the node at %q, but shows no redaction marker there", pointer)
	}
	return nil
}

// field is a row field as content holds it: the tree digest of what the
// report shows, with the digests it gives for what it hid; count adds the
// hidden nodes.
func field(hidden RedactedFields, name string, shown json.RawMessage, count *int) (ledger.Digest, error) {
	nodes := hidden[name]
	d, err := ledger.HiddenDocDigest(shown, nodes, markerCheck)
	if err != nil {
		return "", fmt.Errorf("%s: %v", name, err)
	}
	*count += len(nodes)
	return d, nil
}

// textField is field for a free-text field.
func textField(hidden RedactedFields, name string, shown *string, count *int) (ledger.Digest, error) {
	raw, _ := json.Marshal(shown) // a string always marshals
	return field(hidden, name, raw, count)
}

// contents are the contents of the rows the report shows, in the order the
// ledger checks them; hidden counts the fields it redacted.
func (r *Report) contents() ([]ledger.Content, int, error) {
	hidden := 0
	run := r.Run
	out := []ledger.Content{
		ledger.RunContent{ID: run.ID, Tenant: run.Tenant, Agent: run.Agent, State: run.State, StopReason: deref(run.StopReason),
			SubmittedBy: run.SubmittedBy, CreatedAt: run.CreatedAt, UpdatedAt: run.UpdatedAt},
	}
	b := r.Budget
	if b.Deadline == nil && b.Limits.DeadlineAfterMS != nil ||
		b.Deadline != nil && !eqPtr(b.Limits.DeadlineAfterMS, ledger.LimitOf(ledger.CeilMS(b.Deadline.Sub(run.CreatedAt)))) {
		return nil, 0, fmt.Errorf("budget: deadline_after_ms is not the deadline less the run's created_at")
	}
	out = append(out, ledger.BudgetContent{RunID: run.ID, MaxAttemptsPerAction: b.Limits.MaxAttemptsPerAction,
		MaxAttemptsPerRun: b.Limits.MaxAttemptsPerRun, MaxExecutionMS: b.Limits.MaxExecutionMS, MaxSteps: b.Limits.MaxSteps,
		MaxTokens: b.Limits.MaxTokens, Deadline: b.Deadline, Attempts: b.Used.Attempts, ExecutionMS: b.Used.ExecutionMS,
		Steps: b.Used.Steps, Tokens: b.Used.Tokens, TokensUnavailable: b.Used.TokensUnavailable})
	var attempts, approvals []ledger.Content
	for _, a := range r.Actions {
		c := ledger.ActionContent{ID: a.ID, RunID: run.ID, Seq: a.Seq, Tool: a.Tool, ToolVersion: a.ToolVersion,
			Effect: a.Effect, State: a.State, ActionDigest: a.ActionDigest, DedupKey: a.DedupKey, Supersedes: deref(a.Supersedes),
			CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt, Gate: a.Gate}
		if len(a.RedactedFields["arguments"]) == 0 {
			c.Arguments = a.Arguments
		}
		var err error
		if c.ArgumentsDigest, err = field(a.RedactedFields, "arguments", a.Arguments, &hidden); err != nil {
			return nil, 0, fmt.Errorf("action %s: %v", a.ID, err)
		}
		out = append(out, c)
		for _, at := range a.Attempts {
			c := ledger.AttemptContent{ID: at.ID, ActionID: a.ID, No: at.No, Status: at.Status, Effect: at.Effect,
				EffectObservation: deref(at.EffectObservationID), StartedAt: at.StartedAt, FinishedAt: at.FinishedAt}
			c.ResultDigest, err = field(at.RedactedFields, "result", at.Result, &hidden)
			if err == nil {
				shown, _ := json.Marshal(at.Error) // an AttemptError always marshals
				c.ErrorDigest, err = field(at.RedactedFields, "error", shown, &hidden)
			}
			if err != nil {
				return nil, 0, fmt.Errorf("attempt %s: %v", at.ID, err)
			}
			attempts = append(attempts, c)
		}
		for _, ap := range a.Approvals {
			c := ledger.ApprovalContent{ID: ap.ID, ActionID: a.ID, State: ap.State, ActionDigest: ap.ActionDigest,
				DecidedBy: strText(ap.DecidedBy), RequestedAt: ap.RequestedAt, ExpiresAt: ap.ExpiresAt, DecidedAt: ap.DecidedAt,
				ExecuteBy: ap.ExecuteBy, StaleAt: ap.StaleAt, StaleReasonDigest: ledger.TextDigest(strText(ap.StaleReason))}
			if c.ReasonDigest, err = textField(ap.RedactedFields, "reason", ap.Reason, &hidden); err != nil {
				return nil, 0, fmt.Errorf("approval %s: %v", ap.ID, err)
			}
			approvals = append(approvals, c)
		}
	}
	out = append(append(out, attempts...), approvals...)
	if cn := r.Cancellation; cn != nil {
		c := ledger.CancellationContent{ID: cn.ID, RunID: run.ID, State: cn.State, RequestedBy: cn.RequestedBy,
			RequestedAt: cn.RequestedAt, AcceptedAt: cn.AcceptedAt, StoppingAt: cn.StoppingAt, StoppedAt: cn.StoppedAt,
			TooLateAt: cn.TooLateAt}
		var err error
		if c.ReasonDigest, err = textField(cn.RedactedFields, "reason", cn.Reason, &hidden); err != nil {
			return nil, 0, fmt.Errorf("cancellation %s: %v", cn.ID, err)
		}
		out = append(out, c)
	}
	for _, o := range r.Observations {
		c := ledger.ObservationContent{ID: o.ID, ActionID: o.ActionID, AttemptID: deref(o.AttemptID), Source: o.Source,
			Effect: o.Effect, ObservedAt: o.ObservedAt}
		var err error
		if c.DetailDigest, err = field(o.RedactedFields, "detail", o.Detail, &hidden); err != nil {
			return nil, 0, fmt.Errorf("observation %s: %v", o.ID, err)
		}
		out = append(out, c)
	}
	return out, hidden, nil
}

// checkRowDigests holds each row's digest field to the digest of the
// fields it shows, which the chain has vouched for by now: a report whose
// digests were edited does not verify either. Reports of 1.0 have none.
func (r *Report) checkRowDigests(rows []ledger.Content) error {
	stated := []ledger.Digest{r.Run.Digest, r.Budget.Digest}
	var attempts, approvals []ledger.Digest
	for _, a := range r.Actions {
		stated = append(stated, a.Digest)
		for _, at := range a.Attempts {
			attempts = append(attempts, at.Digest)
		}
		for _, ap := range a.Approvals {
			approvals = append(approvals, ap.Digest)
		}
	}
	stated = append(append(stated, attempts...), approvals...)
	if r.Cancellation != nil {
		stated = append(stated, r.Cancellation.Digest)
	}
	for _, o := range r.Observations {
		stated = append(stated, o.Digest)
	}
	for i, c := range rows {
		if stated[i] != "" && stated[i] != c.Digest() {
			return fmt.Errorf("%s: the report gives it the digest %s, but the fields it shows have %s", c.Key(), stated[i], c.Digest())
		}
	}
	return nil
}

// checkDecisions holds each recovery decision to the event it was lifted
// from: the same event, action, actor and time, and the decision,
// rationale, attempt and facts the event's data (as the report shows it)
// holds.
func (r *Report) checkDecisions() error {
	bySeq := make(map[int64]*TimelineEvent, len(r.Timeline))
	for i := range r.Timeline {
		bySeq[r.Timeline[i].Seq] = &r.Timeline[i]
	}
	lifted := 0
	for _, e := range r.Timeline {
		if e.Type == DecisionEventType {
			lifted++
		}
	}
	if lifted != len(r.RecoveryDecisions) {
		return fmt.Errorf("the timeline holds %d recovery decisions, but the report lists %d", lifted, len(r.RecoveryDecisions))
	}
	for _, d := range r.RecoveryDecisions {
		e := bySeq[d.Seq]
		switch {
		case e == nil || e.Type != DecisionEventType:
			return fmt.Errorf("recovery decision %d: event %d is not a recovery decision", d.Seq, d.Seq)
		case e.ID != d.EventID || ledger.ActionID(e.EntityID) != d.ActionID || strText(e.Actor) != d.Actor || !e.CreatedAt.Equal(d.DecidedAt):
			return fmt.Errorf("recovery decision %d differs from its event's id, action, actor or time", d.Seq)
		}
		var data map[string]json.RawMessage
		if err := json.Unmarshal(e.Data, &data); err != nil {
			return fmt.Errorf("recovery decision %d: its event's data is not an object", d.Seq)
		}
		var dd decisionData
		if err := json.Unmarshal(e.Data, &dd); err != nil {
			return fmt.Errorf("recovery decision %d: its event's data is malformed", d.Seq)
		}
		delete(data, "decision")
		delete(data, "rationale")
		delete(data, "attempt_id")
		facts, err := json.Marshal(data)
		if err != nil {
			return fmt.Errorf("recovery decision %d: %v", d.Seq, err)
		}
		want, err1 := ledger.DocDigest(facts)
		got, err2 := ledger.DocDigest(d.Facts)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("recovery decision %d: facts: %v", d.Seq, err)
		}
		if dd.Decision != d.Decision || dd.Rationale != d.Rationale || dd.AttemptID != deref(d.AttemptID) || want != got {
			return fmt.Errorf("recovery decision %d differs from the data of its event", d.Seq)
		}
	}
	return nil
}

// headSignature is the report's signature as the ledger's.
func (r *Report) headSignature() (*ledger.HeadSignature, error) {
	s := r.Signature
	if s == nil {
		return nil, nil
	}
	if s.Algorithm != SignatureAlgorithm {
		return nil, fmt.Errorf("the head is signed with %q, not %s", s.Algorithm, SignatureAlgorithm)
	}
	sig, err := base64.StdEncoding.DecodeString(s.Signature)
	if err != nil {
		return nil, fmt.Errorf("the head signature is not base64: %v", err)
	}
	return &ledger.HeadSignature{RunID: r.Run.ID, Seq: s.Seq, Hash: s.Hash, SignedAt: s.SignedAt, KeyID: s.KeyID, Signature: sig}, nil
}

// deref is the value of an optional id or reason; "" for none.
func deref[T ~string](p *T) T {
	if p == nil {
		return ""
	}
	return *p
}

func eqPtr(a, b *int64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

// checkRuleSets checks the rule sets of the report by their digests, that
// each is cited by a gate of the report, and that each action's deciding_rule
// is the rule its gate names in the rule set it cites. The gates are
// checked already: they are part of the actions' content, which the chain
// binds.
func (r *Report) checkRuleSets() error {
	for i, rs := range r.RuleSets {
		got, err := ledger.DigestJSON(rs.Document)
		if err != nil {
			return fmt.Errorf("rule set %s: %w", rs.Digest, err)
		}
		if got != rs.Digest {
			return fmt.Errorf("rule set %s: its document has digest %s: it is not the rule set the gates cite", rs.Digest, got)
		}
		if slices.ContainsFunc(r.RuleSets[:i], func(o RuleSet) bool { return o.Digest == rs.Digest }) {
			return fmt.Errorf("rule set %s is in the report twice", rs.Digest)
		}
		if !slices.ContainsFunc(r.Actions, func(a Action) bool { return a.Gate != nil && a.Gate.RulesDigest == rs.Digest }) {
			return fmt.Errorf("rule set %s: no action's gate cites it", rs.Digest)
		}
	}
	for i := range r.Actions {
		a := &r.Actions[i]
		want, err := r.gateRule(a)
		if err != nil {
			return err
		}
		if !sameJSON(want, a.DecidingRule) {
			return fmt.Errorf("action %s: its deciding_rule is not rule %s of the rule set its gate cites", a.ID, ruleIndex(a.Gate))
		}
	}
	return nil
}

// sameJSON reports whether a and b are the same JSON value (nil and null
// alike); a document that is not JSON is the same as nothing.
func sameJSON(a, b json.RawMessage) bool {
	ca, erra := canonicalOrNull(a)
	cb, errb := canonicalOrNull(b)
	return erra == nil && errb == nil && bytes.Equal(ca, cb)
}

func canonicalOrNull(m json.RawMessage) ([]byte, error) {
	if len(m) == 0 {
		return []byte("null"), nil
	}
	return ledger.Canonicalize(m)
}

// ruleIndex is the index of the rule a gate names, in words.
func ruleIndex(g *ledger.GateContent) string {
	if g == nil || g.Rule == nil {
		return "(none: no rule decided)"
	}
	return strconv.FormatInt(*g.Rule, 10)
}
