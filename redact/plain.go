package redact

import "unicode/utf8"

// Most documents redaction sees hide nothing: a run's usage records, ids,
// states, counts. Decoding one, walking it and encoding it again costs far
// more than reading it, and was most of the cost of redacting a report's
// timeline. plain recognises, in one pass over the text, a document that
// redaction would give back byte for byte: already in the form RedactJSON
// writes (compact, object keys sorted and unique, strings needing no
// escapes), with no key naming a credential, and no string, key or value,
// that a secret pattern matches. Anything else, including anything plain
// is unsure of, takes the full path. TestPlainIsRedactJSON holds the two to
// the same output.

// maxPlainDepth bounds the nesting plain follows; deeper documents take
// the full path, which has its own limits.
const maxPlainDepth = 64

// plain reports whether doc, with no secret paths, redacts to itself
// unchanged.
func (w *walker) plain(doc []byte) bool {
	p := plainScanner{w: w, doc: doc}
	return p.value(0) && p.i == len(doc)
}

// plainScanner reads a document for plain; every method returns false as
// soon as the document is not plain.
type plainScanner struct {
	w   *walker
	doc []byte
	i   int
}

func (p *plainScanner) value(depth int) bool {
	if p.i >= len(p.doc) || depth > maxPlainDepth {
		return false
	}
	switch c := p.doc[p.i]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, ok := p.string()
		if !ok {
			return false
		}
		_, changed := p.w.r.redactString(s)
		return !changed
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	default:
		return p.literal("true") || p.literal("false") || p.literal("null")
	}
}

func (p *plainScanner) object(depth int) bool {
	p.i++ // {
	if p.i < len(p.doc) && p.doc[p.i] == '}' {
		p.i++
		return true
	}
	prev, first := "", true
	for {
		if p.i >= len(p.doc) || p.doc[p.i] != '"' {
			return false
		}
		k, ok := p.string()
		// Keys in strictly increasing order: sorted as RedactJSON writes
		// them, and no duplicate that decoding would drop.
		if !ok || (!first && k <= prev) {
			return false
		}
		if ki := p.w.key(k); ki.secret || ki.changed {
			return false
		}
		prev, first = k, false
		if p.i >= len(p.doc) || p.doc[p.i] != ':' {
			return false
		}
		p.i++
		if !p.value(depth) || p.i >= len(p.doc) {
			return false
		}
		switch p.doc[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return true
		default:
			return false
		}
	}
}

func (p *plainScanner) array(depth int) bool {
	p.i++ // [
	if p.i < len(p.doc) && p.doc[p.i] == ']' {
		p.i++
		return true
	}
	for {
		if !p.value(depth) || p.i >= len(p.doc) {
			return false
		}
		switch p.doc[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return true
		default:
			return false
		}
	}
}

// string reads a string that needs no escape in RedactJSON's output and
// was written without one: no quote, backslash or control character, valid
// UTF-8, neither U+2028 nor U+2029 (which encoding/json escapes). Its text
// between the quotes is then the string itself.
func (p *plainScanner) string() (string, bool) {
	start := p.i + 1
	for i := start; i < len(p.doc); {
		c := p.doc[i]
		switch {
		case c == '"':
			p.i = i + 1
			return string(p.doc[start:i]), true
		case c < 0x20 || c == '\\':
			return "", false
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(p.doc[i:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				return "", false
			}
			i += size
		}
	}
	return "", false
}

// number reads a number in JSON's grammar; RedactJSON writes it as
// written.
func (p *plainScanner) number() bool {
	d, i := p.doc, p.i
	digits := func() bool {
		n := i
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
		return i > n
	}
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	p.i = i
	return true
}

func (p *plainScanner) literal(lit string) bool {
	if len(p.doc)-p.i < len(lit) || string(p.doc[p.i:p.i+len(lit)]) != lit {
		return false
	}
	p.i += len(lit)
	return true
}
