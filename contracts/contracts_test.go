package contracts_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v5"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
)

// validDocs are the testdata documents each schema must accept.
var validDocs = map[contracts.Schema]string{
	contracts.SchemaRunSubmission:     "run_submission.valid.json",
	contracts.SchemaToolDescriptor:    "tool_descriptor.cards_write.json",
	contracts.SchemaRules:             "rules.valid.json",
	contracts.SchemaAction:            "action.valid.json",
	contracts.SchemaReport:            "report.valid.json",
	contracts.SchemaFaultMatrixReport: "faultmatrix_report.valid.json",
	contracts.SchemaConfig:            "config.valid.json",
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

// edit returns doc with the value at the JSON Pointer ptr replaced by val,
// or removed when val is remove. Parents must exist.
func edit(t *testing.T, doc []byte, ptr string, val any) []byte {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var root any
	require.NoError(t, d.Decode(&root))
	toks := strings.Split(ptr, "/")[1:]
	parent := root
	for _, tok := range toks[:len(toks)-1] {
		switch p := parent.(type) {
		case map[string]any:
			parent = p[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			require.NoError(t, err)
			parent = p[i]
		default:
			t.Fatalf("edit %s: cannot descend into %T", ptr, parent)
		}
	}
	last := toks[len(toks)-1]
	switch p := parent.(type) {
	case map[string]any:
		if val == remove {
			delete(p, last)
		} else {
			p[last] = val
		}
	case []any:
		i, err := strconv.Atoi(last)
		require.NoError(t, err)
		p[i] = val
	default:
		t.Fatalf("edit %s: parent is %T", ptr, parent)
	}
	out, err := json.Marshal(root)
	require.NoError(t, err)
	return out
}

type removeMarker struct{}

var remove = removeMarker{}

func requireIssue(t *testing.T, err error, location, messagePart string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, contracts.ErrInvalid)
	require.NotErrorIs(t, err, contracts.ErrUnsupportedVersion)
	var ve *contracts.ValidationError
	require.ErrorAs(t, err, &ve)
	for _, is := range ve.Issues {
		if is.Location == location && strings.Contains(is.Message, messagePart) {
			return
		}
	}
	t.Fatalf("no issue at %q containing %q in %+v", location, messagePart, ve.Issues)
}

// reportGate is an action's gate in a report, decided by rule (nil: the
// default).
func reportGate(rule any) map[string]any {
	return map[string]any{"decision": "approved", "rule": rule, "reason": "rule 2: cards.write is auto-approved",
		"rules_digest": "sha256:" + strings.Repeat("ab", 32)}
}

// with is m with key set to v, or removed for remove.
func with(m map[string]any, key string, v any) map[string]any {
	if v == remove {
		delete(m, key)
	} else {
		m[key] = v
	}
	return m
}

func TestValidate(t *testing.T) {
	// Each case edits the schema's valid testdata document at ptr. An empty
	// wantLoc means the edited document must pass.
	tests := []struct {
		name    string
		schema  contracts.Schema
		ptr     string
		val     any
		wantLoc string
		wantMsg string
	}{
		{"run/valid", contracts.SchemaRunSubmission, "/agent", "practice-cards", "", ""},
		{"run/no budgets", contracts.SchemaRunSubmission, "/budgets", remove, "", ""},
		{"run/no schema_version", contracts.SchemaRunSubmission, "/schema_version", remove, "", ""},
		{"run/minor version", contracts.SchemaRunSubmission, "/schema_version", "1.7", "", ""},
		{"run/missing agent", contracts.SchemaRunSubmission, "/agent", remove, "/agent", "required field is missing"},
		{"run/missing input", contracts.SchemaRunSubmission, "/input", remove, "/input", "required field is missing"},
		{"run/input not object", contracts.SchemaRunSubmission, "/input", "text", "/input", "expected object"},
		{"run/agent wrong type", contracts.SchemaRunSubmission, "/agent", 7, "/agent", "expected string"},
		{"run/agent bad pattern", contracts.SchemaRunSubmission, "/agent", "Practice Cards", "/agent", "pattern"},
		{"run/agent empty", contracts.SchemaRunSubmission, "/agent", "", "/agent", "length must be >= 1"},
		{"run/agent too long", contracts.SchemaRunSubmission, "/agent", strings.Repeat("a", 65), "/agent", "length must be <= 64"},
		{"run/unknown field", contracts.SchemaRunSubmission, "/priority", 1, "/priority", "unknown field"},
		{"run/server-owned state", contracts.SchemaRunSubmission, "/state", "completed", "/state", "set by the server"},
		{"run/server-owned tenant", contracts.SchemaRunSubmission, "/tenant", "acme", "/tenant", "set by the server"},
		{"run/server-owned id", contracts.SchemaRunSubmission, "/id", "run_01JDQ3Z8K4T5V6W7X8Y9Z0ABCE", "/id", "set by the server"},
		{"run/server-owned stop_reason", contracts.SchemaRunSubmission, "/stop_reason", "completed", "/stop_reason", "set by the server"},
		{"run/server-owned action_digest", contracts.SchemaRunSubmission, "/action_digest", "sha256:00", "/action_digest", "set by the server"},
		{"run/unknown budget", contracts.SchemaRunSubmission, "/budgets/max_cost", 1, "/budgets/max_cost", "unknown field"},
		{"run/budget zero", contracts.SchemaRunSubmission, "/budgets/max_steps", 0, "/budgets/max_steps", ">= 1"},
		{"run/budget fraction", contracts.SchemaRunSubmission, "/budgets/deadline_ms", 1.5, "/budgets/deadline_ms", "expected integer"},
		{"run/budget written as float", contracts.SchemaRunSubmission, "/budgets/deadline_ms", json.Number("5000.0"), "/budgets/deadline_ms", "without fraction or exponent"},
		{"run/budget past ten years", contracts.SchemaRunSubmission, "/budgets/deadline_ms", json.Number("315360000001"), "/budgets/deadline_ms", "<= 315360000000"},
		{"run/budgets wrong type", contracts.SchemaRunSubmission, "/budgets", []any{}, "/budgets", "expected object"},
		{"run/malformed version", contracts.SchemaRunSubmission, "/schema_version", "x", "/schema_version", "pattern"},
		{"run/version wrong type", contracts.SchemaRunSubmission, "/schema_version", 1, "/schema_version", "expected string"},

		{"tool/valid", contracts.SchemaToolDescriptor, "/name", "cards.write", "", ""},
		{"tool/minor version", contracts.SchemaToolDescriptor, "/schema_version", "1.12", "", ""},
		{"tool/no optional fields", contracts.SchemaToolDescriptor, "/secret_paths", remove, "", ""},
		{"tool/secret paths", contracts.SchemaToolDescriptor, "/secret_paths", []any{"", "/cards/0/back", "/a~1b/c~0d"}, "", ""},
		{"tool/missing schema_version", contracts.SchemaToolDescriptor, "/schema_version", remove, "/schema_version", "required field is missing"},
		{"tool/missing guarantees", contracts.SchemaToolDescriptor, "/guarantees", remove, "/guarantees", "required field is missing"},
		{"tool/missing guarantee", contracts.SchemaToolDescriptor, "/guarantees/cancel", remove, "/guarantees/cancel", "required field is missing"},
		{"tool/missing timeout", contracts.SchemaToolDescriptor, "/timeout_ms", remove, "/timeout_ms", "required field is missing"},
		{"tool/guarantee wrong type", contracts.SchemaToolDescriptor, "/guarantees/query", "yes", "/guarantees/query", "expected boolean"},
		{"tool/unknown guarantee", contracts.SchemaToolDescriptor, "/guarantees/exactly_once", true, "/guarantees/exactly_once", "unknown field"},
		{"tool/unknown field", contracts.SchemaToolDescriptor, "/retries", 3, "/retries", "unknown field"},
		{"tool/bad effect", contracts.SchemaToolDescriptor, "/effect", "delete", "/effect", "must be one of"},
		{"tool/bad name", contracts.SchemaToolDescriptor, "/name", "Cards.Write", "/name", "pattern"},
		{"tool/trailing dot", contracts.SchemaToolDescriptor, "/name", "cards.", "/name", "pattern"},
		{"tool/empty version", contracts.SchemaToolDescriptor, "/version", "", "/version", "length must be >= 1"},
		{"tool/bad secret path", contracts.SchemaToolDescriptor, "/secret_paths", []any{"cards"}, "/secret_paths/0", "pattern"},
		{"tool/bad pointer escape", contracts.SchemaToolDescriptor, "/secret_paths", []any{"/a~2"}, "/secret_paths/0", "pattern"},
		{"tool/zero timeout", contracts.SchemaToolDescriptor, "/timeout_ms", 0, "/timeout_ms", ">= 1"},
		{"tool/zero retention", contracts.SchemaToolDescriptor, "/dedup_retention_ms", 0, "/dedup_retention_ms", ">= 1"},
		{"tool/negative visibility", contracts.SchemaToolDescriptor, "/query_visibility_ms", -1, "/query_visibility_ms", ">= 0"},
		{"tool/arguments not object schema", contracts.SchemaToolDescriptor, "/arguments_schema/type", "array", "/arguments_schema/type", "must be"},
		{"tool/arguments not a schema", contracts.SchemaToolDescriptor, "/arguments_schema/required", "cards", "/arguments_schema/required", "expected array"},
		{"tool/arguments other draft", contracts.SchemaToolDescriptor, "/arguments_schema/$schema", "http://json-schema.org/draft-07/schema#", "/arguments_schema/$schema", "must be"},

		{"rules/valid", contracts.SchemaRules, "/rules/0/tool", "cards.write", "", ""},
		{"rules/empty list", contracts.SchemaRules, "/rules", []any{}, "", ""},
		{"rules/minor version", contracts.SchemaRules, "/schema_version", "1.3", "", ""},
		{"rules/missing rules", contracts.SchemaRules, "/rules", remove, "/rules", "required field is missing"},
		{"rules/missing schema_version", contracts.SchemaRules, "/schema_version", remove, "/schema_version", "required field is missing"},
		{"rules/missing decision", contracts.SchemaRules, "/rules/1/decision", remove, "/rules/1/decision", "required field is missing"},
		{"rules/missing tool", contracts.SchemaRules, "/rules/2/tool", remove, "/rules/2/tool", "required field is missing"},
		{"rules/bad decision", contracts.SchemaRules, "/rules/1/decision", "allow", "/rules/1/decision", "must be one of"},
		{"rules/bad effect", contracts.SchemaRules, "/rules/2/effect", "both", "/rules/2/effect", "must be one of"},
		{"rules/bad tool", contracts.SchemaRules, "/rules/0/tool", "cards.*", "/rules/0/tool", "pattern"},
		{"rules/rules wrong type", contracts.SchemaRules, "/rules", map[string]any{}, "/rules", "expected array"},
		{"rules/ttl wrong type", contracts.SchemaRules, "/rules/0/approval_ttl_ms", "1h", "/rules/0/approval_ttl_ms", "expected integer"},
		{"rules/unknown rule field", contracts.SchemaRules, "/rules/1/priority", 1, "/rules/1/priority", "unknown field"},
		{"rules/ttl without approval", contracts.SchemaRules, "/rules/1/approval_ttl_ms", 1000, "/rules/1/approval_ttl_ms", "not allowed here"},
		{"rules/self approval on auto", contracts.SchemaRules, "/rules/2/allow_self_approval", true, "/rules/2/allow_self_approval", "not allowed here"},

		{"action/valid", contracts.SchemaAction, "/state", "approved", "", ""},
		{"action/no schema_version", contracts.SchemaAction, "/schema_version", remove, "", ""},
		{"action/missing digest", contracts.SchemaAction, "/action_digest", remove, "/action_digest", "required field is missing"},
		{"action/missing arguments", contracts.SchemaAction, "/arguments", remove, "/arguments", "required field is missing"},
		{"action/bad state", contracts.SchemaAction, "/state", "pending", "/state", "must be one of"},
		{"action/bad effect", contracts.SchemaAction, "/effect", "erase", "/effect", "must be one of"},
		{"action/bad id", contracts.SchemaAction, "/id", "act_01JDQ3Z8K4T5V6W7X8Y9Z0ABCI", "/id", "pattern"},
		{"action/bad run id", contracts.SchemaAction, "/run_id", "act_01JDQ3Z8K4T5V6W7X8Y9Z0ABCE", "/run_id", "pattern"},
		{"action/bad digest", contracts.SchemaAction, "/action_digest", "sha256:ABC", "/action_digest", "pattern"},
		{"action/arguments wrong type", contracts.SchemaAction, "/arguments", "[]", "/arguments", "expected object"},
		{"action/bad created_at", contracts.SchemaAction, "/created_at", "yesterday", "/created_at", "not a valid date-time"},
		{"action/unknown field", contracts.SchemaAction, "/approved_by", "alice", "/approved_by", "unknown field"},
		{"action/no gate", contracts.SchemaAction, "/gate", remove, "", ""},
		{"action/no supersedes", contracts.SchemaAction, "/supersedes", remove, "", ""},
		{"action/no attempts yet", contracts.SchemaAction, "/attempts", []any{}, "", ""},
		{"action/gate by rule", contracts.SchemaAction, "/gate/rule", 0, "", ""},
		{"action/missing seq", contracts.SchemaAction, "/seq", remove, "/seq", "required field is missing"},
		{"action/missing version", contracts.SchemaAction, "/version", remove, "/version", "required field is missing"},
		{"action/missing attempts", contracts.SchemaAction, "/attempts", remove, "/attempts", "required field is missing"},
		{"action/missing approvals", contracts.SchemaAction, "/approvals", remove, "/approvals", "required field is missing"},
		{"action/seq zero", contracts.SchemaAction, "/seq", 0, "/seq", "must be >= 1"},
		{"action/bad supersedes", contracts.SchemaAction, "/supersedes", "run_01JDQ3Z8K4T5V6W7X8Y9Z0ABCE", "/supersedes", "pattern"},
		{"action/bad attempt status", contracts.SchemaAction, "/attempts/0/status", "done", "/attempts/0/status", "must be one of"},
		{"action/bad attempt effect", contracts.SchemaAction, "/attempts/0/effect", "maybe", "/attempts/0/effect", "must be one of"},
		{"action/unknown attempt field", contracts.SchemaAction, "/attempts/0/result", "ok", "/attempts/0/result", "unknown field"},
		{"action/bad approval state", contracts.SchemaAction, "/approvals/0/state", "approved", "/approvals/0/state", "must be one of"},
		{"action/gate without digest", contracts.SchemaAction, "/gate/rules_digest", remove, "/gate/rules_digest", "required field is missing"},
		{"action/gate negative rule", contracts.SchemaAction, "/gate/rule", -1, "/gate/rule", "must be >= 0"},

		{"report/valid", contracts.SchemaReport, "/run/tenant", "acme", "", ""},
		{"report/minor version", contracts.SchemaReport, "/schema_version", "1.4", "", ""},
		{"report/no stop reason yet", contracts.SchemaReport, "/run/stop_reason", nil, "", ""},
		{"report/no cancellation", contracts.SchemaReport, "/cancellation", nil, "", ""},
		{"report/cancellation too late", contracts.SchemaReport, "/cancellation/state", "too_late", "", ""},
		{"report/cancellation too late at", contracts.SchemaReport, "/cancellation/too_late_at", "2026-01-02T03:09:47.5Z", "", ""},
		{"report/bad cancellation state", contracts.SchemaReport, "/cancellation/state", "gone", "/cancellation/state", "must be one of"},
		{"report/arguments one marker", contracts.SchemaReport, "/actions/0/arguments", "[redacted:0123abcd]", "", ""},
		{"report/broken chain", contracts.SchemaReport, "/chain/broken_seq", 7, "", ""},
		{"report/missing schema_version", contracts.SchemaReport, "/schema_version", remove, "/schema_version", "required field is missing"},
		{"report/missing timeline", contracts.SchemaReport, "/timeline", remove, "/timeline", "required field is missing"},
		{"report/missing cancellation", contracts.SchemaReport, "/cancellation", remove, "/cancellation", "required field is missing"},
		{"report/unknown field", contracts.SchemaReport, "/secrets", []any{}, "/secrets", "unknown field"},
		{"report/bad run state", contracts.SchemaReport, "/run/state", "exploded", "/run/state", "must be one of"},
		{"report/bad stop reason", contracts.SchemaReport, "/run/stop_reason", "bored", "/run/stop_reason", "must be one of"},
		{"report/bad run id", contracts.SchemaReport, "/run/id", "act_01JDQ3Z8K4T5V6W7X8Y9Z0ABCE", "/run/id", "pattern"},
		{"report/arguments not a marker", contracts.SchemaReport, "/actions/0/arguments", "hunter2", "/actions/0/arguments", ""},
		// Through a $ref the library's message is kept, at the object.
		{"report/attempt without effect", contracts.SchemaReport, "/actions/0/attempts/0/effect", remove, "/actions/0/attempts/0", "missing properties: 'effect'"},
		{"report/attempt bad effect", contracts.SchemaReport, "/actions/0/attempts/0/effect", "maybe", "/actions/0/attempts/0/effect", "must be one of"},
		{"report/bad generated_at", contracts.SchemaReport, "/generated_at", "yesterday", "/generated_at", "is not valid 'date-time'"},
		{"report/bad key id", contracts.SchemaReport, "/redaction/key_id", "the-key", "/redaction/key_id", "pattern"},
		{"report/bad event hash", contracts.SchemaReport, "/timeline/0/hash", "md5:00", "/timeline/0/hash", "pattern"},
		{"report/omitted null", contracts.SchemaReport, "/actions/0/supersedes", remove, "/actions/0", "missing properties: 'supersedes'"},
		{"report/gate", contracts.SchemaReport, "/actions/0/gate", reportGate(2), "", ""},
		{"report/gate of the default", contracts.SchemaReport, "/actions/0/gate", reportGate(nil), "", ""},
		{"report/gate not recorded", contracts.SchemaReport, "/actions/0/gate", nil, "", ""},
		{"report/gate negative rule", contracts.SchemaReport, "/actions/0/gate", reportGate(-1), "/actions/0/gate", ""},
		{"report/gate bad decision", contracts.SchemaReport, "/actions/0/gate", with(reportGate(0), "decision", "running"), "/actions/0/gate", ""},
		{"report/gate without digest", contracts.SchemaReport, "/actions/0/gate", with(reportGate(0), "rules_digest", remove), "/actions/0/gate", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := edit(t, readTestdata(t, validDocs[tt.schema]), tt.ptr, tt.val)
			err := contracts.Validate(tt.schema, doc)
			if tt.wantLoc == "" && tt.wantMsg == "" {
				require.NoError(t, err)
				return
			}
			requireIssue(t, err, tt.wantLoc, tt.wantMsg)
		})
	}
}

// TestValidateValue: a decoded document gets Validate's verdict on its
// text; a value JSON cannot hold is an error of the caller's making.
func TestValidateValue(t *testing.T) {
	for _, schema := range contracts.Schemas() {
		t.Run(schema.String(), func(t *testing.T) {
			doc := readTestdata(t, validDocs[schema])
			require.NoError(t, contracts.ValidateValue(schema, decode(t, doc)))
			for _, b := range [][]byte{
				edit(t, doc, "/unknown_field", 1),
				edit(t, doc, "/schema_version", "2.0"),
				edit(t, doc, "/schema_version", json.Number("1.0")),
			} {
				require.Equal(t, contracts.Validate(schema, b), contracts.ValidateValue(schema, decode(t, b)))
			}
		})
	}
	err := contracts.ValidateValue(contracts.SchemaReport, map[string]any{"schema_version": "1.0", "generated_at": time.Now()})
	require.Error(t, err)
	require.NotErrorIs(t, err, contracts.ErrInvalid)
	require.Error(t, contracts.ValidateValue("no_such_schema", map[string]any{}))
}

func TestValidateUnsupportedVersion(t *testing.T) {
	for _, schema := range contracts.Schemas() {
		for _, version := range []string{"2.0", "0.9", "10.1", "99999999999999999999999.0"} {
			t.Run(schema.String()+"/"+version, func(t *testing.T) {
				// Other problems are not reported: the document follows
				// another contract.
				doc := edit(t, readTestdata(t, validDocs[schema]), "/schema_version", version)
				doc = edit(t, doc, "/from_the_future", true)

				err := contracts.Validate(schema, doc)
				require.ErrorIs(t, err, contracts.ErrUnsupportedVersion)
				require.NotErrorIs(t, err, contracts.ErrInvalid)
				var ve *contracts.VersionError
				require.ErrorAs(t, err, &ve)
				require.Equal(t, schema, ve.Schema)
				require.Equal(t, version, ve.Version)
				require.Contains(t, err.Error(), strconv.Quote(version))
				require.Contains(t, err.Error(), "major version 1")
			})
		}
	}
	err := contracts.Validate(contracts.SchemaRunSubmission, []byte(`{"schema_version":"2.0","agent":"a","input":{}}`))
	require.EqualError(t, err, `contracts: run_submission schema_version "2.0" is not supported (this build reads major version 1)`)
}

func TestValidateNotJSON(t *testing.T) {
	for name, doc := range map[string]string{
		"empty":       "",
		"truncated":   `{"agent": "a"`,
		"garbage":     `agent=a`,
		"two values":  `{"agent": "a", "input": {}} {}`,
		"not object":  `["agent"]`,
		"null":        `null`,
		"bare string": `"1.0"`,
	} {
		t.Run(name, func(t *testing.T) {
			requireIssue(t, contracts.Validate(contracts.SchemaRunSubmission, []byte(doc)), "", "")
		})
	}
}

func TestValidateUnknownSchema(t *testing.T) {
	err := contracts.Validate("no_such_schema", []byte(`{}`))
	require.Error(t, err)
	require.NotErrorIs(t, err, contracts.ErrInvalid)
	require.Nil(t, contracts.SchemaJSON("no_such_schema"))
}

func TestValidationErrorIssuesSorted(t *testing.T) {
	doc := []byte(`{"tenant": "acme", "agent": "No Good", "budgets": {"max_steps": 0, "zzz": 1}, "state": "x"}`)
	err := contracts.Validate(contracts.SchemaRunSubmission, doc)
	var ve *contracts.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "run_submission", ve.Subject)
	locs := make([]string, len(ve.Issues))
	for i, is := range ve.Issues {
		locs[i] = is.Location
		require.NotEmpty(t, is.Message)
	}
	require.Equal(t, []string{"/agent", "/budgets/max_steps", "/budgets/zzz", "/input", "/state", "/tenant"}, locs)
	require.True(t, sort.StringsAreSorted(locs))
	require.Contains(t, err.Error(), "/input: required field is missing")

	// Issues are meant to be shown to clients as JSON.
	b, err := json.Marshal(ve.Issues[0])
	require.NoError(t, err)
	require.JSONEq(t, `{"location": "/agent", "message": "does not match the pattern ^[a-z0-9][a-z0-9._-]*$"}`, string(b))
}

func TestParseRunSubmission(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		s, err := contracts.ParseRunSubmission(readTestdata(t, "run_submission.valid.json"))
		require.NoError(t, err)
		require.Equal(t, "1.0", s.SchemaVersion)
		require.Equal(t, "practice-cards", s.Agent)
		require.JSONEq(t, `{"title": "Go channels", "markdown": "# Go channels\n\n- An unbuffered send blocks until a receiver is ready.\n- Closing a channel wakes every receiver."}`, string(s.Input))
		require.Equal(t, &contracts.Budgets{
			MaxAttemptsPerAction: 3,
			MaxAttemptsPerRun:    10,
			MaxExecutionMS:       60000,
			DeadlineMS:           600000,
			MaxSteps:             20,
			MaxTokens:            50000,
		}, s.Budgets)
		require.Equal(t, time.Minute, s.Budgets.MaxExecution())
		require.Equal(t, 10*time.Minute, s.Budgets.Deadline())
	})
	t.Run("Minimal", func(t *testing.T) {
		s, err := contracts.ParseRunSubmission(readTestdata(t, "run_submission.minimal.json"))
		require.NoError(t, err)
		require.Equal(t, contracts.DefaultVersion, s.SchemaVersion)
		require.Nil(t, s.Budgets)
		require.Zero(t, s.Budgets.Deadline())
		require.Zero(t, s.Budgets.MaxExecution())
	})
	t.Run("RoundTrip", func(t *testing.T) {
		s, err := contracts.ParseRunSubmission(readTestdata(t, "run_submission.valid.json"))
		require.NoError(t, err)
		b, err := json.Marshal(s)
		require.NoError(t, err)
		require.JSONEq(t, string(readTestdata(t, "run_submission.valid.json")), string(b))
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		s, err := contracts.ParseRunSubmission([]byte(`{"agent": "practice-cards", "input": {}, "state": "completed"}`))
		require.Nil(t, s)
		requireIssue(t, err, "/state", "set by the server")
	})
	t.Run("ErrUnsupportedVersion", func(t *testing.T) {
		s, err := contracts.ParseRunSubmission([]byte(`{"schema_version": "2.0", "agent": "practice-cards", "input": {}}`))
		require.Nil(t, s)
		require.ErrorIs(t, err, contracts.ErrUnsupportedVersion)
	})
}

func TestParseToolDescriptor(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		d, err := contracts.ParseToolDescriptor(readTestdata(t, "tool_descriptor.cards_write.json"))
		require.NoError(t, err)
		require.Equal(t, "1.0", d.SchemaVersion)
		require.Equal(t, "cards.write", d.Name)
		require.Equal(t, "1", d.Version)
		require.Equal(t, contracts.EffectWrite, d.Effect)
		require.True(t, d.Effect.Valid())
		require.Equal(t, contracts.Guarantees{Query: true, Dedup: true, Cancel: false}, d.Guarantees)
		require.Empty(t, d.SecretPaths)
		require.Equal(t, int64(5000), d.TimeoutMS)
		require.Equal(t, 5*time.Second, d.Timeout())
		require.Equal(t, 24*time.Hour, d.DedupRetention())
		require.Zero(t, d.QueryVisibility())
		args := decode(t, d.ArgumentsSchema).(map[string]any)
		require.Equal(t, []any{"cards"}, args["required"])
	})
	t.Run("RoundTrip", func(t *testing.T) {
		d, err := contracts.ParseToolDescriptor(readTestdata(t, "tool_descriptor.cards_write.json"))
		require.NoError(t, err)
		b, err := json.Marshal(d)
		require.NoError(t, err)
		again, err := contracts.ParseToolDescriptor(b)
		require.NoError(t, err)
		require.Equal(t, d.Guarantees, again.Guarantees)
		require.Equal(t, d.Timeout(), again.Timeout())
		require.JSONEq(t, string(d.ArgumentsSchema), string(again.ArgumentsSchema))
	})
	t.Run("ExternalRefRefused", func(t *testing.T) {
		doc := edit(t, readTestdata(t, "tool_descriptor.cards_write.json"),
			"/arguments_schema/properties/cards", map[string]any{"$ref": "file:///etc/passwd"})
		require.NoError(t, contracts.Validate(contracts.SchemaToolDescriptor, doc))
		d, err := contracts.ParseToolDescriptor(doc)
		require.Nil(t, d)
		requireIssue(t, err, "/arguments_schema", "does not compile")
	})
	t.Run("InternalRefAllowed", func(t *testing.T) {
		doc := edit(t, readTestdata(t, "tool_descriptor.cards_write.json"),
			"/arguments_schema/properties/cards", map[string]any{"$ref": "#/$defs/cards"})
		doc = edit(t, doc, "/arguments_schema/$defs", map[string]any{"cards": map[string]any{"type": "array"}})
		_, err := contracts.ParseToolDescriptor(doc)
		require.NoError(t, err)
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		doc := edit(t, readTestdata(t, "tool_descriptor.cards_write.json"), "/guarantees/dedup", remove)
		d, err := contracts.ParseToolDescriptor(doc)
		require.Nil(t, d)
		requireIssue(t, err, "/guarantees/dedup", "required field is missing")
	})
}

func TestArgumentValidator(t *testing.T) {
	d, err := contracts.ParseToolDescriptor(readTestdata(t, "tool_descriptor.cards_write.json"))
	require.NoError(t, err)
	v, err := d.ArgumentValidator()
	require.NoError(t, err)

	require.NoError(t, v.Validate([]byte(`{"cards": [{"front": "Q", "back": "A"}]}`)))

	tests := []struct {
		name, args, wantLoc, wantMsg string
	}{
		{"missing back", `{"cards": [{"front": "Q"}]}`, "/cards/0/back", "required field is missing"},
		{"extra field", `{"cards": [{"front": "Q", "back": "A", "hint": "h"}]}`, "/cards/0/hint", "unknown field"},
		{"wrong type", `{"cards": [{"front": "Q", "back": 1}]}`, "/cards/0/back", "expected string"},
		{"no cards", `{"cards": []}`, "/cards", "minimum 1 items"},
		{"not JSON", `{"cards": `, "", "not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := v.Validate([]byte(tt.args))
			requireIssue(t, err, tt.wantLoc, tt.wantMsg)
			require.Contains(t, err.Error(), "arguments of cards.write (version 1)")
		})
	}
}

func TestParseRules(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		r, err := contracts.ParseRules(readTestdata(t, "rules.valid.json"))
		require.NoError(t, err)
		require.Equal(t, "1.0", r.SchemaVersion)
		require.Equal(t, []contracts.Rule{
			{Tool: "cards.write", Tenant: "acme", Decision: contracts.RuleDecisionRequireApproval, ApprovalTTLMS: 3600000},
			{Tool: "payments.refund", Decision: contracts.RuleDecisionDeny},
			{Tool: contracts.Wildcard, Effect: contracts.EffectRead, Decision: contracts.RuleDecisionAutoApprove},
			{Tool: contracts.Wildcard, Tenant: contracts.Wildcard, Effect: contracts.EffectWrite, Decision: contracts.RuleDecisionRequireApproval},
		}, r.Rules)
		require.Equal(t, time.Hour, r.Rules[0].ApprovalTTL())
		require.Zero(t, r.Rules[1].ApprovalTTL())
		for _, rule := range r.Rules {
			require.True(t, rule.Decision.Valid())
		}
		require.False(t, contracts.RuleDecision("allow").Valid())
		require.False(t, contracts.Effect("delete").Valid())
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		r, err := contracts.ParseRules([]byte(`{"schema_version": "1.0", "rules": [{"tool": "*", "decision": "deny", "approval_ttl_ms": 1000.0}]}`))
		require.Nil(t, r)
		requireIssue(t, err, "/rules/0/approval_ttl_ms", "not allowed here")
	})
	t.Run("IntegerWithFraction", func(t *testing.T) {
		r, err := contracts.ParseRules([]byte(`{"schema_version": "1.0", "rules": [{"tool": "*", "decision": "require_approval", "approval_ttl_ms": 1e3}]}`))
		require.Nil(t, r)
		requireIssue(t, err, "/rules/0/approval_ttl_ms", "without fraction or exponent")
	})
}

// TestSchemasAreValid checks every embedded schema against the draft 2020-12
// meta-schema, compiles it on its own, and checks it accepts its testdata.
func TestSchemasAreValid(t *testing.T) {
	meta, err := jsonschema.NewCompiler().Compile("https://json-schema.org/draft/2020-12/schema")
	require.NoError(t, err)
	require.Len(t, contracts.Schemas(), len(validDocs))
	for _, schema := range contracts.Schemas() {
		t.Run(schema.String(), func(t *testing.T) {
			raw := contracts.SchemaJSON(schema)
			require.NotEmpty(t, raw)

			doc := decode(t, raw)
			require.NoError(t, meta.Validate(doc))
			m := doc.(map[string]any)
			require.Equal(t, "https://json-schema.org/draft/2020-12/schema", m["$schema"])
			require.Contains(t, m["$id"], schema.String()+".v1.json")

			// schema_version is declared by every schema, with one pattern.
			props := m["properties"].(map[string]any)
			sv := props["schema_version"].(map[string]any)
			require.Equal(t, "string", sv["type"])
			require.Equal(t, `^[0-9]+\.[0-9]+$`, sv["pattern"])

			c := jsonschema.NewCompiler()
			require.NoError(t, c.AddResource("mem:///"+schema.String()+".json", bytes.NewReader(raw)))
			_, err := c.Compile("mem:///" + schema.String() + ".json")
			require.NoError(t, err)

			require.NoError(t, contracts.Validate(schema, readTestdata(t, validDocs[schema])))

			// The returned bytes are a copy.
			raw[0] = 'x'
			require.Equal(t, byte('{'), contracts.SchemaJSON(schema)[0])
		})
	}
}

// TestTypesMatchSchemas keeps the Go types and the schemas in step: every
// property is a JSON field of the type, and every JSON field is a property.
func TestTypesMatchSchemas(t *testing.T) {
	tests := []struct {
		schema contracts.Schema
		ptr    string
		typ    any
	}{
		{contracts.SchemaRunSubmission, "", contracts.RunSubmission{}},
		{contracts.SchemaRunSubmission, "/properties/budgets", contracts.Budgets{}},
		{contracts.SchemaToolDescriptor, "", contracts.ToolDescriptor{}},
		{contracts.SchemaToolDescriptor, "/properties/guarantees", contracts.Guarantees{}},
		{contracts.SchemaRules, "", contracts.Rules{}},
		{contracts.SchemaRules, "/properties/rules/items", contracts.Rule{}},
		{contracts.SchemaConfig, "", contracts.Config{}},
		{contracts.SchemaConfig, "/properties/agents/items", contracts.ConfigAgent{}},
		{contracts.SchemaConfig, "/properties/agents/items/properties/policies", contracts.AgentPolicies{}},
	}
	for _, tt := range tests {
		typ := reflect.TypeOf(tt.typ)
		t.Run(typ.Name(), func(t *testing.T) {
			var node any = decode(t, contracts.SchemaJSON(tt.schema))
			for _, tok := range strings.Split(tt.ptr, "/")[1:] {
				node = node.(map[string]any)[tok]
			}
			var props []string
			for name := range node.(map[string]any)["properties"].(map[string]any) {
				props = append(props, name)
			}
			var fields []string
			for i := range typ.NumField() {
				name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
				fields = append(fields, name)
			}
			require.ElementsMatch(t, props, fields)
		})
	}
}

func TestValidateConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			schema := contracts.Schemas()[i%len(contracts.Schemas())]
			doc := readTestdata(t, validDocs[schema])
			errs <- contracts.Validate(schema, doc)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	require.NoError(t, d.Decode(&v))
	return v
}

func TestErrorsMatch(t *testing.T) {
	var err error = &contracts.ValidationError{Subject: "x", Issues: []contracts.Issue{{Location: "/a", Message: "m"}}}
	require.True(t, errors.Is(err, contracts.ErrInvalid))
	require.EqualError(t, err, "contracts: invalid x: /a: m")
	err = &contracts.VersionError{Schema: contracts.SchemaRules, Version: "3.1"}
	require.True(t, errors.Is(err, contracts.ErrUnsupportedVersion))
	require.EqualError(t, err, `contracts: rules schema_version "3.1" is not supported (this build reads major version 1)`)
}
