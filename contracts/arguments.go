package contracts

import (
	"bytes"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// ArgumentValidator checks a tool's arguments against the arguments_schema
// of its descriptor. Build it once per descriptor; it is safe for
// concurrent use.
type ArgumentValidator struct {
	subject string
	doc     any
	schema  *jsonschema.Schema
}

// ArgumentValidator compiles the descriptor's arguments schema. The schema
// must be self-contained: references to other documents are refused, never
// fetched. A schema that does not compile fails with a *ValidationError
// (ErrInvalid) located at /arguments_schema.
func (d *ToolDescriptor) ArgumentValidator() (*ArgumentValidator, error) {
	invalid := func(msg string) error {
		return &ValidationError{Subject: SchemaToolDescriptor.String(), Issues: []Issue{{
			Location: "/arguments_schema", Message: msg,
		}}}
	}
	doc, err := decodeJSON(d.ArgumentsSchema)
	if err != nil {
		return nil, invalid(err.Error())
	}
	sch, err := compileArguments(d.ArgumentsSchema, d.Name)
	if err != nil {
		return nil, invalid("does not compile: " + err.Error())
	}
	return &ArgumentValidator{
		subject: fmt.Sprintf("arguments of %s (version %s)", d.Name, d.Version),
		doc:     doc,
		schema:  sch,
	}, nil
}

// compileArguments compiles one arguments schema with its own compiler, so
// descriptors cannot see each other's resources.
func compileArguments(raw []byte, name string) (sch *jsonschema.Schema, err error) {
	// The library panics on a regular expression it cannot compile when
	// meta-validation lets one through; turn that into an error, since the
	// schema comes from outside this package.
	defer func() {
		if r := recover(); r != nil {
			sch, err = nil, fmt.Errorf("%v", r)
		}
	}()
	c := newCompiler()
	url := "mem:///tools/" + name + "/arguments.json"
	if err := c.AddResource(url, bytes.NewReader(raw)); err != nil {
		return nil, err
	}
	return c.Compile(url)
}

// Validate checks one arguments document. Problems come back as a
// *ValidationError (ErrInvalid) whose Subject names the tool.
func (v *ArgumentValidator) Validate(args []byte) error {
	inst, err := decodeJSON(args)
	if err != nil {
		return &ValidationError{Subject: v.subject, Issues: []Issue{{Message: err.Error()}}}
	}
	if issues := numberIssues(inst, ""); len(issues) > 0 {
		return &ValidationError{Subject: v.subject, Issues: sortIssues(issues)}
	}
	if err := v.schema.Validate(inst); err != nil {
		return validationError(v.subject, v.doc, inst, err, nil)
	}
	return nil
}
