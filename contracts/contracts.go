package contracts

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// Schema names one of the embedded schemas. Its text is the file name
// without the major-version suffix: SchemaRunSubmission is
// schemas/run_submission.v1.json.
type Schema string

// The embedded schemas.
const (
	// SchemaRunSubmission is the body of POST /v1/runs. schema_version may
	// be absent.
	SchemaRunSubmission Schema = "run_submission"
	// SchemaToolDescriptor describes a tool, its arguments and guarantees.
	// schema_version is required.
	SchemaToolDescriptor Schema = "tool_descriptor"
	// SchemaRules is an ordered list of approval rules. schema_version is
	// required.
	SchemaRules Schema = "rules"
	// SchemaAction is an action as the API shows it. schema_version may be
	// absent.
	SchemaAction Schema = "action"
	// SchemaReport is a run's redacted evidence report (package evidence).
	// schema_version is required.
	SchemaReport Schema = "report"
	// SchemaFaultMatrixReport is what `ledger faultmatrix run --report`
	// writes. schema_version is required.
	SchemaFaultMatrixReport Schema = "faultmatrix_report"
	// SchemaConfig is the operator's config file (ledger serve --config):
	// tools, agents and rules. schema_version is required. The schema
	// checks each part; ParseConfig also checks the rules against
	// SchemaRules and that the names agree.
	SchemaConfig Schema = "config"
)

// SupportedMajor is the major schema version this build reads. Any minor
// version of it is accepted: minor versions are forward-compatible.
const SupportedMajor = 1

// DefaultVersion is what an absent schema_version means, where a schema
// allows it to be absent.
const DefaultVersion = "1.0"

// CurrentVersion is the schema_version this build writes.
const CurrentVersion = "1.0"

//go:embed schemas/*.json
var schemaFS embed.FS

var allSchemas = []Schema{SchemaRunSubmission, SchemaToolDescriptor, SchemaRules, SchemaAction, SchemaReport, SchemaFaultMatrixReport,
	SchemaConfig}

// compiledSchema is one embedded schema, ready to validate with. It is
// built once at init and never changed, so sharing it is safe.
type compiledSchema struct {
	raw    []byte
	doc    any // the decoded schema, to name missing and unknown fields
	schema *jsonschema.Schema
	arrays []splitArray // top-level arrays validated item by item (split.go)
}

// compiled holds every embedded schema. A schema that does not compile is a
// build bug, so it panics at init rather than failing the first request.
var compiled = mustCompileAll()

func mustCompileAll() map[Schema]*compiledSchema {
	c := newCompiler()
	out := make(map[Schema]*compiledSchema, len(allSchemas))
	for _, s := range allSchemas {
		cs, err := compileEmbedded(c, s)
		if err != nil {
			panic(fmt.Sprintf("contracts: embedded schema %s: %v", s, err))
		}
		out[s] = cs
	}
	return out
}

func compileEmbedded(c *jsonschema.Compiler, s Schema) (*compiledSchema, error) {
	raw, err := schemaFS.ReadFile("schemas/" + s.fileName())
	if err != nil {
		return nil, err
	}
	doc, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	m, _ := doc.(map[string]any)
	id, _ := m["$id"].(string)
	if id == "" {
		return nil, errors.New("no $id")
	}
	if err := c.AddResource(id, bytes.NewReader(raw)); err != nil {
		return nil, err
	}
	sch, err := c.Compile(id)
	if err != nil {
		return nil, err
	}
	arrays, err := splitArrays(c, id, m)
	if err != nil {
		return nil, err
	}
	return &compiledSchema{raw: raw, doc: doc, schema: sch, arrays: arrays}, nil
}

// newCompiler returns a compiler for draft 2020-12 that asserts formats
// (date-time is checked, not just annotated) and loads nothing from disk or
// network: the draft meta-schemas are built into the library, and every
// other reference must resolve inside the document.
func newCompiler() *jsonschema.Compiler {
	c := jsonschema.NewCompiler()
	c.Draft = jsonschema.Draft2020
	c.AssertFormat = true
	c.LoadURL = func(url string) (io.ReadCloser, error) {
		return nil, fmt.Errorf("reference to %s: only references inside the schema are allowed", url)
	}
	return c
}

func (s Schema) fileName() string {
	return fmt.Sprintf("%s.v%d.json", s, SupportedMajor)
}

// String returns the schema's name.
func (s Schema) String() string { return string(s) }

// Schemas lists the embedded schemas in a fixed order.
func Schemas() []Schema {
	return append([]Schema(nil), allSchemas...)
}

// SchemaJSON returns the raw JSON of an embedded schema, or nil for an
// unknown one. The caller owns the returned bytes.
func SchemaJSON(schema Schema) []byte {
	cs, ok := compiled[schema]
	if !ok {
		return nil
	}
	return bytes.Clone(cs.raw)
}

// Validate checks doc against schema.
//
// schema_version is checked first: a major version other than
// SupportedMajor fails with a *VersionError (ErrUnsupportedVersion) and
// nothing else is checked, because the rest of the document follows another
// contract. An absent schema_version means DefaultVersion where the schema
// allows absence. Then the whole document is checked, and every problem is
// reported in one *ValidationError (ErrInvalid); a document that is not JSON
// fails the same way, and so does one holding a number longer than 100
// characters, with an exponent beyond ±1000 or out of range of an IEEE 754
// double (reported alone: the schema library cannot check such numbers).
// An unknown schema is an error matching neither.
func Validate(schema Schema, doc []byte) error {
	cs, ok := compiled[schema]
	if !ok {
		return fmt.Errorf("contracts: unknown schema %q", schema)
	}
	v, err := decodeJSON(doc)
	if err != nil {
		return &ValidationError{Subject: schema.String(), Issues: []Issue{{Message: err.Error()}}}
	}
	return cs.validate(schema, v)
}

// ValidateValue is Validate for a document its caller already holds as a
// value, in the form encoding/json decodes JSON into an any with UseNumber:
// map[string]any, []any, string, json.Number, bool and nil (any other Go
// number is taken as a number too). It saves a writer encoding a document,
// decoding the text and walking the result, when it can build the value
// directly; the value must then be what its text decodes to, or the check
// is of something else. A value of another type is an error matching
// neither ErrInvalid nor ErrUnsupportedVersion.
func ValidateValue(schema Schema, doc any) error {
	cs, ok := compiled[schema]
	if !ok {
		return fmt.Errorf("contracts: unknown schema %q", schema)
	}
	return cs.validate(schema, doc)
}

// validate is Validate of the decoded document v.
func (cs *compiledSchema) validate(schema Schema, v any) error {
	if err := checkVersion(schema, v); err != nil {
		return err
	}
	subject := schema.String()
	if issues := numberIssues(v, ""); len(issues) > 0 {
		return &ValidationError{Subject: subject, Issues: sortIssues(issues)}
	}
	rest, parts := cs.split(v)
	var issues []Issue
	if err := cs.schema.Validate(rest); err != nil {
		is, err := issuesOf(subject, cs.doc, rest, err, serverOwned[schema])
		if err != nil {
			return err
		}
		issues = is
	}
	for _, p := range parts {
		is, err := p.issues(subject)
		if err != nil {
			return err
		}
		issues = append(issues, is...)
	}
	if len(issues) > 0 {
		return &ValidationError{Subject: subject, Issues: sortIssues(issues)}
	}
	// The split arrays' items lie behind a "$ref", which plainIntegers
	// does not follow either: rest is all it would look at.
	if issues := plainIntegers(cs.doc, rest, ""); len(issues) > 0 {
		return &ValidationError{Subject: subject, Issues: sortIssues(issues)}
	}
	return nil
}

// Bounds of the numbers a document may hold. The schema library checks
// numbers exactly, with math/big: an exponent past a million made it
// dereference nil (a panic, answered 500), and a number of many digits
// costs seconds of CPU (a million digits, five). The bounds lie far beyond
// what an IEEE 754 double needs (at most 24 characters and an exponent of
// 324 in shortest form), which is all a number carries through canonical
// JSON (RFC 8785) anyway.
const (
	maxNumberLength   = 100
	maxNumberExponent = 1000
)

// numberIssues finds the numbers of v the schema library could not check
// safely, or that no IEEE 754 double holds, with their locations.
func numberIssues(v any, loc string) []Issue {
	switch x := v.(type) {
	case json.Number:
		if msg := numberProblem(string(x)); msg != "" {
			return []Issue{{Location: loc, Message: msg}}
		}
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return []Issue{{Location: loc, Message: "not a finite number"}}
		}
	case float32:
		return numberIssues(float64(x), loc)
	case map[string]any:
		var out []Issue
		for name, val := range x {
			out = append(out, numberIssues(val, loc+"/"+escapeToken(name))...)
		}
		return out
	case []any:
		var out []Issue
		for i, val := range x {
			out = append(out, numberIssues(val, loc+"/"+strconv.Itoa(i))...)
		}
		return out
	}
	return nil
}

// numberProblem says what is wrong with the JSON number s, or "".
func numberProblem(s string) string {
	if len(s) > maxNumberLength {
		return fmt.Sprintf("number longer than %d characters", maxNumberLength)
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		if exp, err := strconv.Atoi(s[i+1:]); err != nil || exp < -maxNumberExponent || exp > maxNumberExponent {
			return fmt.Sprintf("number with an exponent beyond ±%d", maxNumberExponent)
		}
	}
	if f, err := strconv.ParseFloat(s, 64); err != nil || math.IsInf(f, 0) {
		return "number out of range of an IEEE 754 double"
	}
	return ""
}

var plainInteger = regexp.MustCompile(`^-?[0-9]+$`)

// plainIntegers finds integers written with a fraction or an exponent
// (5000.0, 5e3). JSON Schema accepts them as integers, but Go's decoder and
// some clients do not, so this package refuses them with a clear message
// rather than failing later in decoding. It follows "properties" and
// "items", which is all the embedded schemas use.
func plainIntegers(schemaNode, inst any, loc string) []Issue {
	sch, ok := schemaNode.(map[string]any)
	if !ok {
		return nil
	}
	switch x := inst.(type) {
	case json.Number:
		if sch["type"] == "integer" && !plainInteger.MatchString(string(x)) {
			return []Issue{{Location: loc, Message: "must be an integer written without fraction or exponent"}}
		}
	case map[string]any:
		props, _ := sch["properties"].(map[string]any)
		var out []Issue
		for name, val := range x {
			out = append(out, plainIntegers(props[name], val, loc+"/"+escapeToken(name))...)
		}
		return out
	case []any:
		var out []Issue
		for i, val := range x {
			out = append(out, plainIntegers(sch["items"], val, loc+"/"+strconv.Itoa(i))...)
		}
		return out
	}
	return nil
}

var versionPattern = regexp.MustCompile(`^([0-9]+)\.[0-9]+$`)

// checkVersion refuses a well-formed schema_version of another major
// version. An absent or malformed one is left to the schema, which reports
// it with the other problems.
func checkVersion(schema Schema, v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	version, ok := m["schema_version"].(string)
	if !ok {
		return nil
	}
	sub := versionPattern.FindStringSubmatch(version)
	if sub == nil {
		return nil
	}
	// A major too large for uint64 is unsupported too: err != nil.
	if major, err := strconv.ParseUint(sub[1], 10, 64); err != nil || major != SupportedMajor {
		return &VersionError{Schema: schema, Version: version}
	}
	return nil
}

// decodeJSON decodes one JSON value, keeping numbers as json.Number so that
// integers keep their precision. Anything after the value is an error.
func decodeJSON(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		switch {
		case errors.Is(err, io.EOF):
			return nil, errors.New("empty document")
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, errors.New("not valid JSON: unexpected end of input")
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("not valid JSON at byte %d: %s", se.Offset, se.Error())
		}
		return nil, fmt.Errorf("not valid JSON: %s", trimJSONPrefix(err.Error()))
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("not valid JSON: data after the value")
	}
	return v, nil
}

func trimJSONPrefix(s string) string {
	const p = "json: "
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// serverOwned lists, per schema, top-level fields a client may not set
// because the server owns them; an attempt gets a clearer message than
// "unknown field".
var serverOwned = map[Schema]map[string]bool{
	SchemaRunSubmission: {
		"id": true, "tenant": true, "state": true, "stop_reason": true,
		"created_at": true, "updated_at": true, "actions": true,
		"digest": true, "request_digest": true, "action_digest": true,
	},
}
