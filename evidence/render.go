package evidence

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/actionledger/ledger/contracts"
)

// JSON writes the report as indented JSON, after checking it against the
// report schema (contracts.SchemaReport). A report that breaks its schema
// is an error and nothing is written; so is a failing writer, after which
// w may hold part of the report: write to a buffer or a temporary file to
// publish all or nothing.
//
// The text of a report of overlapParts timeline events or more is written
// on another goroutine while this one checks the report, both only reading
// it; JSON waits for it before returning, whatever the outcome, and an
// encoding error is returned before a schema error, as when one came after
// the other.
func (r *Report) JSON(w io.Writer) error {
	var (
		b   []byte
		err error
	)
	if len(r.Timeline) < overlapParts {
		if b, err = r.marshal(); err != nil {
			return err
		}
		err = r.validate()
	} else {
		done := make(chan struct{})
		var merr error
		go func() {
			defer close(done)
			b, merr = r.marshal()
		}()
		err = r.validate()
		<-done
		if merr != nil {
			return merr
		}
	}
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("evidence: write report: %w", err)
	}
	return nil
}

// overlapParts is the least number of timeline events for which JSON
// writes the text and checks the report at the same time: below it, a
// goroutine costs more than the overlap saves.
const overlapParts = 256

// validate checks the report against its schema (contracts.SchemaReport):
// the value its JSON text decodes to, built from the report (value.go)
// rather than by decoding the text.
func (r *Report) validate() error {
	v, err := r.value()
	if err != nil {
		return fmt.Errorf("evidence: report of run %s: %w", r.Run.ID, err)
	}
	if err := contracts.ValidateValue(contracts.SchemaReport, v); err != nil {
		return fmt.Errorf("evidence: report of run %s breaks its schema: %w", r.Run.ID, err)
	}
	return nil
}

// signatureText is the signed head in words.
func (r *Report) signatureText() string {
	s := r.Signature
	if s == nil {
		return "none: the ledger signed no head of this run"
	}
	return fmt.Sprintf("event %d (%s), signed at %s with %s key %s", s.Seq, s.Hash, timeText(s.SignedAt), s.Algorithm, s.KeyID)
}

// timeText is how Markdown and HTML show a time: RFC 3339 in UTC, with
// fractions only where the ledger recorded them.
func timeText(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func timePtrText(t *time.Time) string {
	if t == nil {
		return ""
	}
	return timeText(*t)
}

func strText[T ~string](p *T) string {
	if p == nil {
		return ""
	}
	return string(*p)
}

func limitText(p *int64, unit string) string {
	if p == nil {
		return "none"
	}
	return strconv.FormatInt(*p, 10) + unit
}

// prettyJSON indents a redacted document for people; null and absent are
// "".
func prettyJSON(doc json.RawMessage) string {
	if len(doc) == 0 || string(doc) == "null" {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, doc, "", "  "); err != nil {
		return string(doc)
	}
	return b.String()
}

// compactJSON is a document on one line; null and absent are "".
func compactJSON(doc json.RawMessage) string {
	if len(doc) == 0 || string(doc) == "null" {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, doc); err != nil {
		return string(doc)
	}
	return b.String()
}

// chainVerdict is the chain's verdict in words.
func (r *Report) chainVerdict() string {
	if r.Chain.OK {
		s := fmt.Sprintf("intact: %d events, each pointing at its predecessor's hash, up to the run's recorded head; "+
			"%d rows, each as the newest event that recorded it says", r.Chain.Events, r.Chain.Rows)
		if r.Chain.UnboundRows > 0 {
			s += fmt.Sprintf(" (%d of them written before rows were bound, which the chain cannot vouch for)", r.Chain.UnboundRows)
		}
		return s
	}
	seq := int64(0)
	if r.Chain.BrokenSeq != nil {
		seq = *r.Chain.BrokenSeq
	}
	return fmt.Sprintf("BROKEN at event %d: %s", seq, strText(r.Chain.Reason))
}

// tokensText shows token usage, flagged as a lower bound when a step
// reported none.
func (u BudgetUsage) tokensText() string {
	s := strconv.FormatInt(u.Tokens, 10)
	if u.TokensUnavailable {
		s += " (lower bound: a step reported no usage)"
	}
	return s
}

// gateText is the gate's decision on an action in words: the state it
// chose, by which rule or the default, and why (the reason's own "rule N: "
// or "default: " not repeated).
func (a *Action) gateText() string {
	g := a.Gate
	if g == nil {
		return "not recorded: the action was recorded before the gate was audited"
	}
	by, prefix := "the default", "default: "
	if g.Rule != nil {
		by = "rule " + strconv.FormatInt(*g.Rule, 10)
		prefix = by + ": "
	}
	text := fmt.Sprintf("%s by %s: %s", g.Decision, by, strings.TrimPrefix(g.Reason, prefix))
	if len(a.DecidingRule) > 0 {
		var rule bytes.Buffer
		if json.Compact(&rule, a.DecidingRule) == nil {
			text += "; the rule: " + rule.String()
		}
	}
	return text
}

// rulesDigest is the digest of the rule set that gated the action; "" if
// none was recorded.
func (a *Action) rulesDigest() string {
	if a.Gate == nil {
		return ""
	}
	return string(a.Gate.RulesDigest)
}

func errorText(e *Attempt) string {
	if e.Error == nil {
		return ""
	}
	return e.Error.Code + ": " + e.Error.Message
}

// deadlineText is the deadline with the relative limit it came from.
func (b Budget) deadlineText() string {
	if b.Deadline == nil {
		return "none"
	}
	s := timeText(*b.Deadline)
	if b.Limits.DeadlineAfterMS != nil {
		s += " (" + strconv.FormatInt(*b.Limits.DeadlineAfterMS, 10) + " ms after submit)"
	}
	return s
}

// oneLine folds line breaks, which would break a table row.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

// marshal is the report's JSON text: two-space indents, no HTML escaping
// (the text is shown as recorded; the HTML renderer escapes for itself),
// and a final newline. For a long report JSON runs it beside the schema
// check, which takes longer, so encoding/json's cost does not show.
func (r *Report) marshal() ([]byte, error) {
	var b bytes.Buffer
	b.Grow(4096 + 700*len(r.Timeline))
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return nil, fmt.Errorf("evidence: encode report: %w", err)
	}
	return b.Bytes(), nil
}
