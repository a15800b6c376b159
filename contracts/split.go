package contracts

import (
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// A large document is mostly one array: an evidence report holds an event
// of its run's timeline per fact, ten thousand and more. The library
// validates each item of "items": {"$ref": …} through the reference, one
// level deeper than the item's own schema, paying for every location
// string and bookkeeping map of that level, under a document-long
// location. So where a top-level property is exactly an array of one
// reference into "$defs", Validate checks its items one by one against the
// referenced schema, compiled on its own, and the rest of the document with
// that array empty. The verdict and the issues are the same as validating
// the whole document at once (TestSplitValidationIsWholeValidation): an
// array's items are valid exactly when each is valid against "items", and
// splitArrays allows no keyword whose result could depend on the split.

// splitArray is a top-level property whose items are validated one by one.
type splitArray struct {
	name  string
	items *jsonschema.Schema // the schema "items" refers to
}

// rootKeywords are the keywords a schema's root may use for its arrays to
// be split: none of them looks into a property's value.
var rootKeywords = map[string]bool{
	"$schema": true, "$id": true, "$defs": true, "$comment": true, "title": true, "description": true,
	"type": true, "required": true, "properties": true, "additionalProperties": true,
}

// arrayKeywords are the keywords a split array's schema may use: its type,
// its items and annotations.
var arrayKeywords = map[string]bool{
	"type": true, "items": true, "$comment": true, "title": true, "description": true,
}

// dynamicKeywords make a subschema's verdict depend on where validation
// came from (dynamic scope) or on what other subschemas evaluated; a schema
// that uses any of them anywhere is validated whole.
var dynamicKeywords = map[string]bool{
	"$dynamicRef": true, "$dynamicAnchor": true, "$recursiveRef": true, "$recursiveAnchor": true,
	"unevaluatedProperties": true, "unevaluatedItems": true,
}

// splitArrays finds the top-level properties of the schema id (decoded as
// root) whose items can be validated one by one, and compiles the schema
// each one's items refer to.
func splitArrays(c *jsonschema.Compiler, id string, root map[string]any) ([]splitArray, error) {
	if usesAny(root, dynamicKeywords) {
		return nil, nil
	}
	for k, v := range root {
		if !rootKeywords[k] {
			return nil, nil
		}
		if _, ok := v.(bool); k == "additionalProperties" && !ok {
			return nil, nil // a schema for additional properties: keep it simple
		}
	}
	props, _ := root["properties"].(map[string]any)
	var out []splitArray
	for name, p := range props {
		node, _ := p.(map[string]any)
		if node == nil || node["type"] != "array" {
			continue
		}
		simple := true
		for k := range node {
			simple = simple && arrayKeywords[k]
		}
		items, _ := node["items"].(map[string]any)
		ref, _ := items["$ref"].(string)
		def := strings.TrimPrefix(ref, "#/$defs/")
		if !simple || len(items) != 1 || def == ref || def == "" || strings.ContainsAny(def, "/~%") {
			continue
		}
		sch, err := c.Compile(id + ref)
		if err != nil {
			return nil, err
		}
		out = append(out, splitArray{name: name, items: sch})
	}
	return out, nil
}

// usesAny reports whether any object in the decoded schema has a key in
// keys. Property names count too, which only errs towards not splitting.
func usesAny(node any, keys map[string]bool) bool {
	switch x := node.(type) {
	case map[string]any:
		for k, v := range x {
			if keys[k] || usesAny(v, keys) {
				return true
			}
		}
	case []any:
		for _, v := range x {
			if usesAny(v, keys) {
				return true
			}
		}
	}
	return false
}

// arrayItems is the items of one split array of a document.
type arrayItems struct {
	array *splitArray
	items []any
}

// split returns doc with its split arrays empty, and their items. A
// document that is not an object, or whose property is not an array, is
// left whole: the schema reports it.
func (cs *compiledSchema) split(doc any) (any, []arrayItems) {
	m, ok := doc.(map[string]any)
	if !ok || len(cs.arrays) == 0 {
		return doc, nil
	}
	var parts []arrayItems
	var rest map[string]any
	for i := range cs.arrays {
		a := &cs.arrays[i]
		items, ok := m[a.name].([]any)
		if !ok || len(items) == 0 {
			continue
		}
		if rest == nil {
			rest = make(map[string]any, len(m))
			for k, v := range m {
				rest[k] = v
			}
		}
		rest[a.name] = []any{}
		parts = append(parts, arrayItems{array: a, items: items})
	}
	if rest == nil {
		return doc, nil
	}
	return rest, parts
}

// parallelItems is the least number of items an array must have for its
// items to be validated on several goroutines; a smaller array is
// validated on the caller's goroutine, where starting workers would cost
// more than it saves.
const parallelItems = 512

// chunkItems is how many consecutive items a worker takes at a time.
const chunkItems = 128

// issues validates each item and returns the issues of those that fail,
// located in the whole document, in the order of the items. The issues
// are made without the schema document: validated whole, the keywords of
// an item lie behind the "$ref", which leafIssues does not follow, so it
// keeps the library's messages at the library's locations; this keeps the
// same.
//
// An array of parallelItems or more is validated by up to
// runtime.GOMAXPROCS(0) goroutines, each taking chunks of chunkItems
// items, all of which have returned before issues does. The result is the
// sequential one: issues in item order, and where an item's validation
// fails with an error rather than issues, the error of the lowest such
// item (and a panic of the lowest panicking chunk is raised again here).
func (p arrayItems) issues(subject string) ([]Issue, error) {
	workers := min(runtime.GOMAXPROCS(0), (len(p.items)+chunkItems-1)/chunkItems)
	if len(p.items) < parallelItems || workers < 2 {
		return p.itemIssues(subject, 0, len(p.items))
	}
	type result struct {
		issues []Issue
		err    error
		panic  any
	}
	results := make([]result, (len(p.items)+chunkItems-1)/chunkItems)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				c := int(next.Add(1) - 1)
				if c >= len(results) {
					return
				}
				lo := c * chunkItems
				hi := min(lo+chunkItems, len(p.items))
				func() {
					defer func() {
						if r := recover(); r != nil {
							results[c].panic = r
						}
					}()
					results[c].issues, results[c].err = p.itemIssues(subject, lo, hi)
				}()
			}
		})
	}
	wg.Wait()
	var out []Issue
	for _, r := range results {
		if r.panic != nil {
			panic(r.panic)
		}
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, r.issues...)
	}
	return out, nil
}

// itemIssues is issues of the items lo to hi (exclusive), validated one
// after another; it stops at the first error.
func (p arrayItems) itemIssues(subject string, lo, hi int) ([]Issue, error) {
	var out []Issue
	for i := lo; i < hi; i++ {
		err := p.array.items.Validate(p.items[i])
		if err == nil {
			continue
		}
		is, err := issuesOf(subject, nil, p.items[i], err, nil)
		if err != nil {
			return nil, err
		}
		prefix := "/" + escapeToken(p.array.name) + "/" + strconv.Itoa(i)
		for _, x := range is {
			x.Location = prefix + x.Location
			out = append(out, x)
		}
	}
	return out, nil
}
