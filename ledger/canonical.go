package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// MaxJSONDepth is the deepest nesting of objects and arrays accepted in any
// JSON the ledger takes a digest of (docs/concepts.md).
const MaxJSONDepth = 32

// Digest is "sha256:" followed by 64 lowercase hex digits.
type Digest string

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Valid reports whether d is well formed.
func (d Digest) Valid() bool { return digestPattern.MatchString(string(d)) }

// CheckJSON refuses what must be refused before any digest is
// taken: invalid JSON, trailing data, duplicate object keys and nesting deeper
// than MaxJSONDepth. Unknown fields are the schemas' job (package contracts).
//
// It runs on every argument, result and digest, several times per action,
// so well-formed JSON is checked in one pass over the bytes (json.Valid,
// then checkKeys for keys and depth) without a json.Decoder's token
// allocations; malformed JSON takes the decoder's path (checkJSONTokens),
// which explains what is wrong. TestCheckJSONPaths holds both to the same
// verdicts and messages.
func CheckJSON(data []byte) error {
	if !json.Valid(data) {
		return checkJSONTokens(data)
	}
	return checkKeys(data)
}

// checkKeys finds duplicate keys and nesting deeper than MaxJSONDepth in
// data, which must be valid JSON.
func checkKeys(data []byte) error {
	var stack []keyLevel
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			if len(stack)+1 > MaxJSONDepth {
				return Errorf(CodeInvalid, "json: nesting deeper than %d", MaxJSONDepth)
			}
			stack = append(stack, keyLevel{object: data[i] == '{', wantKey: data[i] == '{'})
		case '}', ']':
			stack = stack[:len(stack)-1]
		case ',':
			if top := &stack[len(stack)-1]; top.object {
				top.wantKey = true
			}
		case '"':
			end := i + 1 // the closing quote: valid JSON has one
			for data[end] != '"' {
				if data[end] == '\\' {
					end++
				}
				end++
			}
			if top := len(stack) - 1; top >= 0 && stack[top].wantKey {
				l := &stack[top]
				l.wantKey = false
				key, err := jsonKey(data[i : end+1])
				if err != nil {
					return err
				}
				if dup := l.add(key); dup {
					return Errorf(CodeInvalid, "json: duplicate key %q", key)
				}
			}
			i = end
		}
	}
	return nil
}

// jsonKey is the text of a quoted JSON string as a decoder gives it:
// escapes resolved, invalid UTF-8 as U+FFFD.
func jsonKey(quoted []byte) (string, error) {
	plain := true
	for _, c := range quoted[1 : len(quoted)-1] {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return string(quoted[1 : len(quoted)-1]), nil
	}
	var key string
	if err := json.Unmarshal(quoted, &key); err != nil {
		return "", Errorf(CodeInvalid, "json: %w", err)
	}
	return key, nil
}

// keyLevel is one object or array checkKeys is inside.
type keyLevel struct {
	object, wantKey bool                // an object, and whether a key comes next
	keys            []string            // the object's keys so far
	set             map[string]struct{} // the same, once there are many
}

// add records key at this level and reports whether it was there already.
func (l *keyLevel) add(key string) (dup bool) {
	if l.set != nil {
		_, dup = l.set[key]
		l.set[key] = struct{}{}
		return dup
	}
	if slices.Contains(l.keys, key) {
		return true
	}
	l.keys = append(l.keys, key)
	if len(l.keys) > 16 {
		l.set = make(map[string]struct{}, 2*len(l.keys))
		for _, k := range l.keys {
			l.set[k] = struct{}{}
		}
		l.keys = nil
	}
	return false
}

// checkJSONTokens is CheckJSON on a json.Decoder: token by token, with the
// decoder's own explanation of malformed JSON.
func checkJSONTokens(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := checkValue(dec, 0); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Errorf(CodeInvalid, "json: unexpected data after the top-level value")
	}
	return nil
}

func checkValue(dec *json.Decoder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return Errorf(CodeInvalid, "json: %w", err)
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if depth+1 > MaxJSONDepth {
		return Errorf(CodeInvalid, "json: nesting deeper than %d", MaxJSONDepth)
	}
	switch delim {
	case '{':
		seen := map[string]struct{}{}
		for dec.More() {
			keyTok, err := dec.Token()
			if err != nil {
				return Errorf(CodeInvalid, "json: %w", err)
			}
			key := keyTok.(string) // the decoder only yields string keys inside objects
			if _, dup := seen[key]; dup {
				return Errorf(CodeInvalid, "json: duplicate key %q", key)
			}
			seen[key] = struct{}{}
			if err := checkValue(dec, depth+1); err != nil {
				return err
			}
		}
	case '[':
		for dec.More() {
			if err := checkValue(dec, depth+1); err != nil {
				return err
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return Errorf(CodeInvalid, "json: %w", err)
	}
	return nil
}

// Canonicalize checks data with CheckJSON and returns its RFC 8785 (JCS)
// canonical form: keys sorted by UTF-16 code units, no insignificant
// whitespace, numbers in their shortest round-trip (ECMAScript) form.
func Canonicalize(data []byte) ([]byte, error) {
	if err := CheckJSON(data); err != nil {
		return nil, err
	}
	out, err := jcs.Transform(data)
	if err != nil {
		return nil, Errorf(CodeInvalid, "canonical json: %w", err)
	}
	return out, nil
}

// CanonicalJSON marshals v with encoding/json and canonicalizes the result.
func CanonicalJSON(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, Errorf(CodeInvalid, "canonical json: %w", err)
	}
	return Canonicalize(data)
}

// DigestOf returns the sha256 digest of the canonical form of v.
func DigestOf(v any) (Digest, error) {
	c, err := CanonicalJSON(v)
	if err != nil {
		return "", err
	}
	return digestBytes(c), nil
}

// DigestJSON returns the sha256 digest of the canonical form of raw JSON.
func DigestJSON(data []byte) (Digest, error) {
	c, err := Canonicalize(data)
	if err != nil {
		return "", err
	}
	return digestBytes(c), nil
}

// DigestCanonical returns the sha256 digest of data that is already in
// canonical form (the output of Canonicalize or CanonicalJSON, or bytes
// built to equal it), without canonicalizing it again.
func DigestCanonical(data []byte) Digest { return digestBytes(data) }

func digestBytes(b []byte) Digest { return sumDigest(sha256.Sum256(b)) }

// ActionDigestInput is exactly what an action digest covers
// (docs/concepts.md). Approvals bind to its digest.
type ActionDigestInput struct {
	Tool        string          `json:"tool"`
	ToolVersion string          `json:"tool_version"`
	Effect      Effect          `json:"effect"`
	Arguments   json.RawMessage `json:"arguments"`
}

// ActionDigest returns the digest approvals bind to.
func ActionDigest(in ActionDigestInput) (Digest, error) {
	if len(in.Arguments) == 0 {
		return "", Errorf(CodeInvalid, "action digest: arguments are required")
	}
	args, err := Canonicalize(in.Arguments)
	if err != nil {
		return "", fmt.Errorf("action digest: %w", err)
	}
	return actionDigest(in.Tool, in.ToolVersion, in.Effect, args), nil
}

// actionDigest is ActionDigest of arguments that are canonical already
// (CreateAction has just canonicalized them).
func actionDigest(tool, toolVersion string, effect Effect, args []byte) Digest {
	// The canonical form of the input, written directly: the arguments are
	// canonical now and the keys sort as arguments, effect, tool,
	// tool_version. TestActionDigestIsDigestOf holds it to DigestOf(in).
	// The depth limit applies to the arguments, not to the document around
	// them: DigestOf(in) refused arguments nested exactly MaxJSONDepth deep,
	// which Canonicalize (and so CreateAction) had accepted.
	var b bytes.Buffer
	b.Grow(len(args) + len(tool) + len(toolVersion) + 64)
	b.WriteString(`{"arguments":`)
	b.Write(args)
	b.WriteString(`,"effect":`)
	jcsString(&b, string(effect))
	b.WriteString(`,"tool":`)
	jcsString(&b, tool)
	b.WriteString(`,"tool_version":`)
	jcsString(&b, toolVersion)
	b.WriteByte('}')
	return digestBytes(b.Bytes())
}
