package evidence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
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
			"created_at": timeValue(r.Run.CreatedAt), "updated_at": timeValue(r.Run.UpdatedAt),
		},
		"budget":    r.Budget.value(),
		"chain":     r.Chain.value(),
		"redaction": map[string]any{"algorithm": text(r.Redaction.Algorithm), "key_id": text(r.Redaction.KeyID)},
	}
	if c := r.Cancellation; c != nil {
		v["cancellation"] = map[string]any{
			"id": text(c.ID), "state": text(c.State), "requested_by": text(c.RequestedBy), "reason": strPtrValue(c.Reason),
			"requested_at": timeValue(c.RequestedAt), "accepted_at": timePtrValue(c.AcceptedAt),
			"stopping_at": timePtrValue(c.StoppingAt), "stopped_at": timePtrValue(c.StoppedAt),
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
	return v, nil
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
	return map[string]any{
		"id": text(a.ID), "seq": intValue(a.Seq), "tool": text(a.Tool), "tool_version": text(a.ToolVersion),
		"effect": text(a.Effect), "state": text(a.State), "action_digest": text(a.ActionDigest),
		"dedup_key": text(a.DedupKey), "supersedes": strPtrValue(a.Supersedes), "arguments": args,
		"created_at": timeValue(a.CreatedAt), "updated_at": timeValue(a.UpdatedAt),
		"attempts": attempts, "approvals": approvals,
	}, nil
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
	}, nil
}

func (a *Approval) value() (any, error) {
	return map[string]any{
		"id": text(a.ID), "state": text(a.State), "action_digest": text(a.ActionDigest),
		"decided_by": strPtrValue(a.DecidedBy), "reason": strPtrValue(a.Reason), "requested_at": timeValue(a.RequestedAt),
		"expires_at": timePtrValue(a.ExpiresAt), "decided_at": timePtrValue(a.DecidedAt),
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
	}, nil
}

func (e *TimelineEvent) value() (any, error) {
	data, err := rawValue(e.Data)
	if err != nil {
		return nil, fmt.Errorf("event %d data: %w", e.Seq, err)
	}
	return map[string]any{
		"seq": intValue(e.Seq), "id": text(e.ID), "type": text(e.Type), "entity_type": text(e.EntityType), "entity_id": text(e.EntityID),
		"from_state": strPtrValue(e.FromState), "to_state": strPtrValue(e.ToState), "actor": strPtrValue(e.Actor),
		"data": data, "redacted": e.Redacted, "created_at": timeValue(e.CreatedAt), "hash": text(e.Hash), "prev_hash": text(e.PrevHash),
	}, nil
}

func (c *Chain) value() map[string]any {
	return map[string]any{
		"ok": c.OK, "events": intValue(int64(c.Events)), "broken_seq": intPtrValue(c.BrokenSeq), "reason": strPtrValue(c.Reason),
	}
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
