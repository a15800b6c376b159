package evidence

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"reflect"
	"time"
)

// HTML writes the report as one self-contained HTML page: inline CSS, no
// scripts, no images, fonts or links to anything, and a Content Security
// Policy that forbids loading any. html/template escapes every recorded
// value. Sections: summary, actions with attempts (status and effect in
// separate columns) and approvals, cancellation, budget, recovery
// decisions with their rationale, observations, timeline, chain verdict.
// The page is built in memory and written at once.
func (r *Report) HTML(w io.Writer) error {
	var b bytes.Buffer
	if err := htmlTemplate.Execute(&b, r); err != nil {
		return fmt.Errorf("evidence: render HTML: %w", err)
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("evidence: write report: %w", err)
	}
	return nil
}

var htmlTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"time":        timeText,
	"optTime":     func(t *time.Time) string { return dash(timePtrText(t)) },
	"text":        derefString,
	"opt":         func(p any) string { return dash(derefString(p)) },
	"pretty":      prettyJSON,
	"compact":     compactJSON,
	"limit":       limitText,
	"verdict":     func(r *Report) string { return r.chainVerdict() },
	"signed":      func(r *Report) string { return r.signatureText() },
	"errText":     func(a Attempt) string { return errorText(&a) },
	"tokens":      func(u BudgetUsage) string { return u.tokensText() },
	"deadline":    func(b Budget) string { return b.deadlineText() },
	"gate":        func(a Action) string { return a.gateText() },
	"rulesDigest": func(a Action) string { return a.rulesDigest() },
	"dash":        dash,
}).Parse(htmlSource))

// dash stands in for an absent value.
func dash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// derefString shows the report's optional text fields (pointers to string
// types): nil is "".
func derefString(p any) string {
	v := reflect.ValueOf(p)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if v.Kind() == reflect.String {
		return v.String()
	}
	return fmt.Sprint(p)
}

const htmlSource = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Evidence report: run {{.Run.ID}}</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1b1f23; margin: 2rem auto; max-width: 1200px; padding: 0 1rem; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; margin-top: 2rem; } h3 { font-size: 1.05rem; margin-top: 1.5rem; } h4 { font-size: .95rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; width: 100%; }
th, td { border: 1px solid #d0d7de; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
code, pre { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; word-break: break-all; }
pre { background: #f6f8fa; padding: .5rem; overflow-x: auto; white-space: pre-wrap; }
.ok { color: #1a7f37; font-weight: 600; } .broken { color: #cf222e; font-weight: 600; }
.muted { color: #57606a; }
</style>
</head>
<body>
<h1>Evidence report: run <code>{{.Run.ID}}</code></h1>
<p class="muted">Generated {{time .GeneratedAt}} from the ledger. Schema version {{.SchemaVersion}}. Secrets are shown as <code>[redacted:&lt;8 hex&gt;]</code> ({{.Redaction.Algorithm}}, key id <code>{{.Redaction.KeyID}}</code>): equal markers mean equal secrets.</p>

<h2 id="summary">Summary</h2>
<table>
<tr><th>Run</th><td><code>{{.Run.ID}}</code></td></tr>
<tr><th>Tenant</th><td>{{.Run.Tenant}}</td></tr>
<tr><th>Agent</th><td>{{.Run.Agent}}</td></tr>
<tr><th>State</th><td>{{.Run.State}}</td></tr>
<tr><th>Stop reason</th><td>{{opt .Run.StopReason}}</td></tr>
<tr><th>Submitted by</th><td>{{.Run.SubmittedBy}}</td></tr>
<tr><th>Created</th><td>{{time .Run.CreatedAt}}</td></tr>
<tr><th>Updated</th><td>{{time .Run.UpdatedAt}}</td></tr>
<tr><th>Actions</th><td>{{len .Actions}}</td></tr>
<tr><th>Recovery decisions</th><td>{{len .RecoveryDecisions}}</td></tr>
<tr><th>Events</th><td>{{len .Timeline}}</td></tr>
<tr><th>Chain</th><td class="{{if .Chain.OK}}ok{{else}}broken{{end}}">{{verdict .}}</td></tr>
<tr><th>Signed head</th><td>{{signed .}}</td></tr>
</table>

<h2 id="actions">Actions</h2>
{{- if not .Actions}}
<p>The run proposed no actions.</p>
{{- end}}
{{- range .Actions}}
<h3>Action {{.Seq}}: <code>{{.Tool}}</code> v{{.ToolVersion}} ({{.Effect}}), {{.State}}</h3>
<table>
<tr><th>ID</th><td><code>{{.ID}}</code></td></tr>
<tr><th>Action digest</th><td><code>{{.ActionDigest}}</code></td></tr>
<tr><th>Dedup key</th><td><code>{{.DedupKey}}</code></td></tr>
<tr><th>Supersedes</th><td><code>{{opt .Supersedes}}</code></td></tr>
<tr><th>Gate</th><td>{{gate .}}</td></tr>
<tr><th>Rules digest</th><td><code>{{dash (rulesDigest .)}}</code></td></tr>
<tr><th>Created</th><td>{{time .CreatedAt}}</td></tr>
<tr><th>Updated</th><td>{{time .UpdatedAt}}</td></tr>
</table>
<p>Arguments (redacted):</p>
<pre>{{pretty .Arguments}}</pre>
<h4>Attempts</h4>
{{- if not .Attempts}}
<p>No attempt was started.</p>
{{- else}}
<table>
<tr><th>No</th><th>Attempt</th><th>Status</th><th>Effect</th><th>Effect observation</th><th>Started</th><th>Finished</th><th>Error</th></tr>
{{- range .Attempts}}
<tr><td>{{.No}}</td><td><code>{{.ID}}</code></td><td>{{.Status}}</td><td>{{.Effect}}</td><td><code>{{opt .EffectObservationID}}</code></td><td>{{time .StartedAt}}</td><td>{{optTime .FinishedAt}}</td><td>{{errText .}}</td></tr>
{{- end}}
</table>
{{- range .Attempts}}{{$no := .No}}{{with pretty .Result}}
<p>Result of attempt {{$no}} (redacted):</p>
<pre>{{.}}</pre>
{{- end}}{{end}}
{{- end}}
<h4>Approvals</h4>
{{- if not .Approvals}}
<p>No approval was requested.</p>
{{- else}}
<table>
<tr><th>Approval</th><th>State</th><th>Digest</th><th>Decided by</th><th>Reason</th><th>Requested</th><th>Expires</th><th>Decided</th></tr>
{{- range .Approvals}}
<tr><td><code>{{.ID}}</code></td><td>{{.State}}</td><td><code>{{.ActionDigest}}</code></td><td>{{opt .DecidedBy}}</td><td>{{opt .Reason}}</td><td>{{time .RequestedAt}}</td><td>{{optTime .ExpiresAt}}</td><td>{{optTime .DecidedAt}}</td></tr>
{{- end}}
</table>
{{- end}}
{{- end}}

<h2 id="cancellation">Cancellation</h2>
{{- with .Cancellation}}
<p>Cancellation <code>{{.ID}}</code> is {{.State}}: requested by {{.RequestedBy}}, reason {{with text .Reason}}{{.}}{{else}}none given{{end}}. Each step is a separate fact; whether side effects happened is what the attempts say.</p>
<table>
<tr><th>Fact</th><th>Time</th></tr>
<tr><td>requested</td><td>{{time .RequestedAt}}</td></tr>
<tr><td>accepted</td><td>{{optTime .AcceptedAt}}</td></tr>
<tr><td>stopping</td><td>{{optTime .StoppingAt}}</td></tr>
<tr><td>stopped (confirmed)</td><td>{{optTime .StoppedAt}}</td></tr>
{{- if .TooLateAt}}
<tr><td>too late (the run ended first)</td><td>{{optTime .TooLateAt}}</td></tr>
{{- end}}
</table>
{{- else}}
<p>Nobody asked to cancel the run.</p>
{{- end}}

<h2 id="budget">Budget</h2>
{{- with .Budget}}
<table>
<tr><th>Budget</th><th>Limit</th><th>Used</th></tr>
<tr><td>Attempts per action</td><td>{{limit .Limits.MaxAttemptsPerAction ""}}</td><td></td></tr>
<tr><td>Attempts per run</td><td>{{limit .Limits.MaxAttemptsPerRun ""}}</td><td>{{.Used.Attempts}}</td></tr>
<tr><td>Execution time</td><td>{{limit .Limits.MaxExecutionMS " ms"}}</td><td>{{.Used.ExecutionMS}} ms</td></tr>
<tr><td>Model steps</td><td>{{limit .Limits.MaxSteps ""}}</td><td>{{.Used.Steps}}</td></tr>
<tr><td>Tokens</td><td>{{limit .Limits.MaxTokens ""}}</td><td>{{tokens .Used}}</td></tr>
<tr><td>Deadline</td><td>{{deadline .}}</td><td></td></tr>
</table>
{{- end}}

<h2 id="recovery">Recovery decisions</h2>
{{- if not .RecoveryDecisions}}
<p>Recovery made no decisions about this run.</p>
{{- else}}
<table>
<tr><th>Event</th><th>Time</th><th>Action</th><th>Attempt</th><th>Decision</th><th>Rationale</th><th>Facts</th><th>Actor</th></tr>
{{- range .RecoveryDecisions}}
<tr><td>{{.Seq}}</td><td>{{time .DecidedAt}}</td><td><code>{{.ActionID}}</code></td><td><code>{{opt .AttemptID}}</code></td><td>{{.Decision}}</td><td>{{.Rationale}}</td><td><code>{{compact .Facts}}</code></td><td>{{.Actor}}</td></tr>
{{- end}}
</table>
{{- end}}

<h2 id="observations">Observations</h2>
{{- if not .Observations}}
<p>No tool-side or human observations were recorded.</p>
{{- else}}
<table>
<tr><th>Observation</th><th>Time</th><th>Action</th><th>Attempt</th><th>Source</th><th>Effect</th><th>Detail (redacted)</th></tr>
{{- range .Observations}}
<tr><td><code>{{.ID}}</code></td><td>{{time .ObservedAt}}</td><td><code>{{.ActionID}}</code></td><td><code>{{opt .AttemptID}}</code></td><td>{{.Source}}</td><td>{{.Effect}}</td><td><code>{{compact .Detail}}</code></td></tr>
{{- end}}
</table>
{{- end}}

<h2 id="timeline">Timeline</h2>
<p>Every event of the run, data redacted (marked * where redaction changed it, so its hash covers data not shown).</p>
<table>
<tr><th>Seq</th><th>Time</th><th>Type</th><th>Entity</th><th>From</th><th>To</th><th>Actor</th><th>Data</th><th>Hash</th><th>Previous hash</th></tr>
{{- range .Timeline}}
<tr><td>{{.Seq}}</td><td>{{time .CreatedAt}}</td><td><code>{{.Type}}</code></td><td><code>{{.EntityID}}</code></td><td>{{opt .FromState}}</td><td>{{opt .ToState}}</td><td>{{opt .Actor}}</td><td><code>{{compact .Data}}</code>{{if .Redacted}} *{{end}}</td><td><code>{{.Hash}}</code></td><td><code>{{.PrevHash}}</code></td></tr>
{{- end}}
</table>

<h2 id="chain">Chain verdict</h2>
<p class="{{if .Chain.OK}}ok{{else}}broken{{end}}">{{verdict .}}</p>
<p>Signed head: {{signed .}}</p>
</body>
</html>
`
