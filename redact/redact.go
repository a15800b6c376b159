// Package redact hides secrets: the values at JSON pointers a tool
// descriptor marks secret, values under credential-looking keys, and
// well-known secret shapes in any string (API keys, bearer tokens,
// passwords in URLs) become "[redacted:<8 hex of a keyed HMAC>]", so equal
// secrets stay correlatable without being revealed. The engine redacts
// what tools return before the ledger stores it; evidence redacts every
// report. It imports nothing of the project.
package redact

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// ErrRedaction is matched (errors.Is) by every error about a value that
// could not be redacted: malformed JSON, a malformed JSON pointer, a missing
// or short key. An export that meets one fails as a whole; nothing is ever
// shown unredacted instead.
var ErrRedaction = errors.New("redact: redaction failed")

// MinKeyLen is the shortest redaction key NewRedactor accepts, in bytes.
const MinKeyLen = 16

// markerPattern matches a marker Redactor wrote, so that redacting twice
// changes nothing.
var markerPattern = regexp.MustCompile(`^\[redacted:[0-9a-f]{8}\]$`)

// secretPattern is one well-known shape of secret in free text. Group is
// the submatch that is the secret itself (0 for the whole match): only that
// part is replaced, so "Authorization: Bearer <token>" keeps its words.
type secretPattern struct {
	name  string
	re    *regexp.Regexp
	group int
}

// patterns are the well-known secret shapes, matched in any string the
// report shows: arguments, results, observation details, event data, error
// messages, reasons and rationales. They err on the side of hiding too
// much.
var patterns = []secretPattern{
	{"private key block", regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----`), 0},
	{"password in URL", regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s:@]*:([^/?#\s@]+)@`), 1},
	{"bearer token", regexp.MustCompile(`(?i)\bbearer\s+([A-Za-z0-9._~+/=-]+)`), 1},
	{"basic credentials", regexp.MustCompile(`(?i)\bbasic\s+([A-Za-z0-9+/]{8,}={0,2})`), 1},
	{"sk- API key", regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{20,}`), 0},
	{"Stripe key", regexp.MustCompile(`\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}`), 0},
	{"AWS access key id", regexp.MustCompile(`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`), 0},
	{"GitHub token", regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{36,}`), 0},
	{"GitHub fine-grained token", regexp.MustCompile(`\bgithub_pat_[A-Za-z0-9_]{22,}`), 0},
	{"Slack token", regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`), 0},
	{"Google API key", regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{35}`), 0},
	{"JSON web token", regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}`), 0},
	// key=value and key: value in free text. The separator must hold ":"
	// or "=", so prose such as "token budget" is left alone.
	{"credential assignment", regexp.MustCompile(`(?i)(?:api[_-]?key|secret|token|password|passwd)["']?\s*[:=]\s*["']?([^\s"']+)`), 1},
}

// anyPattern matches where any of patterns does: one pass over a string
// tells whether the patterns need to run at all, which most strings of a
// report (ids, digests, states) do not.
var anyPattern = func() *regexp.Regexp {
	alts := make([]string, len(patterns))
	for i, p := range patterns {
		alts[i] = "(?:" + p.re.String() + ")"
	}
	return regexp.MustCompile(strings.Join(alts, "|"))
}()

// secretKey matches object keys whose scalar values are secrets whatever
// they look like: {"password": "hunter2"} hides hunter2, which no pattern
// would recognise on its own. It matches the end of the key (api_key,
// X-Api-Key, accessToken, client_secret, db_password), so "tokens",
// "max_tokens", "idempotency_key" and "secret_paths" do not match.
var secretKey = regexp.MustCompile(`(?i)(?:api[_-]?key|secret|token|password|passwd|private[_-]?key|access[_-]?key|authorization|credentials?)$`)

// Redactor replaces secrets with "[redacted:<8 hex>]", the first 8 hex
// digits of HMAC-SHA256(key, secret): equal secrets get equal markers, so a
// reader can see that the token in one argument is the one refused in an
// error message, without learning either. The key never appears in its
// output or its errors. A Redactor is safe for concurrent use.
type Redactor struct {
	key []byte
	// plainKeys remembers, for object keys that redaction leaves as they
	// are, whether they name a credential: a report's documents repeat a
	// few keys thousands of times, and matching each against every secret
	// pattern was most of the cost of redacting them. Only keys shown
	// verbatim in redacted output are kept, at most maxPlainKeys of them.
	mu        sync.RWMutex
	plainKeys map[string]bool
}

// maxPlainKeys bounds Redactor.plainKeys, and maxPlainKeyLen the keys it
// keeps: a document with many distinct keys costs what it did without the
// cache, not unbounded memory.
const (
	maxPlainKeys   = 4096
	maxPlainKeyLen = 64
)

// NewRedactor returns a Redactor keyed with key, which must be at least
// MinKeyLen bytes; the Redactor keeps its own copy. Reports redacted with
// the same key can be correlated with each other; with different keys they
// cannot.
func NewRedactor(key []byte) (*Redactor, error) {
	if len(key) < MinKeyLen {
		return nil, fmt.Errorf("%w: the key has %d bytes, at least %d are required", ErrRedaction, len(key), MinKeyLen)
	}
	return &Redactor{key: bytes.Clone(key)}, nil
}

// Marker returns the marker that replaces secret.
func (r *Redactor) Marker(secret string) string {
	m := hmac.New(sha256.New, r.key)
	m.Write([]byte(secret))
	return "[redacted:" + hex.EncodeToString(m.Sum(nil))[:8] + "]"
}

// KeyID names the key without revealing it: 8 hex digits of an HMAC of a
// fixed label. Two reports' markers are comparable only if their key ids
// are equal.
func (r *Redactor) KeyID() string {
	m := hmac.New(sha256.New, r.key)
	m.Write([]byte("actionledger evidence redaction key id"))
	return hex.EncodeToString(m.Sum(nil))[:8]
}

// RedactString returns s with every part matching a well-known secret
// pattern replaced by its marker. Only the secret itself is replaced: the
// password of scheme://user:PASS@host, the token after "Bearer", the value
// after "api_key=". Markers already in s are left as they are.
func (r *Redactor) RedactString(s string) string {
	out, _ := r.redactString(s)
	return out
}

// span is a secret's byte range in a string.
type span struct{ start, end int }

// redactString is RedactString, also reporting whether anything changed.
func (r *Redactor) redactString(s string) (string, bool) {
	if !anyPattern.MatchString(s) {
		return s, false
	}
	var spans []span
	for _, p := range patterns {
		for _, m := range p.re.FindAllStringSubmatchIndex(s, -1) {
			start, end := m[2*p.group], m[2*p.group+1]
			if start < 0 || start == end || markerPattern.MatchString(s[start:end]) {
				continue
			}
			spans = append(spans, span{start, end})
		}
	}
	if len(spans) == 0 {
		return s, false
	}
	// Overlapping matches of different patterns become one secret.
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].start != spans[j].start {
			return spans[i].start < spans[j].start
		}
		return spans[i].end > spans[j].end
	})
	merged := spans[:1]
	for _, sp := range spans[1:] {
		last := &merged[len(merged)-1]
		if sp.start < last.end {
			last.end = max(last.end, sp.end)
			continue
		}
		merged = append(merged, sp)
	}
	var b strings.Builder
	prev := 0
	for _, sp := range merged {
		b.WriteString(s[prev:sp.start])
		b.WriteString(r.Marker(s[sp.start:sp.end]))
		prev = sp.end
	}
	b.WriteString(s[prev:])
	return b.String(), true
}

// RedactJSON returns doc with the value at each of secretPaths (RFC 6901
// JSON pointers; "" is the whole document) replaced by its marker, and then
// every string matching a secret pattern, and every scalar under a key that
// names a credential ("password", "api_key", …), redacted as well. A string
// secret's marker is the HMAC of the string itself, so it matches the
// marker of the same secret found in free text; any other value's is the
// HMAC of its JSON text. A path that matches nothing changes nothing. The
// result is compact JSON with object keys sorted.
//
// Malformed JSON and malformed pointers fail with ErrRedaction, whose
// message quotes no part of doc. An empty doc stays empty.
func (r *Redactor) RedactJSON(doc json.RawMessage, secretPaths []string) (json.RawMessage, error) {
	out, _, err := r.RedactJSONChanged(doc, secretPaths)
	return out, err
}

// RedactJSONChanged is RedactJSON, also reporting whether anything
// changed.
func (r *Redactor) RedactJSONChanged(doc json.RawMessage, secretPaths []string) (json.RawMessage, bool, error) {
	if len(doc) == 0 {
		return nil, false, nil
	}
	w := walker{r: r}
	if len(secretPaths) == 0 && w.plain(doc) {
		return bytes.Clone(doc), false, nil
	}
	return w.redact(doc, secretPaths)
}

// redact is RedactJSONChanged of a document plain did not vouch for.
func (w *walker) redact(doc json.RawMessage, secretPaths []string) (json.RawMessage, bool, error) {
	root, err := decodeDoc(doc)
	if err != nil {
		return nil, false, err
	}
	for _, p := range secretPaths {
		tokens, err := parsePointer(p)
		if err != nil {
			return nil, false, err
		}
		if root, err = w.atPath(root, tokens); err != nil {
			return nil, false, err
		}
	}
	root, err = w.walk(root)
	if err != nil {
		return nil, false, err
	}
	out, err := encodeCompact(root)
	if err != nil {
		return nil, false, fmt.Errorf("%w: encode: %v", ErrRedaction, err)
	}
	return out, w.changed, nil
}

// decodeDoc decodes one JSON value, numbers kept as written. Its errors say
// where, never what: the text around a syntax error may be a secret.
func decodeDoc(doc []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("%w: malformed JSON at byte %d", ErrRedaction, se.Offset)
		}
		return nil, fmt.Errorf("%w: malformed JSON", ErrRedaction)
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: malformed JSON: data after the value", ErrRedaction)
	}
	return v, nil
}

// encodeCompact marshals v without HTML escaping, so the text reads as
// written; map keys come out sorted, which keeps reports byte-stable.
func encodeCompact(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// parsePointer splits an RFC 6901 pointer into unescaped reference tokens.
func parsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("%w: secret path %q is not a JSON pointer: it must be empty or start with /", ErrRedaction, p)
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return nil, fmt.Errorf("%w: secret path %q: ~ must be followed by 0 or 1", ErrRedaction, p)
			}
		}
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

// walker redacts a decoded document, remembering whether it changed it.
type walker struct {
	r       *Redactor
	changed bool
}

// keyInfo is what the walker needs to know about an object key.
type keyInfo struct {
	secret   bool   // the key names a credential
	redacted string // the key with its own secrets redacted
	changed  bool
}

func (w *walker) key(k string) keyInfo {
	r := w.r
	r.mu.RLock()
	secret, ok := r.plainKeys[k]
	r.mu.RUnlock()
	if ok {
		return keyInfo{secret: secret, redacted: k}
	}
	ki := keyInfo{secret: secretKey.MatchString(k)}
	ki.redacted, ki.changed = r.redactString(k)
	if !ki.changed && len(k) <= maxPlainKeyLen {
		r.mu.Lock()
		if r.plainKeys == nil {
			r.plainKeys = map[string]bool{}
		}
		if len(r.plainKeys) < maxPlainKeys {
			r.plainKeys[k] = ki.secret
		}
		r.mu.Unlock()
	}
	return ki
}

// marker returns the marker of a whole value.
func (w *walker) marker(v any) (string, error) {
	switch x := v.(type) {
	case string:
		if markerPattern.MatchString(x) {
			return x, nil
		}
		w.changed = true
		return w.r.Marker(x), nil
	default:
		b, err := encodeCompact(x)
		if err != nil {
			return "", fmt.Errorf("%w: encode: %v", ErrRedaction, err)
		}
		w.changed = true
		return w.r.Marker(string(b)), nil
	}
}

// atPath replaces the value at tokens below v with its marker and returns
// v. A path that leads nowhere leaves v as it is.
func (w *walker) atPath(v any, tokens []string) (any, error) {
	if len(tokens) == 0 {
		return w.marker(v)
	}
	switch x := v.(type) {
	case map[string]any:
		child, ok := x[tokens[0]]
		if !ok {
			return v, nil
		}
		nv, err := w.atPath(child, tokens[1:])
		if err != nil {
			return nil, err
		}
		x[tokens[0]] = nv
	case []any:
		i, ok := arrayIndex(tokens[0], len(x))
		if !ok {
			return v, nil
		}
		nv, err := w.atPath(x[i], tokens[1:])
		if err != nil {
			return nil, err
		}
		x[i] = nv
	}
	return v, nil
}

// arrayIndex parses an RFC 6901 array index: digits without a leading zero,
// inside the array. "-" (past the end) and anything else match nothing.
func arrayIndex(tok string, n int) (int, bool) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return 0, false
	}
	for _, c := range tok {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(tok)
	if err != nil || i >= n {
		return 0, false
	}
	return i, true
}

// walk redacts patterns in every string, keys included, and every scalar
// under a credential key.
func (w *walker) walk(v any) (any, error) {
	switch x := v.(type) {
	case string:
		s, changed := w.r.redactString(x)
		w.changed = w.changed || changed
		return s, nil
	case []any:
		for i := range x {
			nv, err := w.walk(x[i])
			if err != nil {
				return nil, err
			}
			x[i] = nv
		}
		return x, nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make(map[string]any, len(x))
		for _, k := range keys {
			val := x[k]
			ki := w.key(k)
			var err error
			switch val.(type) {
			case string, json.Number:
				if ki.secret {
					val, err = w.marker(val)
				} else {
					val, err = w.walk(val)
				}
			default:
				val, err = w.walk(val)
			}
			if err != nil {
				return nil, err
			}
			nk := ki.redacted
			if _, dup := out[nk]; dup {
				return nil, fmt.Errorf("%w: two object keys redact to the same marker", ErrRedaction)
			}
			w.changed = w.changed || ki.changed
			out[nk] = val
		}
		return out, nil
	default: // numbers, booleans, null
		return v, nil
	}
}
