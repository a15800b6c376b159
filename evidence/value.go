package evidence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/actionledger/ledger/ledger"
)

// value is the report as its JSON text decodes (encoding/json into an any,
// with UseNumber): objects are map[string]any, arrays []any, numbers
// json.Number. JSON validates it instead of decoding the text it has just
// encoded, which cost as much as encoding it. It mirrors the types' JSON
// field for field; TestValueIsDecodedJSON holds it to the text, and a field
// it left out would fail the schema, which requires every field.
func (r *Report) value() (map[string]any, error) {
	v := map[string]any{
		"schema_version": text(r.SchemaVersion),
		"generated_at":   timeValue(r.GeneratedAt),
		"run": map[string]any{
			"id": text(r.Run.ID), "tenant": text(r.Run.Tenant), "agent": text(r.Run.Agent), "state": text(r.Run.State),
			"stop_reason": strPtrValue(r.Run.StopReason), "submitted_by": text(r.Run.SubmittedBy),
			"created_at": timeValue(r.Run.CreatedAt), "updated_at": timeValue(r.Run.UpdatedAt), "digest": text(r.Run.Digest),
		},
		"budget":    r.Budget.value(),
		"chain":     r.Chain.value(),
		"redaction": map[string]any{"algorithm": text(r.Redaction.Algorithm), "key_id": text(r.Redaction.KeyID)},
		"signature": nil,
	}
	if s := r.Signature; s != nil {
		v["signature"] = map[string]any{
			"algorithm": text(s.Algorithm), "key_id": text(s.KeyID), "seq": intValue(s.Seq), "hash": text(s.Hash),
			"signed_at": timeValue(s.SignedAt), "signature": text(s.Signature),
		}
	}
	if c := r.Cancellation; c != nil {
		v["cancellation"] = map[string]any{
			"id": text(c.ID), "state": text(c.State), "requested_by": text(c.RequestedBy), "reason": strPtrValue(c.Reason),
			"requested_at": timeValue(c.RequestedAt), "accepted_at": timePtrValue(c.AcceptedAt),
			"stopping_at": timePtrValue(c.StoppingAt), "stopped_at": timePtrValue(c.StoppedAt),
			"too_late_at": timePtrValue(c.TooLateAt),
			"digest":      text(c.Digest), "redacted_fields": c.RedactedFields.value(),
		}
	} else {
		v["cancellation"] = nil
	}
	var err error
	if v["actions"], err = listValue(r.Actions, (*Action).value); err != nil {
		return nil, err
	}
	if v["recovery_decisions"], err = listValue(r.RecoveryDecisions, (*RecoveryDecision).value); err != nil {
		return nil, err
	}
	if v["observations"], err = listValue(r.Observations, (*Observation).value); err != nil {
		return nil, err
	}
	if v["timeline"], err = listValue(r.Timeline, (*TimelineEvent).value); err != nil {
		return nil, err
	}
	if v["rule_sets"], err = listValue(r.RuleSets, (*RuleSet).value); err != nil {
		return nil, err
	}
	return v, nil
}

func (rs *RuleSet) value() (any, error) {
	doc, err := rawValue(rs.Document)
	if err != nil {
		return nil, fmt.Errorf("rule set %s: %w", rs.Digest, err)
	}
	return map[string]any{"digest": text(rs.Digest), "document": doc}, nil
}

func (a *Action) value() (any, error) {
	args, err := rawValue(a.Arguments)
	if err != nil {
		return nil, fmt.Errorf("action %s arguments: %w", a.ID, err)
	}
	attempts, err := listValue(a.Attempts, (*Attempt).value)
	if err != nil {
		return nil, err
	}
	approvals, err := listValue(a.Approvals, (*Approval).value)
	if err != nil {
		return nil, err
	}
	rule, err := rawValue(a.DecidingRule)
	if err != nil {
		return nil, fmt.Errorf("action %s deciding_rule: %w", a.ID, err)
	}
	return map[string]any{
		"id": text(a.ID), "seq": intValue(a.Seq), "tool": text(a.Tool), "tool_version": text(a.ToolVersion),
		"effect": text(a.Effect), "state": text(a.State), "action_digest": text(a.ActionDigest),
		"dedup_key": text(a.DedupKey), "supersedes": strPtrValue(a.Supersedes), "arguments": args,
		"created_at": timeValue(a.CreatedAt), "updated_at": timeValue(a.UpdatedAt),
		"attempts": attempts, "approvals": approvals, "digest": text(a.Digest), "redacted_fields": a.RedactedFields.value(),
		"gate": gateValue(a.Gate), "deciding_rule": rule,
	}, nil
}

func gateValue(g *ledger.GateContent) any {
	if g == nil {
		return nil
	}
	return map[string]any{"decision": text(g.Decision), "rule": intPtrValue(g.Rule), "reason": text(g.Reason),
		"rules_digest": text(g.RulesDigest)}
}

func (a *Attempt) value() (any, error) {
	result, err := rawValue(a.Result)
	if err != nil {
		return nil, fmt.Errorf("attempt %s result: %w", a.ID, err)
	}
	var attErr any
	if a.Error != nil {
		attErr = map[string]any{"code": text(a.Error.Code), "message": text(a.Error.Message)}
	}
	return map[string]any{
		"id": text(a.ID), "attempt_no": intValue(a.No), "status": text(a.Status), "effect": text(a.Effect),
		"effect_observation_id": strPtrValue(a.EffectObservationID), "result": result, "error": attErr,
		"started_at": timeValue(a.StartedAt), "finished_at": timePtrValue(a.FinishedAt),
		"digest": text(a.Digest), "redacted_fields": a.RedactedFields.value(),
	}, nil
}

func (a *Approval) value() (any, error) {
	return map[string]any{
		"id": text(a.ID), "state": text(a.State), "action_digest": text(a.ActionDigest),
		"decided_by": strPtrValue(a.DecidedBy), "reason": strPtrValue(a.Reason), "requested_at": timeValue(a.RequestedAt),
		"expires_at": timePtrValue(a.ExpiresAt), "decided_at": timePtrValue(a.DecidedAt),
		"execute_by": timePtrValue(a.ExecuteBy), "stale_at": timePtrValue(a.StaleAt), "stale_reason": strPtrValue(a.StaleReason),
		"digest": text(a.Digest), "redacted_fields": a.RedactedFields.value(),
	}, nil
}

func (b *Budget) value() map[string]any {
	l, u := b.Limits, b.Used
	return map[string]any{
		"limits": map[string]any{
			"max_attempts_per_action": intPtrValue(l.MaxAttemptsPerAction), "max_attempts_per_run": intPtrValue(l.MaxAttemptsPerRun),
			"max_execution_ms": intPtrValue(l.MaxExecutionMS), "max_steps": intPtrValue(l.MaxSteps),
			"max_tokens": intPtrValue(l.MaxTokens), "deadline_after_ms": intPtrValue(l.DeadlineAfterMS),
		},
		"deadline": timePtrValue(b.Deadline),
		"used": map[string]any{
			"attempts": intValue(u.Attempts), "execution_ms": intValue(u.ExecutionMS), "steps": intValue(u.Steps),
			"tokens": intValue(u.Tokens), "tokens_unavailable": u.TokensUnavailable,
		},
		"digest": text(b.Digest),
	}
}

func (d *RecoveryDecision) value() (any, error) {
	facts, err := rawValue(d.Facts)
	if err != nil {
		return nil, fmt.Errorf("recovery decision %d facts: %w", d.Seq, err)
	}
	return map[string]any{
		"seq": intValue(d.Seq), "event_id": text(d.EventID), "action_id": text(d.ActionID),
		"attempt_id": strPtrValue(d.AttemptID), "decision": text(d.Decision), "rationale": text(d.Rationale), "facts": facts,
		"actor": text(d.Actor), "decided_at": timeValue(d.DecidedAt),
	}, nil
}

func (o *Observation) value() (any, error) {
	detail, err := rawValue(o.Detail)
	if err != nil {
		return nil, fmt.Errorf("observation %s detail: %w", o.ID, err)
	}
	return map[string]any{
		"id": text(o.ID), "action_id": text(o.ActionID), "attempt_id": strPtrValue(o.AttemptID),
		"source": text(o.Source), "effect": text(o.Effect), "detail": detail, "observed_at": timeValue(o.ObservedAt),
		"digest": text(o.Digest), "redacted_fields": o.RedactedFields.value(),
	}, nil
}

func (e *TimelineEvent) value() (any, error) {
	data, err := rawValue(e.Data)
	if err != nil {
		return nil, fmt.Errorf("event %d data: %w", e.Seq, err)
	}
	rows, err := rawValue(e.Rows)
	if err != nil {
		return nil, fmt.Errorf("event %d rows: %w", e.Seq, err)
	}
	return map[string]any{
		"seq": intValue(e.Seq), "id": text(e.ID), "type": text(e.Type), "entity_type": text(e.EntityType), "entity_id": text(e.EntityID),
		"from_state": strPtrValue(e.FromState), "to_state": strPtrValue(e.ToState), "actor": strPtrValue(e.Actor),
		"data": data, "redacted": e.Redacted, "created_at": timeValue(e.CreatedAt), "hash": text(e.Hash), "prev_hash": text(e.PrevHash),
		"format": intValue(int64(e.Format)), "rows": rows, "redacted_data": e.RedactedData.value(),
	}, nil
}

func (c *Chain) value() map[string]any {
	return map[string]any{
		"ok": c.OK, "events": intValue(int64(c.Events)), "broken_seq": intPtrValue(c.BrokenSeq), "reason": strPtrValue(c.Reason),
		"rows": intValue(int64(c.Rows)), "unbound_rows": intValue(int64(c.UnboundRows)),
	}
}

// value is the fields' value: an object, null for a nil map as
// encoding/json writes it.
func (f RedactedFields) value() any {
	if f == nil {
		return nil
	}
	m := make(map[string]any, len(f))
	for k, h := range f {
		m[text(k).(string)] = h.value()
	}
	return m
}

// value is the nodes' value: an object, null for a nil map.
func (h Hidden) value() any {
	if h == nil {
		return nil
	}
	m := make(map[string]any, len(h))
	for p, d := range h {
		m[text(p).(string)] = text(d)
	}
	return m
}

// listValue is a list's value: nil (JSON null) for a nil slice, as
// encoding/json writes it.
func listValue[T any](list []T, value func(*T) (any, error)) (any, error) {
	if list == nil {
		return nil, nil
	}
	out := make([]any, len(list))
	for i := range list {
		v, err := value(&list[i])
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// timeValue is a time as time.Time's MarshalJSON writes it.
func timeValue(t time.Time) any { return t.Format(time.RFC3339Nano) }

func timePtrValue(t *time.Time) any {
	if t == nil {
		return nil
	}
	return timeValue(*t)
}

func intValue(n int64) any { return json.Number(strconv.FormatInt(n, 10)) }

func intPtrValue(n *int64) any {
	if n == nil {
		return nil
	}
	return intValue(*n)
}

func strPtrValue[T ~string](s *T) any {
	if s == nil {
		return nil
	}
	return text(*s)
}

// text is a string as its JSON text decodes: encoding/json writes each
// byte of invalid UTF-8 as \ufffd.
func text[T ~string](s T) any {
	if utf8.ValidString(string(s)) {
		return string(s)
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(string(s[i:]))
		if r == utf8.RuneError && size == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return string(b)
}

// rawValue decodes an embedded document; absent is JSON null, as
// json.RawMessage writes a nil message.
func rawValue(doc json.RawMessage) (any, error) {
	if len(doc) == 0 {
		return nil, nil
	}
	if v, ok := flatValue(doc); ok {
		return v, nil
	}
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("data after the document")
	}
	return v, nil
}

// flatValue decodes doc when it is one compact JSON object whose members
// are strings of printable ASCII without escapes, numbers, true, false or
// null, which is what nearly every event's data is, and reports whether it
// did. The value is what encoding/json decodes with UseNumber (a repeated
// name keeps its last value, as there); anything else (white space,
// escapes, other bytes, nesting, a malformed document) is left to the
// decoder, which also words the errors. It spares each event a Decoder, its
// buffer and its reflection. TestFlatValueIsDecoded holds it to the
// decoder.
func flatValue(doc []byte) (map[string]any, bool) {
	if len(doc) < 2 || doc[0] != '{' {
		return nil, false
	}
	m := make(map[string]any)
	if len(doc) == 2 && doc[1] == '}' {
		return m, true
	}
	i := 1
	for {
		k, next, ok := flatString(doc, i)
		if !ok || next >= len(doc) || doc[next] != ':' {
			return nil, false
		}
		i = next + 1
		if i >= len(doc) {
			return nil, false
		}
		var v any
		switch c := doc[i]; {
		case c == '"':
			v, i, ok = flatString(doc, i)
		case c == 't' && bytes.HasPrefix(doc[i:], []byte("true")):
			v, i, ok = true, i+4, true
		case c == 'f' && bytes.HasPrefix(doc[i:], []byte("false")):
			v, i, ok = false, i+5, true
		case c == 'n' && bytes.HasPrefix(doc[i:], []byte("null")):
			v, i, ok = nil, i+4, true
		default:
			var end int
			if end, ok = numberEnd(doc, i); ok {
				v, i = json.Number(doc[i:end]), end
			}
		}
		if !ok || i >= len(doc) {
			return nil, false
		}
		m[k] = v
		switch doc[i] {
		case ',':
			i++
		case '}':
			return m, i == len(doc)-1
		default:
			return nil, false
		}
	}
}

// flatString reads the string that starts at doc[i] when it holds only
// printable ASCII other than quote and backslash, and returns it with the
// index after its closing quote.
func flatString(doc []byte, i int) (string, int, bool) {
	if i >= len(doc) || doc[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(doc); j++ {
		switch c := doc[j]; {
		case c == '"':
			return string(doc[i+1 : j]), j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", 0, false
		}
	}
	return "", 0, false
}

// numberEnd returns the index after the JSON number that starts at doc[i]:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func numberEnd(doc []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(doc) && doc[i] >= '0' && doc[i] <= '9' {
			i++
		}
		return i
	}
	if i < len(doc) && doc[i] == '-' {
		i++
	}
	switch {
	case i < len(doc) && doc[i] == '0':
		i++
	case i < len(doc) && doc[i] >= '1' && doc[i] <= '9':
		i = digits(i + 1)
	default:
		return 0, false
	}
	if i < len(doc) && doc[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(doc) && (doc[i] == 'e' || doc[i] == 'E') {
		i++
		if i < len(doc) && (doc[i] == '+' || doc[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}
