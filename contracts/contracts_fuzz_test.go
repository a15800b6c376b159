package contracts_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
)

// seedsFor returns the example documents of testdata whose name starts
// with prefix and the edge cases every document decoder meets.
func seedsFor(f *testing.F, prefix string) [][]byte {
	f.Helper()
	var out [][]byte
	files, err := filepath.Glob(filepath.Join("testdata", prefix+"*.json"))
	require.NoError(f, err)
	require.NotEmpty(f, files, "testdata has examples of %s", prefix)
	for _, name := range files {
		b, err := os.ReadFile(name)
		require.NoError(f, err)
		out = append(out, b)
	}
	for _, s := range []string{``, `null`, `[]`, `{}`, `{"schema_version": "2.0"}`, `{"schema_version": "1.99999"}`,
		`{"schema_version": "99999999999999999999999.0"}`, `{"schema_version": 1}`, `{"a":1}x`, `{"a":`, "\xff",
		`{"schema_version": "1.0", "rules": [{"tool": "*", "decision": "deny", "approval_ttl_ms": 5}]}`,
		`{"schema_version": "1.0", "rules": [{"tool": "*", "decision": "require_approval", "approval_ttl_ms": 5e3}]}`,
		`{"schema_version": "1.0", "rules": [{"tool": "*", "decision": "require_approval", "approval_ttl_ms": 99999999999999999999}]}`,
		`{"agent": "practice-cards", "input": {}, "budgets": {"max_steps": 1.5}}`,
		`{"agent": "practice-cards", "input": {}, "budgets": {"max_steps": 9223372036854775808}}`,
		`{"agent": "practice-cards", "input": {}, "state": "completed"}`,
	} {
		out = append(out, []byte(s))
	}
	return out
}

// addAll adds each document to f's corpus.
func addAll(f *testing.F, docs [][]byte) {
	for _, d := range docs {
		f.Add(d)
	}
}

// requireRefusal checks that err is a refusal a caller can show: a
// *ValidationError (ErrInvalid) with at least one located issue and a
// message each, or a *VersionError (ErrUnsupportedVersion), and never both.
func requireRefusal(t *testing.T, err error) {
	t.Helper()
	var ve *contracts.ValidationError
	var vv *contracts.VersionError
	switch {
	case errors.As(err, &ve):
		require.ErrorIs(t, err, contracts.ErrInvalid)
		require.NotErrorIs(t, err, contracts.ErrUnsupportedVersion)
		require.NotEmpty(t, ve.Issues, "a validation error without issues: %v", err)
		for _, is := range ve.Issues {
			require.NotEmpty(t, is.Message, "issue at %q without a message", is.Location)
			require.True(t, is.Location == "" || strings.HasPrefix(is.Location, "/"), "location %q is not a JSON pointer", is.Location)
		}
	case errors.As(err, &vv):
		require.ErrorIs(t, err, contracts.ErrUnsupportedVersion)
		require.NotErrorIs(t, err, contracts.ErrInvalid)
		require.NotEmpty(t, vv.Version)
	default:
		t.Fatalf("refusal is neither a ValidationError nor a VersionError: %T %v", err, err)
	}
}

// decodeNumbers decodes doc as Validate does, keeping numbers exact.
func decodeNumbers(t *testing.T, doc []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v))
	return v
}

// FuzzValidate checks every embedded schema with any document: a refusal
// is typed and says where, an accepted document stays accepted once
// decoded and written again (whitespace, key order and number spelling of
// the encoder do not matter), and Validate agrees with ValidateValue on
// the decoded value.
func FuzzValidate(f *testing.F) {
	schemas := contracts.Schemas()
	for _, doc := range seedsFor(f, "") {
		for i := range schemas {
			f.Add(uint8(i), doc)
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, doc []byte) {
		schema := schemas[int(which)%len(schemas)]
		err := contracts.Validate(schema, doc)
		if err != nil {
			requireRefusal(t, err)
			return
		}
		v := decodeNumbers(t, doc)
		require.NoError(t, contracts.ValidateValue(schema, v), "ValidateValue refuses what Validate accepts")
		again, err := json.Marshal(v)
		require.NoError(t, err)
		require.NoError(t, contracts.Validate(schema, again), "accepted %s, refused it re-encoded as %s", doc, again)
	})
}

// FuzzValidateReport is FuzzValidate for evidence reports alone, from the
// example report: the report.v1 schema is the one decoder of report files
// there is so far.
func FuzzValidateReport(f *testing.F) {
	addAll(f, seedsFor(f, "report"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		err := contracts.Validate(contracts.SchemaReport, doc)
		if err != nil {
			requireRefusal(t, err)
			return
		}
		again, err := json.Marshal(decodeNumbers(t, doc))
		require.NoError(t, err)
		require.NoError(t, contracts.Validate(contracts.SchemaReport, again))
	})
}

// sameJSON reports whether two raw documents hold the same value, however
// each is spelled (white space, key order, escapes such as \u0026 for &,
// which encoding/json writes).
func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return reflect.DeepEqual(decodeNumbers(t, a), decodeNumbers(t, b))
}

// FuzzParseRules: accepted rules round-trip (parse, encode, parse gives the
// same rules); anything refused is refused with a typed error, never with
// a decoding error past a validation that passed.
func FuzzParseRules(f *testing.F) {
	addAll(f, seedsFor(f, "rules"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		r, err := contracts.ParseRules(doc)
		if err != nil {
			require.Nil(t, r)
			requireRefusal(t, err)
			return
		}
		for _, rule := range r.Rules {
			require.True(t, rule.Decision.Valid(), "decision %q", rule.Decision)
			require.True(t, rule.Effect == "" || rule.Effect.Valid(), "effect %q", rule.Effect)
			require.GreaterOrEqual(t, rule.ApprovalTTLMS, int64(0))
		}
		b, err := json.Marshal(r)
		require.NoError(t, err)
		back, err := contracts.ParseRules(b)
		require.NoError(t, err, "rules %s encoded as %s are refused", doc, b)
		require.Equal(t, r, back)
	})
}

// FuzzParseRunSubmission: the run_submission contract of POST /v1/runs as
// a typed decoder; accepted submissions round-trip and their budgets are
// never negative.
func FuzzParseRunSubmission(f *testing.F) {
	addAll(f, seedsFor(f, "run_submission"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		s, err := contracts.ParseRunSubmission(doc)
		if err != nil {
			require.Nil(t, s)
			requireRefusal(t, err)
			return
		}
		require.NotEmpty(t, s.SchemaVersion, "an absent schema_version becomes the default")
		if b := s.Budgets; b != nil {
			for _, v := range []int64{b.MaxAttemptsPerAction, b.MaxAttemptsPerRun, b.MaxExecutionMS, b.DeadlineMS, b.MaxSteps, b.MaxTokens} {
				require.GreaterOrEqual(t, v, int64(0))
			}
			require.GreaterOrEqual(t, b.MaxExecution(), 0*b.MaxExecution(), "the duration does not overflow")
			require.GreaterOrEqual(t, b.Deadline(), 0*b.Deadline(), "the duration does not overflow")
		}
		b, err := json.Marshal(s)
		require.NoError(t, err)
		back, err := contracts.ParseRunSubmission(b)
		require.NoError(t, err, "submission %s encoded as %s is refused", doc, b)
		require.True(t, sameJSON(t, s.Input, back.Input), "input %s came back as %s", s.Input, back.Input)
		s.Input, back.Input = nil, nil
		require.Equal(t, s, back)
	})
}

// FuzzParseToolDescriptor: a descriptor is accepted only with an arguments
// schema that compiles; accepted descriptors round-trip, and the library
// never panics on an arguments schema from outside.
func FuzzParseToolDescriptor(f *testing.F) {
	addAll(f, seedsFor(f, "tool_descriptor"))
	f.Add([]byte(`{"schema_version":"1.0","name":"x.y","version":"1","effect":"write","arguments_schema":{"type":"string","pattern":"("},` +
		`"guarantees":{"query":false,"dedup":false,"cancel":false},"timeout_ms":1}`))
	f.Add([]byte(`{"schema_version":"1.0","name":"x.y","version":"1","effect":"write","arguments_schema":{"$ref":"https://example.com/x"},` +
		`"guarantees":{"query":false,"dedup":false,"cancel":false},"timeout_ms":1}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		d, err := contracts.ParseToolDescriptor(doc)
		if err != nil {
			require.Nil(t, d)
			requireRefusal(t, err)
			return
		}
		_, err = d.ArgumentValidator()
		require.NoError(t, err)
		b, err := json.Marshal(d)
		require.NoError(t, err)
		back, err := contracts.ParseToolDescriptor(b)
		require.NoError(t, err, "descriptor %s encoded as %s is refused", doc, b)
		require.True(t, sameJSON(t, d.ArgumentsSchema, back.ArgumentsSchema), "arguments schema %s came back as %s", d.ArgumentsSchema, back.ArgumentsSchema)
		d.ArgumentsSchema, back.ArgumentsSchema = nil, nil
		if len(d.SecretPaths) == 0 { // "secret_paths": [] is written as absent (omitempty)
			d.SecretPaths = nil
		}
		require.True(t, reflect.DeepEqual(d, back), "round trip changed the descriptor:\n%+v\n%+v", d, back)
	})
}

// FuzzParseConfig: a config file, read as JSON or as YAML, is parsed or
// refused with located issues (or a version error), never with a panic or
// an untyped error.
func FuzzParseConfig(f *testing.F) {
	addAll(f, seedsFor(f, "config"))
	for _, s := range []string{configYAML, "a: &x [*x]\n", "schema_version: \"1.0\"\ntools: [{name: a, name: b}]\n",
		"schema_version: \"1.0\"\n<<: {tools: []}\n", "? [a]\n: b\n", "schema_version: !!binary aGk=\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		for _, parse := range []func([]byte, contracts.ConfigOptions) (*contracts.Config, error){
			contracts.ParseConfig, contracts.ParseConfigYAML,
		} {
			c, err := parse(doc, buildOptions)
			if err != nil {
				require.Nil(t, c)
				requireRefusal(t, err)
				continue
			}
			require.NotNil(t, c)
			require.NotEmpty(t, c.SchemaVersion)
		}
	})
}
