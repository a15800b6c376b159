package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// Document digests. A document a report may redact in part (arguments,
// results, details, errors, reasons, event data) enters a row's content,
// or an event's hash, as its tree digest: the digest of a scalar is the
// sha256 of its canonical JSON; of an array, of the canonical JSON array
// of its elements' digests; of an object, of the canonical JSON object of
// its members' digests. A report that hides a node (a secret at a path, a
// string with a secret in it) gives that node's digest in its place, and a
// reader recomputes the document's digest from what is shown and what is
// given (HiddenDocDigest): every part the report shows is checked, and
// only the hidden nodes are taken on trust of their digest.
//
// A hidden node's digest tells nothing a guess could not confirm: a secret
// of low entropy can be found by trying candidates against it, as it
// already can against an action's digest, which covers its arguments
// whole.

// DocDigest is the tree digest of a document; "" for none (empty or JSON
// null). doc is canonicalized first: a report shows documents re-indented.
func DocDigest(doc json.RawMessage) (Digest, error) {
	return HiddenDocDigest(doc, nil, nil)
}

// HiddenDocDigest is DocDigest of a document some of whose nodes are
// hidden: hidden maps their RFC 6901 JSON pointers ("" is the whole
// document) to their digests, which stand in for what doc shows there.
// check, if set, is called with each hidden node's pointer and its text in
// doc (canonical), and may refuse it. Every pointer of hidden must name a
// node of doc.
func HiddenDocDigest(doc json.RawMessage, hidden map[string]Digest, check func(pointer string, node []byte) error) (Digest, error) {
	if len(doc) == 0 || string(bytes.TrimSpace(doc)) == "null" {
		if len(hidden) > 0 {
			return "", Errorf(CodeInvalid, "document: nothing is shown where %d nodes are hidden", len(hidden))
		}
		return "", nil
	}
	c, err := Canonicalize(doc)
	if err != nil {
		return "", err
	}
	w := treeWalker{doc: c, hidden: hidden, check: check}
	sum, err := w.root()
	if err != nil {
		return "", err
	}
	if w.used != len(hidden) {
		for p := range hidden {
			if !w.seen[p] {
				return "", Errorf(CodeInvalid, "document: no node at %q, which is said to be hidden", p)
			}
		}
	}
	return sumDigest(sum), nil
}

// docDigest is the tree digest of a document the ledger stored, which is
// canonical already; "" for none. A document that is not JSON (an edit
// behind the ledger's back) gets the digest of its bytes, which no tree
// digest of a document will equal.
func docDigest(doc json.RawMessage) Digest {
	if len(doc) == 0 || string(doc) == "null" {
		return ""
	}
	w := walkers.Get().(*treeWalker)
	defer walkers.Put(w)
	w.reset(doc)
	sum, err := w.root()
	if err != nil {
		return digestBytes(append([]byte("not json:"), doc...))
	}
	return sumDigest(sum)
}

// walkers keeps treeWalkers with their buffers for the digests each write
// takes of the documents it binds.
var walkers = sync.Pool{New: func() any { return new(treeWalker) }}

func sumDigest(sum [sha256.Size]byte) Digest {
	b := make([]byte, 0, len("sha256:")+2*sha256.Size)
	b = append(b, "sha256:"...)
	return Digest(hex.AppendEncode(b, sum[:]))
}

// treeWalker computes a tree digest in one pass over a document's text,
// writing each container's canonical JSON of digests into a buffer of its
// depth.
type treeWalker struct {
	// text is the buffer an event's hash input is written to
	// (Event.computeHash), kept with the walker's own.
	text   bytes.Buffer
	doc    []byte
	i      int
	bufs   []*bytes.Buffer
	depth  int
	hidden map[string]Digest
	check  func(string, []byte) error
	path   []string // the pointer's tokens, kept only with hidden
	used   int
	seen   map[string]bool
}

// reset readies the walker for doc, keeping its buffers (a walker with
// hidden nodes is never reused).
func (w *treeWalker) reset(doc []byte) {
	w.doc, w.i, w.depth = doc, 0, 0
}

func (w *treeWalker) root() ([sha256.Size]byte, error) {
	sum, err := w.value()
	if err != nil {
		return sum, err
	}
	w.space()
	if w.i != len(w.doc) {
		return sum, Errorf(CodeInvalid, "document: data after the value at byte %d", w.i)
	}
	return sum, nil
}

func (w *treeWalker) space() {
	for w.i < len(w.doc) {
		switch w.doc[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func (w *treeWalker) malformed() error {
	return Errorf(CodeInvalid, "document: malformed JSON at byte %d", w.i)
}

// pointerEscape escapes a token of an RFC 6901 pointer.
var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

// pointer is the RFC 6901 pointer of the node at the current path.
func (w *treeWalker) pointer() string {
	var b strings.Builder
	for _, t := range w.path {
		b.WriteByte('/')
		b.WriteString(pointerEscape.Replace(t))
	}
	return b.String()
}

func (w *treeWalker) value() ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	w.space()
	if w.i >= len(w.doc) {
		return sum, w.malformed()
	}
	if w.hidden != nil {
		p := w.pointer()
		if d, ok := w.hidden[p]; ok {
			start := w.i
			if err := w.skip(); err != nil {
				return sum, err
			}
			if w.check != nil {
				if err := w.check(p, w.doc[start:w.i]); err != nil {
					return sum, err
				}
			}
			raw, ok := strings.CutPrefix(string(d), "sha256:")
			if n, err := hex.Decode(sum[:], []byte(raw)); !ok || err != nil || n != sha256.Size {
				return sum, Errorf(CodeInvalid, "document: the digest of hidden node %q is not sha256:<64 hex>", p)
			}
			if w.seen == nil {
				w.seen = map[string]bool{}
			}
			w.seen[p] = true
			w.used++
			return sum, nil
		}
	}
	switch w.doc[w.i] {
	case '{':
		return w.container('}')
	case '[':
		return w.container(']')
	default:
		start := w.i
		if err := w.scalar(); err != nil {
			return sum, err
		}
		return sha256.Sum256(w.doc[start:w.i]), nil
	}
}

// container digests the object or array at w.i, which ends with end.
func (w *treeWalker) container(end byte) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if w.depth == len(w.bufs) {
		w.bufs = append(w.bufs, new(bytes.Buffer))
	}
	b := w.bufs[w.depth]
	b.Reset()
	w.depth++
	defer func() { w.depth-- }()
	b.WriteByte(w.doc[w.i])
	w.i++
	w.space()
	if w.i < len(w.doc) && w.doc[w.i] == end {
		w.i++
		b.WriteByte(end)
		return sha256.Sum256(b.Bytes()), nil
	}
	for n := 0; ; n++ {
		if n > 0 {
			b.WriteByte(',')
		}
		if end == '}' {
			w.space()
			start := w.i
			if w.i >= len(w.doc) || w.doc[w.i] != '"' {
				return sum, w.malformed()
			}
			if err := w.scalar(); err != nil {
				return sum, err
			}
			key := w.doc[start:w.i]
			b.Write(key)
			b.WriteByte(':')
			w.space()
			if w.i >= len(w.doc) || w.doc[w.i] != ':' {
				return sum, w.malformed()
			}
			w.i++
			if w.hidden != nil {
				var k string
				if err := json.Unmarshal(key, &k); err != nil {
					return sum, w.malformed()
				}
				w.path = append(w.path, k)
			}
		} else if w.hidden != nil {
			w.path = append(w.path, fmt.Sprint(n))
		}
		child, err := w.value()
		if err != nil {
			return sum, err
		}
		if w.hidden != nil {
			w.path = w.path[:len(w.path)-1]
		}
		var hexText [2 * sha256.Size]byte
		hex.Encode(hexText[:], child[:])
		b.WriteString(`"sha256:`)
		b.Write(hexText[:])
		b.WriteByte('"')
		w.space()
		if w.i >= len(w.doc) {
			return sum, w.malformed()
		}
		switch w.doc[w.i] {
		case ',':
			w.i++
		case end:
			w.i++
			b.WriteByte(end)
			return sha256.Sum256(b.Bytes()), nil
		default:
			return sum, w.malformed()
		}
	}
}

// scalar moves past the string, number or literal at w.i.
func (w *treeWalker) scalar() error {
	d := w.doc
	switch c := d[w.i]; {
	case c == '"':
		for j := w.i + 1; j < len(d); j++ {
			switch d[j] {
			case '\\':
				j++
			case '"':
				w.i = j + 1
				return nil
			}
		}
		return w.malformed()
	case c == 't' || c == 'f' || c == 'n':
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(d[w.i:], []byte(lit)) {
				w.i += len(lit)
				return nil
			}
		}
		return w.malformed()
	case c == '-' || c >= '0' && c <= '9':
		j := w.i + 1
		for j < len(d) && (d[j] >= '0' && d[j] <= '9' || d[j] == '.' || d[j] == 'e' || d[j] == 'E' || d[j] == '+' || d[j] == '-') {
			j++
		}
		w.i = j
		return nil
	default:
		return w.malformed()
	}
}

// skip moves past the value at w.i.
func (w *treeWalker) skip() error {
	switch w.doc[w.i] {
	case '{', '[':
		depth := 0
		for ; w.i < len(w.doc); w.i++ {
			switch w.doc[w.i] {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					w.i++
					return nil
				}
			case '"':
				if err := w.scalar(); err != nil {
					return err
				}
				w.i--
			}
		}
		return w.malformed()
	default:
		return w.scalar()
	}
}
