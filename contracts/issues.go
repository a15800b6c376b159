package contracts

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// validationError turns the library's error tree into a *ValidationError:
// one Issue per leaf, with missing and unknown fields pointed at by name.
// schemaDoc and instance are the decoded schema and document; owned lists
// top-level fields the server sets.
func validationError(subject string, schemaDoc, instance any, err error, owned map[string]bool) error {
	issues, err := issuesOf(subject, schemaDoc, instance, err, owned)
	if err != nil {
		return err
	}
	return &ValidationError{Subject: subject, Issues: sortIssues(issues)}
}

// issuesOf is validationError's list of issues, unsorted; the error is
// set when err is not the library's *ValidationError.
func issuesOf(subject string, schemaDoc, instance any, err error, owned map[string]bool) ([]Issue, error) {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		// Infinite loops and non-JSON values cannot come from decoded JSON
		// and a compiled schema; if they do, it is our bug, not the caller's.
		return nil, fmt.Errorf("contracts: validate %s: %w", subject, err)
	}
	var issues []Issue
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			issues = append(issues, leafIssues(e, schemaDoc, instance, owned)...)
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	if len(issues) == 0 {
		issues = []Issue{{Location: ve.InstanceLocation, Message: ve.Message}}
	}
	return issues, nil
}

// leafIssues explains one failed keyword. required and
// additionalProperties become one issue per field, located at the field;
// where the schema cannot be followed (a $ref), the library's message is
// kept at the object's location.
func leafIssues(e *jsonschema.ValidationError, schemaDoc, instance any, owned map[string]bool) []Issue {
	loc := e.InstanceLocation
	parentKw, keyword := splitLast(e.KeywordLocation)
	switch keyword {
	case "required":
		sch, _ := lookup(schemaDoc, parentKw).(map[string]any)
		obj, _ := lookup(instance, loc).(map[string]any)
		required, _ := sch["required"].([]any)
		if sch == nil || obj == nil {
			break
		}
		var out []Issue
		for _, r := range required {
			name, _ := r.(string)
			if _, ok := obj[name]; !ok {
				out = append(out, Issue{Location: loc + "/" + escapeToken(name), Message: "required field is missing"})
			}
		}
		if len(out) > 0 {
			return out
		}
	case "additionalProperties":
		sch, _ := lookup(schemaDoc, parentKw).(map[string]any)
		obj, _ := lookup(instance, loc).(map[string]any)
		if sch == nil || obj == nil {
			break
		}
		props, _ := sch["properties"].(map[string]any)
		var out []Issue
		for name := range obj {
			if _, ok := props[name]; ok {
				continue
			}
			msg := "unknown field"
			if loc == "" && owned[name] {
				msg = "set by the server; cannot be submitted"
			}
			out = append(out, Issue{Location: loc + "/" + escapeToken(name), Message: msg})
		}
		if len(out) > 0 {
			return out
		}
	}
	msg := e.Message
	switch {
	case msg == "not allowed": // a false schema: the field may not appear here
		msg = "not allowed here"
	case keyword == "format":
		if f, ok := lookup(schemaDoc, e.KeywordLocation).(string); ok {
			msg = "is not a valid " + f
		}
	case bounds[keyword] != "":
		// The library prints bounds as floats (3.1536e+11); print them as
		// written in the schema.
		if b, ok := lookup(schemaDoc, e.KeywordLocation).(json.Number); ok {
			msg = fmt.Sprintf("must be %s %s", bounds[keyword], b)
			if got, ok := lookup(instance, loc).(json.Number); ok {
				msg += fmt.Sprintf(", got %s", got)
			}
		}
	case keyword == "pattern":
		// The library quotes the pattern Go-style, doubling backslashes.
		if p, ok := lookup(schemaDoc, e.KeywordLocation).(string); ok {
			msg = "does not match the pattern " + p
		}
	}
	return []Issue{{Location: loc, Message: msg}}
}

var bounds = map[string]string{
	"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<",
}

func sortIssues(issues []Issue) []Issue {
	sort.Slice(issues, func(i, j int) bool {
		if issues[i].Location != issues[j].Location {
			return issues[i].Location < issues[j].Location
		}
		return issues[i].Message < issues[j].Message
	})
	out := issues[:0]
	for i, is := range issues {
		if i > 0 && is == issues[i-1] {
			continue
		}
		out = append(out, is)
	}
	return out
}

// splitLast splits a JSON Pointer into its parent and its last token.
func splitLast(ptr string) (parent, last string) {
	i := strings.LastIndexByte(ptr, '/')
	if i < 0 {
		return "", ptr
	}
	return ptr[:i], unescapeToken(ptr[i+1:])
}

// lookup resolves a JSON Pointer in a decoded JSON value, or returns nil.
func lookup(v any, ptr string) any {
	if ptr == "" {
		return v
	}
	if ptr[0] != '/' {
		return nil
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = unescapeToken(tok)
		switch x := v.(type) {
		case map[string]any:
			v = x[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

func escapeToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func unescapeToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
}
