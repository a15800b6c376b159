package evidence

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// marshal is the report's JSON text: two-space indents, no HTML escaping
// (the text is shown as recorded; the HTML renderer escapes for itself),
// and a final newline. It is written directly, field by field, byte for
// byte what encoding/json's Encoder writes with SetEscapeHTML(false) and
// SetIndent("", "  "), without its reflection and without encoding the
// report compact first and indenting that again: a report is mostly its
// timeline, and ten thousand events made both passes a large part of an
// export. TestMarshalIsEncodingJSON holds it to encoding/json.
func (r *Report) marshal() ([]byte, error) {
	w := jsonWriter{b: bytes.NewBuffer(make([]byte, 0, 4096+700*len(r.Timeline)))}
	w.report(r)
	if w.err != nil {
		return nil, fmt.Errorf("evidence: encode report: %w", w.err)
	}
	w.b.WriteByte('\n')
	return w.b.Bytes(), nil
}

// jsonWriter writes indented JSON. open tracks, per object or array being
// written, whether it has had a member yet.
type jsonWriter struct {
	b    *bytes.Buffer
	open []bool
	err  error
}

// indents is the indentation of the depths a report reaches.
const indents = "                                                                "

func (w *jsonWriter) newline(depth int) {
	w.b.WriteByte('\n')
	w.b.WriteString(indent(depth))
}

// indent is depth levels of two spaces.
func indent(depth int) string {
	if depth*2 <= len(indents) {
		return indents[:depth*2]
	}
	return strings.Repeat("  ", depth)
}

func (w *jsonWriter) begin(c byte) {
	w.b.WriteByte(c)
	w.open = append(w.open, false)
}

// member starts the next member of the innermost object or array.
func (w *jsonWriter) member() {
	n := len(w.open)
	if w.open[n-1] {
		w.b.WriteByte(',')
	}
	w.open[n-1] = true
	w.newline(n)
}

// key starts the member name of the innermost object; names are plain
// ASCII, written as they are.
func (w *jsonWriter) key(name string) {
	w.member()
	w.b.WriteByte('"')
	w.b.WriteString(name)
	w.b.WriteString(`": `)
}

// end closes the innermost object or array: "{}" and "[]" when empty.
func (w *jsonWriter) end(c byte) {
	n := len(w.open)
	if w.open[n-1] {
		w.newline(n - 1)
	}
	w.open = w.open[:n-1]
	w.b.WriteByte(c)
}

func (w *jsonWriter) null() { w.b.WriteString("null") }

func (w *jsonWriter) bool(v bool) { w.b.WriteString(strconv.FormatBool(v)) }

func (w *jsonWriter) int(v int64) {
	var buf [20]byte
	w.b.Write(strconv.AppendInt(buf[:0], v, 10))
}

func (w *jsonWriter) intPtr(v *int64) {
	if v == nil {
		w.null()
		return
	}
	w.int(*v)
}

func (w *jsonWriter) time(t time.Time) {
	b, err := t.MarshalJSON()
	if err != nil {
		w.fail(err)
		return
	}
	w.b.Write(b)
}

func (w *jsonWriter) timePtr(t *time.Time) {
	if t == nil {
		w.null()
		return
	}
	w.time(*t)
}

func (w *jsonWriter) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

// raw writes an embedded document indented at the current depth, as
// encoding/json writes a json.RawMessage: nil is null, anything else must
// be JSON, compacted and indented again.
func (w *jsonWriter) raw(doc json.RawMessage) {
	if doc == nil {
		w.null()
		return
	}
	doc = bytes.TrimRight(doc, " \t\r\n") // json.Indent keeps trailing space; compacting drops it
	if err := json.Indent(w.b, doc, indent(len(w.open)), "  "); err != nil {
		w.fail(err)
	}
}

// string writes s quoted as encoding/json does without HTML escaping:
// quote, backslash and control characters escaped (\b \f \n \r \t, else
// \u00xx), U+2028 and U+2029 escaped, invalid UTF-8 as \ufffd.
func (w *jsonWriter) string(s string) {
	const hex = "0123456789abcdef"
	b := w.b
	b.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b.WriteString(s[start:i])
			switch c {
			case '"', '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			case '\b':
				b.WriteString(`\b`)
			case '\f':
				b.WriteString(`\f`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case '\t':
				b.WriteString(`\t`)
			default:
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(s[start:i])
			b.WriteString(`\ufffd`)
		case r == '\u2028' || r == '\u2029':
			b.WriteString(s[start:i])
			b.WriteString(`\u202`)
			b.WriteByte(hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}

func strPtr[T ~string](w *jsonWriter, s *T) {
	if s == nil {
		w.null()
		return
	}
	w.string(string(*s))
}

// list writes a JSON array of list's items: null for a nil slice, as
// encoding/json writes it.
func list[T any](w *jsonWriter, items []T, item func(*T)) {
	if items == nil {
		w.null()
		return
	}
	w.begin('[')
	for i := range items {
		w.member()
		item(&items[i])
	}
	w.end(']')
}

func (w *jsonWriter) report(r *Report) {
	w.begin('{')
	w.key("schema_version")
	w.string(r.SchemaVersion)
	w.key("generated_at")
	w.time(r.GeneratedAt)
	w.key("run")
	w.run(&r.Run)
	w.key("actions")
	list(w, r.Actions, w.action)
	w.key("cancellation")
	w.cancellation(r.Cancellation)
	w.key("budget")
	w.budget(&r.Budget)
	w.key("recovery_decisions")
	list(w, r.RecoveryDecisions, w.decision)
	w.key("observations")
	list(w, r.Observations, w.observation)
	w.key("timeline")
	list(w, r.Timeline, w.event)
	w.key("chain")
	w.chain(&r.Chain)
	w.key("redaction")
	w.begin('{')
	w.key("algorithm")
	w.string(r.Redaction.Algorithm)
	w.key("key_id")
	w.string(r.Redaction.KeyID)
	w.end('}')
	w.end('}')
}

func (w *jsonWriter) run(r *RunSummary) {
	w.begin('{')
	w.key("id")
	w.string(string(r.ID))
	w.key("tenant")
	w.string(r.Tenant)
	w.key("agent")
	w.string(r.Agent)
	w.key("state")
	w.string(string(r.State))
	w.key("stop_reason")
	strPtr(w, r.StopReason)
	w.key("submitted_by")
	w.string(r.SubmittedBy)
	w.key("created_at")
	w.time(r.CreatedAt)
	w.key("updated_at")
	w.time(r.UpdatedAt)
	w.end('}')
}

func (w *jsonWriter) action(a *Action) {
	w.begin('{')
	w.key("id")
	w.string(string(a.ID))
	w.key("seq")
	w.int(a.Seq)
	w.key("tool")
	w.string(a.Tool)
	w.key("tool_version")
	w.string(a.ToolVersion)
	w.key("effect")
	w.string(string(a.Effect))
	w.key("state")
	w.string(string(a.State))
	w.key("action_digest")
	w.string(string(a.ActionDigest))
	w.key("dedup_key")
	w.string(a.DedupKey)
	w.key("supersedes")
	strPtr(w, a.Supersedes)
	w.key("arguments")
	w.raw(a.Arguments)
	w.key("created_at")
	w.time(a.CreatedAt)
	w.key("updated_at")
	w.time(a.UpdatedAt)
	w.key("attempts")
	list(w, a.Attempts, w.attempt)
	w.key("approvals")
	list(w, a.Approvals, w.approval)
	w.end('}')
}

func (w *jsonWriter) attempt(a *Attempt) {
	w.begin('{')
	w.key("id")
	w.string(string(a.ID))
	w.key("attempt_no")
	w.int(a.No)
	w.key("status")
	w.string(string(a.Status))
	w.key("effect")
	w.string(string(a.Effect))
	w.key("effect_observation_id")
	strPtr(w, a.EffectObservationID)
	w.key("result")
	w.raw(a.Result)
	w.key("error")
	if a.Error == nil {
		w.null()
	} else {
		w.begin('{')
		w.key("code")
		w.string(a.Error.Code)
		w.key("message")
		w.string(a.Error.Message)
		w.end('}')
	}
	w.key("started_at")
	w.time(a.StartedAt)
	w.key("finished_at")
	w.timePtr(a.FinishedAt)
	w.end('}')
}

func (w *jsonWriter) approval(a *Approval) {
	w.begin('{')
	w.key("id")
	w.string(string(a.ID))
	w.key("state")
	w.string(string(a.State))
	w.key("action_digest")
	w.string(string(a.ActionDigest))
	w.key("decided_by")
	strPtr(w, a.DecidedBy)
	w.key("reason")
	strPtr(w, a.Reason)
	w.key("requested_at")
	w.time(a.RequestedAt)
	w.key("expires_at")
	w.timePtr(a.ExpiresAt)
	w.key("decided_at")
	w.timePtr(a.DecidedAt)
	w.end('}')
}

func (w *jsonWriter) cancellation(c *Cancellation) {
	if c == nil {
		w.null()
		return
	}
	w.begin('{')
	w.key("id")
	w.string(string(c.ID))
	w.key("state")
	w.string(string(c.State))
	w.key("requested_by")
	w.string(c.RequestedBy)
	w.key("reason")
	strPtr(w, c.Reason)
	w.key("requested_at")
	w.time(c.RequestedAt)
	w.key("accepted_at")
	w.timePtr(c.AcceptedAt)
	w.key("stopping_at")
	w.timePtr(c.StoppingAt)
	w.key("stopped_at")
	w.timePtr(c.StoppedAt)
	w.end('}')
}

func (w *jsonWriter) budget(b *Budget) {
	w.begin('{')
	w.key("limits")
	w.begin('{')
	w.key("max_attempts_per_action")
	w.intPtr(b.Limits.MaxAttemptsPerAction)
	w.key("max_attempts_per_run")
	w.intPtr(b.Limits.MaxAttemptsPerRun)
	w.key("max_execution_ms")
	w.intPtr(b.Limits.MaxExecutionMS)
	w.key("max_steps")
	w.intPtr(b.Limits.MaxSteps)
	w.key("max_tokens")
	w.intPtr(b.Limits.MaxTokens)
	w.key("deadline_after_ms")
	w.intPtr(b.Limits.DeadlineAfterMS)
	w.end('}')
	w.key("deadline")
	w.timePtr(b.Deadline)
	w.key("used")
	w.begin('{')
	w.key("attempts")
	w.int(b.Used.Attempts)
	w.key("execution_ms")
	w.int(b.Used.ExecutionMS)
	w.key("steps")
	w.int(b.Used.Steps)
	w.key("tokens")
	w.int(b.Used.Tokens)
	w.key("tokens_unavailable")
	w.bool(b.Used.TokensUnavailable)
	w.end('}')
	w.end('}')
}

func (w *jsonWriter) decision(d *RecoveryDecision) {
	w.begin('{')
	w.key("seq")
	w.int(d.Seq)
	w.key("event_id")
	w.string(string(d.EventID))
	w.key("action_id")
	w.string(string(d.ActionID))
	w.key("attempt_id")
	strPtr(w, d.AttemptID)
	w.key("decision")
	w.string(d.Decision)
	w.key("rationale")
	w.string(d.Rationale)
	w.key("facts")
	w.raw(d.Facts)
	w.key("actor")
	w.string(d.Actor)
	w.key("decided_at")
	w.time(d.DecidedAt)
	w.end('}')
}

func (w *jsonWriter) observation(o *Observation) {
	w.begin('{')
	w.key("id")
	w.string(string(o.ID))
	w.key("action_id")
	w.string(string(o.ActionID))
	w.key("attempt_id")
	strPtr(w, o.AttemptID)
	w.key("source")
	w.string(string(o.Source))
	w.key("effect")
	w.string(string(o.Effect))
	w.key("detail")
	w.raw(o.Detail)
	w.key("observed_at")
	w.time(o.ObservedAt)
	w.end('}')
}

func (w *jsonWriter) event(e *TimelineEvent) {
	w.begin('{')
	w.key("seq")
	w.int(e.Seq)
	w.key("id")
	w.string(string(e.ID))
	w.key("type")
	w.string(e.Type)
	w.key("entity_type")
	w.string(e.EntityType)
	w.key("entity_id")
	w.string(e.EntityID)
	w.key("from_state")
	strPtr(w, e.FromState)
	w.key("to_state")
	strPtr(w, e.ToState)
	w.key("actor")
	strPtr(w, e.Actor)
	w.key("data")
	w.raw(e.Data)
	w.key("redacted")
	w.bool(e.Redacted)
	w.key("created_at")
	w.time(e.CreatedAt)
	w.key("hash")
	w.string(e.Hash)
	w.key("prev_hash")
	w.string(e.PrevHash)
	w.end('}')
}

func (w *jsonWriter) chain(c *Chain) {
	w.begin('{')
	w.key("ok")
	w.bool(c.OK)
	w.key("events")
	w.int(int64(c.Events))
	w.key("broken_seq")
	w.intPtr(c.BrokenSeq)
	w.key("reason")
	strPtr(w, c.Reason)
	w.end('}')
}
