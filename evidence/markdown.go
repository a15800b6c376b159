package evidence

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Markdown writes the report as a Markdown document (CommonMark with GitHub
// tables): summary, actions with their arguments, attempts and approvals,
// cancellation, budget, recovery decisions, observations, timeline and the
// chain verdict. Every recorded value is escaped or fenced, so nothing a
// tool or a model wrote can add markup, links or HTML to the page. The
// document is built in memory and written at once.
func (r *Report) Markdown(w io.Writer) error {
	var m mdWriter
	m.report(r)
	if _, err := w.Write(m.b.Bytes()); err != nil {
		return fmt.Errorf("evidence: write report: %w", err)
	}
	return nil
}

type mdWriter struct{ b bytes.Buffer }

func (m *mdWriter) p(format string, args ...any) { fmt.Fprintf(&m.b, format, args...) }

// mdText escapes a recorded value for running text or a table cell:
// CommonMark lets any ASCII punctuation be backslash-escaped, and these are
// the characters that could start markup, a link, raw HTML or an entity, or
// end a table cell.
func mdText(s string) string {
	if s == "" {
		return "—"
	}
	var b strings.Builder
	for _, c := range oneLine(s) {
		if strings.ContainsRune("\\`*_[]<>|#!&~", c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// mdCode is a recorded value as an inline code span safe in a table cell:
// the fence is longer than any run of backticks inside, and "|" is escaped,
// which GitHub tables require even inside code.
func mdCode(s string) string {
	if s == "" {
		return "—"
	}
	s = oneLine(s)
	fence := strings.Repeat("`", longestRun(s, '`')+1)
	pad := ""
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") || strings.HasPrefix(s, " ") {
		pad = " "
	}
	return fence + pad + strings.ReplaceAll(s, "|", `\|`) + pad + fence
}

// codeBlock writes a fenced block whose fence no line of s can close.
func (m *mdWriter) codeBlock(lang, s string) {
	fence := strings.Repeat("`", max(3, longestRun(s, '`')+1))
	m.p("%s%s\n%s\n%s\n\n", fence, lang, s, fence)
}

func longestRun(s string, c rune) int {
	longest, cur := 0, 0
	for _, r := range s {
		if r == c {
			cur++
			longest = max(longest, cur)
		} else {
			cur = 0
		}
	}
	return longest
}

// row writes one table row of already escaped cells.
func (m *mdWriter) row(cells ...string) {
	m.p("| %s |\n", strings.Join(cells, " | "))
}

func (m *mdWriter) header(cells ...string) {
	m.row(cells...)
	seps := make([]string, len(cells))
	for i := range seps {
		seps[i] = "---"
	}
	m.row(seps...)
}

func (m *mdWriter) report(r *Report) {
	m.p("# Evidence report: run %s\n\n", mdCode(string(r.Run.ID)))
	m.p("Generated %s from the ledger. Schema version %s. Secrets are shown as `[redacted:<8 hex>]` "+
		"(%s, key id %s): equal markers mean equal secrets.\n\n",
		mdText(timeText(r.GeneratedAt)), mdText(r.SchemaVersion), mdText(r.Redaction.Algorithm), mdCode(r.Redaction.KeyID))

	m.p("## Summary\n\n")
	m.header("Fact", "Value")
	m.row("Run", mdCode(string(r.Run.ID)))
	m.row("Tenant", mdText(r.Run.Tenant))
	m.row("Agent", mdText(r.Run.Agent))
	m.row("State", mdText(string(r.Run.State)))
	m.row("Stop reason", mdText(strText(r.Run.StopReason)))
	m.row("Submitted by", mdText(r.Run.SubmittedBy))
	m.row("Created", mdText(timeText(r.Run.CreatedAt)))
	m.row("Updated", mdText(timeText(r.Run.UpdatedAt)))
	m.row("Actions", strconv.Itoa(len(r.Actions)))
	m.row("Recovery decisions", strconv.Itoa(len(r.RecoveryDecisions)))
	m.row("Events", strconv.Itoa(len(r.Timeline)))
	m.row("Chain", mdText(r.chainVerdict()))
	m.row("Signed head", mdText(r.signatureText()))
	m.p("\n")

	m.actions(r)
	m.cancellation(r)
	m.budget(r)
	m.decisions(r)
	m.observations(r)
	m.timeline(r)

	m.p("## Chain verdict\n\n%s\n\nSigned head: %s\n", mdText(r.chainVerdict()), mdText(r.signatureText()))
}

func (m *mdWriter) actions(r *Report) {
	m.p("## Actions\n\n")
	if len(r.Actions) == 0 {
		m.p("The run proposed no actions.\n\n")
	}
	for _, a := range r.Actions {
		m.p("### Action %d: %s %s (%s), %s\n\n", a.Seq, mdCode(a.Tool), mdText("v"+a.ToolVersion), mdText(string(a.Effect)), mdText(string(a.State)))
		m.header("Fact", "Value")
		m.row("ID", mdCode(string(a.ID)))
		m.row("Action digest", mdCode(string(a.ActionDigest)))
		m.row("Dedup key", mdCode(a.DedupKey))
		m.row("Supersedes", mdCode(strText(a.Supersedes)))
		m.row("Gate", mdText(a.gateText()))
		m.row("Rules digest", mdCode(a.rulesDigest()))
		m.row("Created", mdText(timeText(a.CreatedAt)))
		m.row("Updated", mdText(timeText(a.UpdatedAt)))
		m.p("\nArguments (redacted):\n\n")
		m.codeBlock("json", prettyJSON(a.Arguments))

		m.p("#### Attempts\n\n")
		if len(a.Attempts) == 0 {
			m.p("No attempt was started.\n\n")
		} else {
			m.header("No", "Attempt", "Status", "Effect", "Effect observation", "Started", "Finished", "Error")
			for _, at := range a.Attempts {
				m.row(strconv.FormatInt(at.No, 10), mdCode(string(at.ID)), mdText(string(at.Status)), mdText(string(at.Effect)),
					mdCode(strText(at.EffectObservationID)), mdText(timeText(at.StartedAt)), mdText(timePtrText(at.FinishedAt)),
					mdText(errorText(&at)))
			}
			m.p("\n")
			for _, at := range a.Attempts {
				if res := prettyJSON(at.Result); res != "" {
					m.p("Result of attempt %d (redacted):\n\n", at.No)
					m.codeBlock("json", res)
				}
			}
		}

		m.p("#### Approvals\n\n")
		if len(a.Approvals) == 0 {
			m.p("No approval was requested.\n\n")
			continue
		}
		m.header("Approval", "State", "Digest", "Decided by", "Reason", "Requested", "Expires", "Decided")
		for _, ap := range a.Approvals {
			m.row(mdCode(string(ap.ID)), mdText(string(ap.State)), mdCode(string(ap.ActionDigest)), mdText(strText(ap.DecidedBy)),
				mdText(strText(ap.Reason)), mdText(timeText(ap.RequestedAt)), mdText(timePtrText(ap.ExpiresAt)),
				mdText(timePtrText(ap.DecidedAt)))
		}
		m.p("\n")
	}
}

func (m *mdWriter) cancellation(r *Report) {
	m.p("## Cancellation\n\n")
	c := r.Cancellation
	if c == nil {
		m.p("Nobody asked to cancel the run.\n\n")
		return
	}
	m.p("Cancellation %s is %s: requested by %s, reason %s. Each step is a separate fact; "+
		"whether side effects happened is what the attempts say.\n\n",
		mdCode(string(c.ID)), mdText(string(c.State)), mdText(c.RequestedBy), mdText(strText(c.Reason)))
	m.header("Fact", "Time")
	m.row("requested", mdText(timeText(c.RequestedAt)))
	m.row("accepted", mdText(timePtrText(c.AcceptedAt)))
	m.row("stopping", mdText(timePtrText(c.StoppingAt)))
	m.row("stopped (confirmed)", mdText(timePtrText(c.StoppedAt)))
	if c.TooLateAt != nil {
		m.row("too late (the run ended first)", mdText(timePtrText(c.TooLateAt)))
	}
	m.p("\n")
}

func (m *mdWriter) budget(r *Report) {
	b := r.Budget
	m.p("## Budget\n\n")
	m.header("Budget", "Limit", "Used")
	m.row("Attempts per action", mdText(limitText(b.Limits.MaxAttemptsPerAction, "")), "—")
	m.row("Attempts per run", mdText(limitText(b.Limits.MaxAttemptsPerRun, "")), strconv.FormatInt(b.Used.Attempts, 10))
	m.row("Execution time", mdText(limitText(b.Limits.MaxExecutionMS, " ms")), mdText(strconv.FormatInt(b.Used.ExecutionMS, 10)+" ms"))
	m.row("Model steps", mdText(limitText(b.Limits.MaxSteps, "")), strconv.FormatInt(b.Used.Steps, 10))
	m.row("Tokens", mdText(limitText(b.Limits.MaxTokens, "")), mdText(b.Used.tokensText()))
	m.row("Deadline", mdText(b.deadlineText()), "—")
	m.p("\n")
}

func (m *mdWriter) decisions(r *Report) {
	m.p("## Recovery decisions\n\n")
	if len(r.RecoveryDecisions) == 0 {
		m.p("Recovery made no decisions about this run.\n\n")
		return
	}
	m.header("Event", "Time", "Action", "Attempt", "Decision", "Rationale", "Facts", "Actor")
	for _, d := range r.RecoveryDecisions {
		m.row(strconv.FormatInt(d.Seq, 10), mdText(timeText(d.DecidedAt)), mdCode(string(d.ActionID)), mdCode(strText(d.AttemptID)),
			mdText(d.Decision), mdText(d.Rationale), mdCode(compactJSON(d.Facts)), mdText(d.Actor))
	}
	m.p("\n")
}

func (m *mdWriter) observations(r *Report) {
	m.p("## Observations\n\n")
	if len(r.Observations) == 0 {
		m.p("No tool-side or human observations were recorded.\n\n")
		return
	}
	m.header("Observation", "Time", "Action", "Attempt", "Source", "Effect", "Detail (redacted)")
	for _, o := range r.Observations {
		m.row(mdCode(string(o.ID)), mdText(timeText(o.ObservedAt)), mdCode(string(o.ActionID)), mdCode(strText(o.AttemptID)),
			mdText(string(o.Source)), mdText(string(o.Effect)), mdCode(compactJSON(o.Detail)))
	}
	m.p("\n")
}

func (m *mdWriter) timeline(r *Report) {
	m.p("## Timeline\n\n")
	m.p("Every event of the run, data redacted (marked * where redaction changed it, so its hash covers data not shown).\n\n")
	m.header("Seq", "Time", "Type", "Entity", "From", "To", "Actor", "Data", "Hash", "Previous hash")
	for _, e := range r.Timeline {
		data := mdCode(compactJSON(e.Data))
		if e.Redacted {
			data += " \\*"
		}
		m.row(strconv.FormatInt(e.Seq, 10), mdText(timeText(e.CreatedAt)), mdCode(e.Type), mdCode(e.EntityID),
			mdText(strText(e.FromState)), mdText(strText(e.ToState)), mdText(strText(e.Actor)), data,
			mdCode(e.Hash), mdCode(e.PrevHash))
	}
	m.p("\n")
}
