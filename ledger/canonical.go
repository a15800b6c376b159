package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"

	"github.com/gowebpki/jcs"
)

// MaxJSONDepth is the deepest nesting of objects and arrays accepted in any
// JSON the ledger takes a digest of (DESIGN.md section 2).
const MaxJSONDepth = 32

// Digest is "sha256:" followed by 64 lowercase hex digits.
type Digest string

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Valid reports whether d is well formed.
func (d Digest) Valid() bool { return digestPattern.MatchString(string(d)) }

// CheckJSON refuses what DESIGN.md says must be refused before any digest is
// taken: invalid JSON, trailing data, duplicate object keys and nesting deeper
// than MaxJSONDepth. Unknown fields are the schemas' job (package contracts).
func CheckJSON(data []byte) error {
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

func digestBytes(b []byte) Digest {
	sum := sha256.Sum256(b)
	return Digest("sha256:" + hex.EncodeToString(sum[:]))
}

// ActionDigestInput is exactly what an action digest covers (DESIGN.md
// section 2). Approvals bind to its digest.
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
	d, err := DigestOf(in)
	if err != nil {
		return "", fmt.Errorf("action digest: %w", err)
	}
	return d, nil
}
