package server

import (
	"encoding/json"
	"strconv"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/redact"
)

// Redactor hides secrets in what the API shows: an action's arguments and
// the data of timeline events. Every argument and event the server sends
// goes through it.
type Redactor interface {
	// RedactArguments returns the arguments of an action of tool as they
	// may be shown.
	RedactArguments(tool string, args json.RawMessage) (json.RawMessage, error)
	// RedactEventData returns an event's data as it may be shown.
	RedactEventData(e *ledger.Event) (json.RawMessage, error)
}

// KeyedRedactor is the default Redactor, the same redaction as evidence
// reports (package redact): values at the JSON pointers a tool descriptor
// lists in secret_paths, values under credential-looking keys and
// well-known secret shapes become "[redacted:<8 hex of a keyed HMAC>]".
// Arguments of a tool it does not know become one marker as a whole,
// because nothing says which of them are secret.
type KeyedRedactor struct {
	Redactor *redact.Redactor
	// Tools looks up a tool's descriptor by name (engine.Engine.Tool).
	Tools func(name string) (contracts.ToolDescriptor, bool)
}

// RedactArguments implements Redactor.
func (r KeyedRedactor) RedactArguments(tool string, args json.RawMessage) (json.RawMessage, error) {
	var (
		d  contracts.ToolDescriptor
		ok bool
	)
	if r.Tools != nil {
		d, ok = r.Tools(tool)
	}
	if !ok {
		return json.RawMessage(strconv.Quote(r.Redactor.Marker(string(args)))), nil
	}
	return r.Redactor.RedactJSON(args, d.SecretPaths)
}

// RedactEventData implements Redactor.
func (r KeyedRedactor) RedactEventData(e *ledger.Event) (json.RawMessage, error) {
	return r.Redactor.RedactJSON(e.Data, nil)
}
