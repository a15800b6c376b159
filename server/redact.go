package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

// Redactor hides secrets in what the API shows: an action's arguments and
// the data of timeline events. Every argument and event the server sends
// goes through it, so that the evidence work (DESIGN.md section 7: keyed
// HMAC markers, well-known secret patterns) plugs in here without touching
// the handlers.
type Redactor interface {
	// RedactArguments returns the arguments of an action of tool as they
	// may be shown.
	RedactArguments(tool string, args json.RawMessage) (json.RawMessage, error)
	// RedactEventData returns an event's data as it may be shown.
	RedactEventData(e *ledger.Event) (json.RawMessage, error)
}

// Redacted replaces every secret value shown by SecretPathRedactor.
const Redacted = "[redacted]"

// SecretPathRedactor is the default Redactor: argument values at the JSON
// pointers a tool descriptor lists in secret_paths become "[redacted]";
// arguments of a tool it does not know are replaced as a whole, because
// nothing says which of them are secret. Event data is shown as recorded:
// the ledger records no arguments in events.
type SecretPathRedactor struct {
	// Tools looks up a tool's descriptor by name (engine.Engine.Tool).
	Tools func(name string) (contracts.ToolDescriptor, bool)
}

// RedactArguments implements Redactor.
func (r SecretPathRedactor) RedactArguments(tool string, args json.RawMessage) (json.RawMessage, error) {
	var (
		d  contracts.ToolDescriptor
		ok bool
	)
	if r.Tools != nil {
		d, ok = r.Tools(tool)
	}
	if !ok {
		return json.RawMessage(strconv.Quote(Redacted)), nil
	}
	return RedactPaths(args, d.SecretPaths)
}

// RedactEventData implements Redactor.
func (SecretPathRedactor) RedactEventData(e *ledger.Event) (json.RawMessage, error) {
	return e.Data, nil
}

// RedactPaths returns doc with the value at each JSON pointer (RFC 6901)
// replaced by "[redacted]". A pointer that matches nothing changes nothing;
// "" redacts the whole document. With no pointers doc comes back unchanged,
// byte for byte.
func RedactPaths(doc json.RawMessage, pointers []string) (json.RawMessage, error) {
	if len(pointers) == 0 || len(doc) == 0 {
		return doc, nil
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("redact: %w", err)
	}
	for _, p := range pointers {
		if p == "" {
			root = Redacted
			continue
		}
		tokens, err := splitPointer(p)
		if err != nil {
			return nil, fmt.Errorf("redact: %w", err)
		}
		root = redactAt(root, tokens)
	}
	out, err := json.Marshal(root)
	if err != nil {
		return nil, fmt.Errorf("redact: %w", err)
	}
	return out, nil
}

func splitPointer(p string) ([]string, error) {
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("json pointer %q must start with /", p)
	}
	parts := strings.Split(p[1:], "/")
	un := strings.NewReplacer("~1", "/", "~0", "~")
	for i, t := range parts {
		parts[i] = un.Replace(t)
	}
	return parts, nil
}

// redactAt replaces the value at tokens below v and returns v.
func redactAt(v any, tokens []string) any {
	if len(tokens) == 0 {
		return Redacted
	}
	switch x := v.(type) {
	case map[string]any:
		if child, ok := x[tokens[0]]; ok {
			x[tokens[0]] = redactAt(child, tokens[1:])
		}
	case []any:
		i, err := strconv.Atoi(tokens[0])
		if err == nil && i >= 0 && i < len(x) && strconv.Itoa(i) == tokens[0] {
			x[i] = redactAt(x[i], tokens[1:])
		}
	}
	return v
}
