package evidence_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/redact"
	"github.com/stretchr/testify/require"
)

func TestReport(t *testing.T) {
	f := openFixture(t)
	id := goldenRun(t, f)
	rep, err := evidence.Build(context.Background(), f.store, id, f.options(t))
	require.NoError(t, err)

	for _, format := range []string{"json", "md", "html"} {
		t.Run(format, func(t *testing.T) {
			got := render(t, rep, format)
			golden(t, format, got)

			// Determinism: a second build of the same run gives the same bytes.
			again, err := evidence.Build(context.Background(), f.store, id, f.options(t))
			require.NoError(t, err)
			require.Equal(t, string(got), string(render(t, again, format)))

			// No secret of the run survives in any format.
			for _, secret := range []string{goldenSecret, "hunter2", "tok_golden.12345", "correct horse", "swordfish", "AKIAGOLDEN0123456789", string(testKey)} {
				require.NotContains(t, string(got), secret)
			}
		})
	}

	t.Run("facts", func(t *testing.T) {
		require.Equal(t, evidence.SchemaVersion, rep.SchemaVersion)
		require.Equal(t, f.clock.Now(), rep.GeneratedAt)
		require.Equal(t, ledger.RunStopped, rep.Run.State)
		require.Equal(t, ledger.StopUserCancelled, *rep.Run.StopReason)
		require.Len(t, rep.Actions, 2)

		// The same secret at the secret path of two actions: one marker.
		var args1, args2 map[string]any
		require.NoError(t, json.Unmarshal(rep.Actions[0].Arguments, &args1))
		require.NoError(t, json.Unmarshal(rep.Actions[1].Arguments, &args2))
		marker := f.options(t).Redactor.Marker(goldenSecret)
		require.Equal(t, marker, args1["api_key"])
		require.Equal(t, marker, args2["api_key"])
		require.Equal(t, "https://cards:"+f.options(t).Redactor.Marker("hunter2")+"@hooks.example/notify", args1["callback"])
		require.Equal(t, "sent with Authorization: Bearer "+f.options(t).Redactor.Marker("tok_golden.12345"), args1["note"])
		require.Equal(t, "It blocks until a receiver is <ready> & waiting.", args1["cards"].([]any)[0].(map[string]any)["back"])
		// Digests are of what was recorded, not of what is shown.
		require.Regexp(t, `^sha256:[0-9a-f]{64}$`, string(rep.Actions[0].ActionDigest))

		// Status and effect are separate facts.
		a1, a2 := rep.Actions[0], rep.Actions[1]
		require.Len(t, a1.Attempts, 1)
		require.Equal(t, ledger.AttemptSucceeded, a1.Attempts[0].Status)
		require.Equal(t, ledger.EffectHappened, a1.Attempts[0].Effect)
		require.NotNil(t, a1.Attempts[0].EffectObservationID)
		require.Len(t, a1.Approvals, 1)
		require.Equal(t, ledger.ApprovalGranted, a1.Approvals[0].State)
		require.Equal(t, "bob", *a1.Approvals[0].DecidedBy)
		require.Contains(t, *a1.Approvals[0].Reason, "password="+f.options(t).Redactor.Marker("swordfish"))
		require.Len(t, a2.Attempts, 1)
		require.Equal(t, ledger.AttemptCancelled, a2.Attempts[0].Status)
		require.Equal(t, ledger.EffectNotHappened, a2.Attempts[0].Effect)
		require.Equal(t, "interrupted", a2.Attempts[0].Error.Code)
		require.Equal(t, ledger.ActionCancelled, a2.State)
		require.Empty(t, a2.Approvals)

		require.NotNil(t, rep.Cancellation)
		require.Equal(t, ledger.CancelStopped, rep.Cancellation.State)
		for _, at := range []*time.Time{rep.Cancellation.AcceptedAt, rep.Cancellation.StoppingAt, rep.Cancellation.StoppedAt} {
			require.NotNil(t, at)
		}

		require.Equal(t, int64(3), *rep.Budget.Limits.MaxAttemptsPerAction)
		require.Equal(t, int64(60000), *rep.Budget.Limits.MaxExecutionMS)
		require.Equal(t, int64(600000), *rep.Budget.Limits.DeadlineAfterMS)
		require.NotNil(t, rep.Budget.Deadline)
		require.Equal(t, int64(2), rep.Budget.Used.Attempts)
		require.True(t, rep.Budget.Used.TokensUnavailable)

		require.NotEmpty(t, rep.RecoveryDecisions)
		kinds := []string{}
		for _, d := range rep.RecoveryDecisions {
			kinds = append(kinds, d.Decision)
			require.NotEmpty(t, d.Rationale)
			require.Equal(t, a2.ID, d.ActionID)
			require.Equal(t, a2.Attempts[0].ID, *d.AttemptID)
		}
		require.Equal(t, []string{"cancel", "cancelled"}, kinds)

		sources := []ledger.ObservationSource{}
		for _, o := range rep.Observations {
			sources = append(sources, o.Source)
		}
		require.Equal(t, []ledger.ObservationSource{ledger.ObservedResult, ledger.ObservedCancel}, sources)

		require.True(t, rep.Chain.OK)
		require.Equal(t, len(rep.Timeline), rep.Chain.Events)
		for i, e := range rep.Timeline {
			require.Equal(t, int64(i+1), e.Seq)
			if i > 0 {
				require.Equal(t, rep.Timeline[i-1].Hash, e.PrevHash)
			}
		}
	})

	t.Run("html is self-contained", func(t *testing.T) {
		page := string(render(t, rep, "html"))
		for _, banned := range []string{"<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import", "http://", "https://"} {
			if banned == "https://" {
				// The only URL is the redacted callback argument, shown as text.
				page = strings.ReplaceAll(page, "https://cards:", "")
			}
			require.NotContains(t, page, banned)
		}
		require.Contains(t, page, "Content-Security-Policy")
		// Recorded text is escaped, never markup.
		require.Contains(t, page, "&lt;ready&gt; &amp; waiting.")
		require.NotContains(t, page, "<ready>")
		require.Contains(t, page, "wrong deck, see &lt;b&gt;notes&lt;/b&gt;")
		for _, section := range []string{`id="summary"`, `id="actions"`, `id="cancellation"`, `id="budget"`, `id="recovery"`, `id="observations"`, `id="timeline"`, `id="chain"`} {
			require.Contains(t, page, section)
		}
		require.Contains(t, page, "<th>Status</th><th>Effect</th>")
	})

	t.Run("markdown escapes recorded text", func(t *testing.T) {
		md := string(render(t, rep, "md"))
		require.Contains(t, md, `cards look right \| the old password=`)
		require.Contains(t, md, `reason wrong deck, see \<b\>notes\</b\>.`)
		// Outside code spans and blocks, which CommonMark shows literally,
		// no recorded "<" reaches the page unescaped.
		outside := regexp.MustCompile("(?s)```json\n.*?\n```|`[^`]*`").ReplaceAllString(md, "")
		require.False(t, regexp.MustCompile(`(^|[^\\])<`).MatchString(outside), "unescaped < outside code")
		require.Contains(t, md, "| No | Attempt | Status | Effect |")
	})
}

func TestBuildErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("ErrNotFound", func(t *testing.T) {
		f := openFixture(t)
		_, err := evidence.Build(ctx, f.store, "run_00000000000000000000000099", f.options(t))
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
	t.Run("NoRedactor", func(t *testing.T) {
		f := openFixture(t)
		id := goldenRun(t, f)
		opts := f.options(t)
		opts.Redactor = nil
		_, err := evidence.Build(ctx, f.store, id, opts)
		require.ErrorIs(t, err, redact.ErrRedaction)
	})
	t.Run("NoClock", func(t *testing.T) {
		f := openFixture(t)
		id := goldenRun(t, f)
		opts := f.options(t)
		opts.Now = nil
		_, err := evidence.Build(ctx, f.store, id, opts)
		require.Error(t, err)
	})
	t.Run("BadSecretPath", func(t *testing.T) {
		f := openFixture(t)
		id := goldenRun(t, f)
		opts := f.options(t)
		opts.Tools = func(string) ([]string, bool) { return []string{"api_key"}, true }
		rep, err := evidence.Build(ctx, f.store, id, opts)
		require.ErrorIs(t, err, redact.ErrRedaction)
		require.Nil(t, rep)
		require.NotContains(t, err.Error(), goldenSecret)
	})
	t.Run("MalformedStoredJSON", func(t *testing.T) {
		// A result that is not JSON (written behind the ledger's back) is
		// never shown as it is: the export fails.
		f := openFixture(t)
		id := goldenRun(t, f)
		db, err := sql.Open("sqlite3", "file:"+f.path+"?_busy_timeout=5000")
		require.NoError(t, err)
		defer db.Close()
		_, err = db.Exec(`UPDATE attempts SET result = ? WHERE attempt_no = 1 AND result IS NOT NULL`, `{"token": "`+goldenSecret)
		require.NoError(t, err)
		rep, err := evidence.Build(ctx, f.store, id, f.options(t))
		require.ErrorIs(t, err, redact.ErrRedaction)
		require.Nil(t, rep)
		require.NotContains(t, err.Error(), goldenSecret)
	})
	t.Run("UnknownToolArgumentsWithheld", func(t *testing.T) {
		f := openFixture(t)
		id := goldenRun(t, f)
		opts := f.options(t)
		opts.Tools = nil
		rep, err := evidence.Build(ctx, f.store, id, opts)
		require.NoError(t, err)
		for _, a := range rep.Actions {
			var s string
			require.NoError(t, json.Unmarshal(a.Arguments, &s), "arguments are one marker: %s", a.Arguments)
			require.Regexp(t, `^\[redacted:[0-9a-f]{8}\]$`, s)
		}
		var b bytes.Buffer
		require.NoError(t, rep.JSON(&b))
	})
}

func TestReportJSONValidatesBeforeWriting(t *testing.T) {
	f := openFixture(t)
	id := goldenRun(t, f)
	rep, err := evidence.Build(context.Background(), f.store, id, f.options(t))
	require.NoError(t, err)

	rep.Run.State = "exploded"
	var b bytes.Buffer
	err = rep.JSON(&b)
	require.ErrorIs(t, err, contracts.ErrInvalid)
	require.Contains(t, err.Error(), "/run/state")
	require.Zero(t, b.Len(), "nothing is written")

	rep.Run.State = ledger.RunStopped
	rep.Actions[0].Arguments = json.RawMessage(`"not a marker"`)
	err = rep.JSON(&b)
	require.ErrorIs(t, err, contracts.ErrInvalid)
	require.Zero(t, b.Len())

	rep.Actions[0].Arguments = json.RawMessage(`{}`)
	require.ErrorContains(t, rep.JSON(failingWriter{}), "disk full")
}

// TestReportJSONLongTimeline: a report long enough for JSON to write the
// text while it checks the report writes what marshal writes, nothing when
// the report breaks its schema, and the encoding error before the schema's
// when both fail. TestMain's goleak check covers the goroutine.
func TestReportJSONLongTimeline(t *testing.T) {
	f := openFixture(t)
	id := goldenRun(t, f)
	rep, err := evidence.Build(context.Background(), f.store, id, f.options(t))
	require.NoError(t, err)
	golden := rep.Timeline
	for len(rep.Timeline) < 300 {
		e := golden[len(rep.Timeline)%len(golden)]
		e.Seq = int64(len(rep.Timeline) + 1)
		rep.Timeline = append(rep.Timeline, e)
	}

	var b bytes.Buffer
	require.NoError(t, rep.JSON(&b))
	want, err := evidence.ReportMarshal(rep)
	require.NoError(t, err)
	require.Equal(t, string(want), b.String())

	b.Reset()
	rep.Timeline[299].Type = ""
	err = rep.JSON(&b)
	require.ErrorIs(t, err, contracts.ErrInvalid)
	require.Contains(t, err.Error(), "/timeline/299/type")
	require.Zero(t, b.Len(), "nothing is written")

	rep.Timeline[298].Data = json.RawMessage(`{"a":`)
	err = rep.JSON(&b)
	require.ErrorContains(t, err, "evidence: encode report")
	require.NotErrorIs(t, err, contracts.ErrInvalid)
	require.Zero(t, b.Len())
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// addedSince10 are the properties versions 1.1, 1.2 and 1.3 of the report
// added: optional in the schema, so that every older report stays valid,
// and always written.
var addedSince10 = map[string]bool{"digest": true, "redacted_fields": true, "format": true, "rows": true, "redacted_data": true,
	"unbound_rows": true, "signature": true, "too_late_at": true, // rows: of events and of the chain
	"gate":      true,                        // 1.2
	"rule_sets": true, "deciding_rule": true, // 1.3
	"execute_by": true, "stale_at": true, "stale_reason": true} // 1.3

// TestTypesMatchSchema keeps the Go types and the report schema in step:
// every property is a JSON field of the type and every JSON field a
// property.
func TestTypesMatchSchema(t *testing.T) {
	var schema map[string]any
	require.NoError(t, json.Unmarshal(contracts.SchemaJSON(contracts.SchemaReport), &schema))
	defs := schema["$defs"].(map[string]any)
	props := func(node map[string]any) map[string]any { return node["properties"].(map[string]any) }
	budget := defs["budget"].(map[string]any)
	tests := []struct {
		node map[string]any
		typ  any
	}{
		{schema, evidence.Report{}},
		{props(schema)["run"].(map[string]any), evidence.RunSummary{}},
		{defs["action"].(map[string]any), evidence.Action{}},
		{defs["attempt"].(map[string]any), evidence.Attempt{}},
		{defs["approval"].(map[string]any), evidence.Approval{}},
		{defs["cancellation"].(map[string]any), evidence.Cancellation{}},
		{budget, evidence.Budget{}},
		{props(budget)["limits"].(map[string]any), evidence.BudgetLimits{}},
		{props(budget)["used"].(map[string]any), evidence.BudgetUsage{}},
		{defs["recovery_decision"].(map[string]any), evidence.RecoveryDecision{}},
		{defs["observation"].(map[string]any), evidence.Observation{}},
		{defs["event"].(map[string]any), evidence.TimelineEvent{}},
		{defs["chain"].(map[string]any), evidence.Chain{}},
		{props(schema)["redaction"].(map[string]any), evidence.Redaction{}},
		{defs["signature"].(map[string]any), evidence.Signature{}},
		{defs["gate"].(map[string]any), ledger.GateContent{}},
		{defs["rule_set"].(map[string]any), evidence.RuleSet{}},
	}
	for _, tt := range tests {
		typ := reflect.TypeOf(tt.typ)
		t.Run(typ.Name(), func(t *testing.T) {
			var want []string
			for name := range props(tt.node) {
				want = append(want, name)
			}
			var fields []string
			for i := range typ.NumField() {
				name, opts, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
				require.NotContains(t, opts, "omitempty", "absent facts are null, never omitted")
				fields = append(fields, name)
			}
			require.ElementsMatch(t, want, fields)
			// Every property is required, but those 1.1, 1.2 and 1.3 added: a
			// reader never guesses.
			var required, wantRequired []string
			for _, r := range tt.node["required"].([]any) {
				required = append(required, r.(string))
			}
			for _, name := range want {
				if !addedSince10[name] || typ == reflect.TypeFor[evidence.Signature]() || typ == reflect.TypeFor[evidence.RuleSet]() { // new in 1.1 and 1.3, with all of their fields
					wantRequired = append(wantRequired, name)
				}
			}
			require.ElementsMatch(t, wantRequired, required)
		})
	}
}

// TestEmptyRun: a run that just arrived has empty lists, not nulls.
func TestEmptyRun(t *testing.T) {
	f := openFixture(t)
	sub, err := f.store.SubmitRun(context.Background(), ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k",
		Principal: "alice", Agent: "practice-cards", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	rep, err := evidence.Build(context.Background(), f.store, sub.Run.ID, f.options(t))
	require.NoError(t, err)
	got := string(render(t, rep, "json"))
	for _, list := range []string{"actions", "recovery_decisions", "observations"} {
		require.Contains(t, got, `"`+list+`": []`)
	}
	require.Contains(t, got, `"cancellation": null`)
	require.Contains(t, got, `"stop_reason": null`)
	require.Regexp(t, regexp.MustCompile(`"max_steps": null`), got)
	render(t, rep, "md")
	render(t, rep, "html")
}
