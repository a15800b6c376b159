package evidence

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/redact"
)

// Hidden maps the RFC 6901 JSON pointers of the nodes redaction hid in a
// document ("" for the whole document) to the tree digests of the stored
// nodes (ledger.DocDigest), which stand in for them when the document's
// digest is recomputed from a report (ledger.HiddenDocDigest).
type Hidden map[string]ledger.Digest

// RedactedFields maps the name of each field of a row that redaction
// changed to the nodes it hid there. Empty, never nil, when redaction
// changed nothing.
type RedactedFields map[string]Hidden

// hiddenNodes compares a stored document with its redacted form and
// returns the nodes redaction changed, each with the digest of its stored
// form; nil if it changed nothing. Redaction keeps a document's shape and
// replaces whole nodes (a value at a secret path, under a credential key,
// a string holding a secret), so the walk stops at the first difference on
// each branch.
func hiddenNodes(stored, shown json.RawMessage) (Hidden, error) {
	a, err := decodeNumbers(stored)
	if err != nil {
		return nil, err
	}
	b, err := decodeNumbers(shown)
	if err != nil {
		return nil, err
	}
	out := Hidden{}
	if err := diffNodes(a, b, "", out); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// decodeNumbers decodes one JSON document, numbers kept as written; JSON
// null for none.
func decodeNumbers(doc json.RawMessage) (any, error) {
	if len(doc) == 0 {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: malformed JSON", redact.ErrRedaction)
	}
	return v, nil
}

var pointerToken = strings.NewReplacer("~", "~0", "/", "~1")

func diffNodes(a, b any, at string, out Hidden) error {
	switch x := a.(type) {
	case map[string]any:
		if y, ok := b.(map[string]any); ok && len(x) == len(y) {
			same := true
			for k := range x {
				if _, ok := y[k]; !ok {
					same = false
				}
			}
			if same {
				for k, v := range x {
					if err := diffNodes(v, y[k], at+"/"+pointerToken.Replace(k), out); err != nil {
						return err
					}
				}
				return nil
			}
		}
	case []any:
		if y, ok := b.([]any); ok && len(x) == len(y) {
			for i := range x {
				if err := diffNodes(x[i], y[i], at+"/"+strconv.Itoa(i), out); err != nil {
					return err
				}
			}
			return nil
		}
	default:
		if a == b {
			return nil
		}
	}
	node, err := ledger.CanonicalJSON(a)
	if err != nil {
		return err
	}
	d, err := ledger.DocDigest(node)
	if err != nil {
		return err
	}
	out[at] = d
	return nil
}

// textNodes is hiddenNodes of a free-text field: the whole text if
// redaction changed it.
func textNodes(stored, shown string) Hidden {
	if stored == shown {
		return nil
	}
	return Hidden{"": ledger.TextDigest(stored)}
}

// errorNodes is hiddenNodes of an attempt's error.
func errorNodes(stored, shown *ledger.AttemptError) (Hidden, error) {
	if stored == nil || *stored == *shown {
		return nil, nil
	}
	a, err := json.Marshal(stored)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(shown)
	if err != nil {
		return nil, err
	}
	return hiddenNodes(a, b)
}
