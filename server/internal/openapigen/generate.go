package openapigen

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/invopop/jsonschema"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

const module = "github.com/actionledger/ledger"

// HandWritten is the extension that marks a component schema Generate
// keeps as it is: one that is no Go wire type of the server (its value
// says what it is instead).
const HandWritten = "x-hand-written"

// Roots are the wire types the document's components are reflected from;
// the types they hold become components too.
func Roots() []any {
	return []any{
		server.Problem{}, server.FieldError{},
		server.SubmitResponse{}, server.Run{}, server.RunSummary{}, server.RunList{},
		server.Action{}, server.ActionGate{}, server.Attempt{}, server.Approval{}, server.ApprovalList{},
		server.Cancellation{}, server.CancelRequest{},
		server.DecisionRequest{}, server.DecisionResponse{}, server.ResolveRequest{},
		server.TimelineEvent{}, server.Timeline{}, server.Status{}, server.ResourceMetadata{},
		server.ToolList{}, server.AgentList{},
		server.Usage{}, server.ProposeRequest{}, server.BeginRequest{}, server.BeginResponse{},
		server.HeartbeatRequest{}, server.HeartbeatResponse{}, server.Outcome{},
		server.CompleteRequest{}, server.CompleteResponse{}, server.AbandonRequest{},
		server.ObservationRequest{}, server.Observation{}, server.ObservationResponse{},
		server.Directive{}, server.NextResponse{}, server.FinishRequest{},
	}
}

// Excluded are the wire types of package server that are not components,
// with the reason.
var Excluded = map[string]string{
	"SubmitRequest": "the body of POST /v1/runs is the contracts run_submission schema (RunSubmission)",
	"SubmitBudgets": "part of SubmitRequest",
}

// commentPackages are the packages whose doc comments describe the types
// reflected.
var commentPackages = []string{"server", "ledger", "contracts"}

// enums are the values of the enumerated types on the wire, from the
// packages that own them.
func enums() map[reflect.Type][]string {
	return map[reflect.Type][]string{
		reflect.TypeFor[ledger.RunState]():          strs(ledger.RunStates()),
		reflect.TypeFor[ledger.ActionState]():       strs(ledger.ActionStates()),
		reflect.TypeFor[ledger.AttemptStatus]():     strs(ledger.AttemptStatuses()),
		reflect.TypeFor[ledger.EffectFact]():        strs(ledger.EffectFacts()),
		reflect.TypeFor[ledger.ApprovalState]():     strs(ledger.ApprovalStates()),
		reflect.TypeFor[ledger.CancellationState](): strs(ledger.CancellationStates()),
		reflect.TypeFor[ledger.StopReason]():        strs(ledger.StopReasons()),
		reflect.TypeFor[ledger.ObservationSource](): strs([]ledger.ObservationSource{ledger.ObservedResult,
			ledger.ObservedQuery, ledger.ObservedCancel, ledger.ObservedPerson, ledger.ObservedLate, ledger.ObservedStaleHolder, ledger.ObservedDelivered}),
		reflect.TypeFor[contracts.Effect]():   strs([]contracts.Effect{contracts.EffectRead, contracts.EffectWrite}),
		reflect.TypeFor[contracts.Executor](): strs([]contracts.Executor{contracts.ExecutorClient, contracts.ExecutorBuiltin, contracts.ExecutorHTTP}),
		reflect.TypeFor[engine.Driver]():      strs([]engine.Driver{engine.DriverBuiltin, engine.DriverClient, engine.DriverGateway}),
	}
}

// fieldRules are constraints of fields whose types are not the server's
// own (no struct tag to carry them) or whose list lives in code: keyed
// "Component.property".
func fieldRules() map[string]func(*jsonschema.Schema) {
	one := uint64(1)
	return map[string]func(*jsonschema.Schema){
		"Problem.code":      func(s *jsonschema.Schema) { s.Enum = anys(server.Codes()) },
		"AttemptError.code": func(s *jsonschema.Schema) { s.MinLength = &one },
	}
}

const digestPattern = "^sha256:[0-9a-f]{64}$"

// Generate returns document (openapi.json) with its components.schemas
// reflected from the wire types, the components marked x-hand-written
// kept; everything else of the document is kept as written. root is the
// module's root directory, relative to the working directory: the doc
// comments are read from its source.
func Generate(document []byte, root string) ([]byte, error) {
	doc, err := parse(document)
	if err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	top, _ := doc.(object)
	compsV, _ := top.get("components")
	comps, ok := compsV.(object)
	if !ok {
		return nil, fmt.Errorf("openapi.json: no components")
	}
	old, _ := comps.get("schemas")
	oldSchemas, _ := old.(object)

	generated, err := reflectSchemas(root)
	if err != nil {
		return nil, err
	}
	pathsV, _ := top.get("paths")
	closeRequestBodies(pathsV, generated)
	schemas := map[string]any{}
	for name, s := range generated {
		schemas[name] = s
	}
	for _, m := range oldSchemas {
		s, _ := m.val.(object)
		if _, hand := s.get(HandWritten); !hand {
			continue
		}
		if _, clash := schemas[m.key]; clash {
			return nil, fmt.Errorf("openapi.json: %s is hand-written and a wire type", m.key)
		}
		schemas[m.key] = s
	}

	var out object
	for _, name := range slices.Sorted(maps.Keys(schemas)) {
		out = append(out, member{name, schemas[name]})
	}
	comps.set("schemas", out)
	top.set("components", comps)
	if err := checkRefs(top, schemas); err != nil {
		return nil, err
	}
	return format(top)
}

// reflectSchemas reflects Roots into components, named after their Go
// types.
func reflectSchemas(root string) (map[string]object, error) {
	types := map[string]reflect.Type{}
	var clash error
	enumOf := enums()
	r := &jsonschema.Reflector{
		Anonymous:                 true,
		AllowAdditionalProperties: true, // answers may grow; requests are closed below
		Namer: func(t reflect.Type) string {
			if t.Kind() == reflect.Struct && t.Name() != "" {
				if prev, ok := types[t.Name()]; ok && prev != t && clash == nil {
					clash = fmt.Errorf("openapigen: %s and %s are both component %s", prev, t, t.Name())
				}
				types[t.Name()] = t
			}
			return ""
		},
		Mapper: func(t reflect.Type) *jsonschema.Schema {
			if t == reflect.TypeFor[ledger.Digest]() {
				return &jsonschema.Schema{Type: "string", Pattern: digestPattern}
			}
			if vals, ok := enumOf[t]; ok {
				return &jsonschema.Schema{Type: "string", Enum: anys(vals)}
			}
			return nil
		},
		CommentMap: map[string]string{},
	}
	for _, pkg := range commentPackages {
		if err := addComments(r, root, pkg); err != nil {
			return nil, err
		}
	}
	defs := map[string]*jsonschema.Schema{}
	for _, v := range Roots() {
		s := r.Reflect(v)
		for name, d := range s.Definitions {
			defs[name] = d
		}
	}
	if clash != nil {
		return nil, clash
	}
	rules := fieldRules()
	out := map[string]object{}
	for name, s := range defs {
		t := types[name]
		if t == nil {
			return nil, fmt.Errorf("openapigen: component %s has no Go type", name)
		}
		if err := narrowEnums(t, s, enumOf); err != nil {
			return nil, err
		}
		for key, rule := range rules {
			comp, prop, _ := strings.Cut(key, ".")
			if comp != name {
				continue
			}
			p, ok := s.Properties.Get(prop)
			if !ok {
				return nil, fmt.Errorf("openapigen: rule %s: no such property", key)
			}
			rule(p)
		}
		b, err := json.Marshal(s)
		if err != nil {
			return nil, fmt.Errorf("openapigen: %s: %w", name, err)
		}
		v, err := parse(b)
		if err != nil {
			return nil, fmt.Errorf("openapigen: %s: %w", name, err)
		}
		o, ok := v.(object)
		if !ok {
			return nil, fmt.Errorf("openapigen: %s is not an object schema", name)
		}
		out[name] = tidy(o).(object)
	}
	return out, nil
}

// narrowEnums replaces the list of every field of t whose enum tag names
// some of its type's values by exactly those (the reflector appends them).
func narrowEnums(t reflect.Type, s *jsonschema.Schema, enumOf map[reflect.Type][]string) error {
	for f := range t.Fields() {
		var tagged []string
		for _, kv := range strings.Split(f.Tag.Get("jsonschema"), ",") {
			if v, ok := strings.CutPrefix(kv, "enum="); ok {
				tagged = append(tagged, v)
			}
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if len(tagged) == 0 || name == "" || name == "-" {
			continue
		}
		p, ok := s.Properties.Get(name)
		if !ok {
			return fmt.Errorf("openapigen: %s.%s: no property %s", t.Name(), f.Name, name)
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if all, ok := enumOf[ft]; ok {
			for _, v := range tagged {
				if !slices.Contains(all, v) {
					return fmt.Errorf("openapigen: %s.%s: %q is no %s", t.Name(), f.Name, v, ft)
				}
			}
		}
		p.Enum = anys(tagged)
	}
	return nil
}

// addComments reads the doc comments of the module's package pkg into
// r.CommentMap, under the package's import path, with each comment's
// lines joined.
func addComments(r *jsonschema.Reflector, root, pkg string) error {
	dir := filepath.Join(root, filepath.FromSlash(pkg))
	scratch := &jsonschema.Reflector{}
	// AddGoComments keys a comment by base joined with the file's
	// directory: with no base, by the directory, replaced here by the
	// import path (the walk's subdirectories are other packages).
	if err := scratch.AddGoComments("", dir); err != nil {
		return fmt.Errorf("openapigen: comments of %s: %w", dir, err)
	}
	prefix := filepath.ToSlash(dir) + "."
	for k, v := range scratch.CommentMap {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			r.CommentMap[module+"/"+pkg+"."+rest] = strings.Join(strings.Fields(v), " ")
		}
	}
	return nil
}

// tidy rewrites the reflector's references to components and turns a
// schema of true (any JSON) into {}, which every OpenAPI tool reads.
func tidy(v any) any {
	switch x := v.(type) {
	case object:
		for i, m := range x {
			if m.key == "$ref" {
				if ref, ok := m.val.(string); ok {
					x[i].val = "#/components/schemas/" + strings.TrimPrefix(ref, "#/$defs/")
				}
				continue
			}
			if b, ok := m.val.(bool); ok && b && (m.key == "items" || m.key == "additionalProperties") {
				x[i].val = object{}
				continue
			}
			if m.key == "properties" {
				if props, ok := m.val.(object); ok {
					for j, p := range props {
						if b, ok := p.val.(bool); ok && b {
							props[j].val = object{}
						} else {
							props[j].val = tidy(p.val)
						}
					}
				}
				continue
			}
			x[i].val = tidy(m.val)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = tidy(e)
		}
		return x
	}
	return v
}

// closeRequestBodies closes (additionalProperties false) every generated
// component used as a request body in paths, and every one it refers to.
func closeRequestBodies(paths any, generated map[string]object) {
	var todo []string
	ps, _ := paths.(object)
	for _, item := range ps {
		ops, _ := item.val.(object)
		for _, op := range ops {
			o, _ := op.val.(object)
			rb, ok := o.get("requestBody")
			if !ok {
				continue
			}
			todo = append(todo, refsIn(rb)...)
		}
	}
	closed := map[string]bool{}
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		s, ok := generated[name]
		if !ok || closed[name] {
			continue // hand-written: closed or not as written
		}
		closed[name] = true
		s.set("additionalProperties", false)
		generated[name] = s
		todo = append(todo, refsIn(s)...)
	}
}

// refsIn returns the component names v refers to.
func refsIn(v any) []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case object:
			for _, m := range x {
				if ref, ok := m.val.(string); ok && m.key == "$ref" {
					if name, ok := strings.CutPrefix(ref, "#/components/schemas/"); ok {
						out = append(out, name)
					}
					continue
				}
				walk(m.val)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

// checkRefs fails on a reference to a component schema that is not there,
// and on a generated root nothing refers to.
func checkRefs(doc object, schemas map[string]any) error {
	used := map[string]bool{}
	for _, name := range refsIn(doc) {
		if _, ok := schemas[name]; !ok {
			return fmt.Errorf("openapi.json: #/components/schemas/%s: no such component", name)
		}
		used[name] = true
	}
	for _, v := range Roots() {
		if name := reflect.TypeOf(v).Name(); !used[name] {
			return fmt.Errorf("openapi.json: component %s is generated but nothing refers to it", name)
		}
	}
	return nil
}

func strs[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

func anys(vs []string) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = v
	}
	return out
}
