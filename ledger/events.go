package ledger

import (
	"bytes"
	"context"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// EventFormat is the hash format of the events this build writes
// (Event.Format).
const EventFormat = 2

// ComputeHash returns the hash the event should carry given its content and
// its PrevHash: the sha256 of the RFC 8785 canonical JSON of every field
// but Hash. In format 1 the data is one of those fields; in format 2 its
// tree digest is ("data_digest", treedigest.go), with the format itself
// and the rows the event binds ("rows"), so that the hash can be
// recomputed from a report that redacted part of the data but gives the
// digests of what it hid (DataDigest).
//
// It writes that JSON directly (keys in order, JCS string escaping)
// instead of marshalling and re-parsing it, since it runs for every event
// written and verified; Data and Rows must already be canonical, as
// appendEvent stores them. TestEventHashIsJCS holds it to the general
// path.
func (e *Event) ComputeHash() (string, error) {
	w := walkers.Get().(*treeWalker)
	defer walkers.Put(w)
	return e.computeHash(w)
}

// computeHash is ComputeHash with the walker for the data's tree digest,
// whose buffers a caller hashing many events reuses.
func (e *Event) computeHash(w *treeWalker) (string, error) {
	v2 := false
	switch e.Format {
	case 0, 1:
		if len(e.Rows) > 0 {
			return "", Errorf(CodeInvalid, "event %d hash: an event of format 1 binds no rows", e.Seq)
		}
		if len(e.Data) > 0 && !json.Valid(e.Data) {
			return "", Errorf(CodeInvalid, "event %d hash: data is not JSON", e.Seq)
		}
	case EventFormat:
		v2 = true
		if len(e.Rows) > 0 && (e.Rows[0] != '{' || !json.Valid(e.Rows)) {
			return "", Errorf(CodeInvalid, "event %d hash: rows are not a JSON object", e.Seq)
		}
	default:
		return "", Errorf(CodeInvalid, "event %d hash: unknown format %d", e.Seq, e.Format)
	}
	b := &w.text // the walker's, reused from event to event
	b.Reset()
	b.Grow(448 + len(e.Data) + len(e.Rows))
	field := func(first bool, key string) {
		if !first {
			b.WriteByte(',')
		}
		jcsString(b, key)
		b.WriteByte(':')
	}
	b.WriteByte('{')
	field(true, "actor")
	jcsString(b, e.Actor)
	field(false, "created_at")
	var created [40]byte // RFC 3339 needs no escaping
	b.WriteByte('"')
	b.Write(e.CreatedAt.UTC().AppendFormat(created[:0], time.RFC3339Nano))
	b.WriteByte('"')
	switch {
	case !v2 && len(e.Data) > 0:
		field(false, "data")
		b.Write(e.Data)
	case v2 && len(e.Data) > 0:
		w.reset(e.Data) // the walk refuses what is not JSON
		sum, err := w.root()
		if err != nil {
			return "", Errorf(CodeInvalid, "event %d hash: data is not JSON: %w", e.Seq, err)
		}
		field(false, "data_digest")
		jcsString(b, string(sumDigest(sum)))
	case v2 && e.DataDigest != "":
		field(false, "data_digest")
		jcsString(b, string(e.DataDigest))
	}
	field(false, "entity_id")
	jcsString(b, e.EntityID)
	field(false, "entity_type")
	jcsString(b, e.EntityType)
	if v2 {
		field(false, "format")
		b.WriteString(strconv.Itoa(EventFormat))
	}
	field(false, "from_state")
	jcsString(b, e.FromState)
	field(false, "id")
	jcsString(b, string(e.ID))
	field(false, "prev_hash")
	jcsString(b, e.PrevHash)
	if v2 && len(e.Rows) > 0 {
		field(false, "rows")
		b.Write(e.Rows)
	}
	field(false, "run_id")
	jcsString(b, string(e.RunID))
	field(false, "seq")
	if e.Seq >= -1<<53 && e.Seq <= 1<<53 { // exact as a double: the common case, without float formatting
		b.WriteString(strconv.FormatInt(e.Seq, 10))
	} else {
		n, err := jcs.NumberToJSON(float64(e.Seq)) // what RFC 8785 makes of a number past 2^53
		if err != nil {
			return "", Errorf(CodeInvalid, "event hash: seq %d: %w", e.Seq, err)
		}
		b.WriteString(n)
	}
	field(false, "to_state")
	jcsString(b, e.ToState)
	field(false, "type")
	jcsString(b, e.Type)
	b.WriteByte('}')
	return string(digestBytes(b.Bytes())), nil
}

// jcsString writes s as RFC 8785 serializes strings: quotes, backslash and
// control characters escaped (the short forms where JSON has them, else
// \u00xx in lowercase hex), everything else as its own UTF-8. Runs of
// printable ASCII other than quote and backslash, which is nearly all an
// event holds (ids, states, times, hashes), are copied in one write;
// other bytes are written a rune at a time.
func jcsString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	done := 0 // s[:done] is written
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c <= 0x7e && c != '"' && c != '\\' {
			i++
			continue
		}
		b.WriteString(s[done:i])
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:]) // an invalid byte is U+FFFD, as encoding/json coerces it
			b.WriteRune(r)
			i += size
			done = i
			continue
		}
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&0xf])
			} else {
				b.WriteByte(c) // DEL (0x7f) is not escaped
			}
		}
		i++
		done = i
	}
	b.WriteString(s[done:])
	b.WriteByte('"')
}

// eventData returns the canonical JSON of an event's data. Nearly every
// event carries a flat map of strings, integers and booleans, which is
// written here directly (sorted keys, JCS strings, integers exact as
// doubles) instead of being marshalled, checked and re-parsed by
// CanonicalJSON; anything else — nested values, floats, raw JSON, types
// with their own marshalling, non-ASCII keys (JCS sorts by UTF-16 code
// units) — takes the general path. TestEventDataIsJCS holds the two to the
// same output.
func eventData(v any) ([]byte, error) {
	m, ok := v.(map[string]any)
	if !ok || m == nil { // a nil map is JSON null
		return CanonicalJSON(v)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		for i := range len(k) {
			if k[i] >= utf8.RuneSelf {
				return CanonicalJSON(v)
			}
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b bytes.Buffer
	b.Grow(32 * len(keys))
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		jcsString(&b, k)
		b.WriteByte(':')
		if !writeScalar(&b, m[k]) {
			return CanonicalJSON(v)
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// writeScalar writes v as JCS if it is a string, an integer exact as a
// double, a boolean, nil or an attempt's error, and reports whether it
// did.
func writeScalar(b *bytes.Buffer, v any) bool {
	const exact = 1 << 53
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		jcsString(b, x)
	case int:
		if x < -exact || x > exact {
			return false
		}
		b.WriteString(strconv.Itoa(x))
	case int64:
		if x < -exact || x > exact {
			return false
		}
		b.WriteString(strconv.FormatInt(x, 10))
	case *AttemptError: // the error of a finished attempt's event
		if x == nil {
			b.WriteString("null")
			break
		}
		b.WriteString(`{"code":`)
		jcsString(b, x.Code)
		b.WriteString(`,"message":`)
		jcsString(b, x.Message)
		b.WriteByte('}')
	default:
		t := reflect.TypeOf(v)
		if t.Kind() != reflect.String || t.Implements(jsonMarshaler) || t.Implements(textMarshaler) {
			return false
		}
		jcsString(b, reflect.ValueOf(v).String()) // ActionID, Kind, EffectFact…
	}
	return true
}

// VerifyEvents walks events (in the order given) as the chain of one run
// whose head is (headSeq, headHash), and reports the first broken link: a
// gap or reordering in the sequence, a prev_hash that is not the
// predecessor's hash, content that no longer matches its hash, an event of
// format 1 after one of format 2 (no build writes that), or a chain that
// stops short of the run's recorded head.
func VerifyEvents(run RunID, events []*Event, headSeq int64, headHash string) ChainReport {
	rep := ChainReport{RunID: run, Events: len(events)}
	broken := func(seq int64, format string, args ...any) ChainReport {
		rep.BrokenSeq, rep.Reason = seq, fmt.Sprintf(format, args...)
		return rep
	}
	prev := ""
	bound := false // an event of format 2 came before
	var w treeWalker
	for i, e := range events {
		want := int64(i + 1)
		switch {
		case e.RunID != run:
			return broken(want, "event %s belongs to run %s", e.ID, e.RunID)
		case e.Seq != want:
			return broken(want, "event %d is missing or out of order (found seq %d in its place)", want, e.Seq)
		case e.PrevHash != prev:
			return broken(want, "event %d does not point at event %d (prev_hash differs)", want, want-1)
		case bound && e.Format < EventFormat:
			return broken(want, "event %d has hash format %d after events of format %d", want, max(e.Format, 1), EventFormat)
		}
		h, err := e.computeHash(&w)
		if err != nil {
			return broken(want, "event %d cannot be hashed: %v", want, err)
		}
		if h != e.Hash {
			return broken(want, "event %d was changed after it was written (hash differs)", want)
		}
		prev, bound = e.Hash, bound || e.Format == EventFormat
	}
	n := int64(len(events))
	switch {
	case n > headSeq:
		return broken(headSeq+1, "chain holds %d events but the run records %d: events were added after its head", n, headSeq)
	case n < headSeq:
		return broken(n+1, "chain ends at event %d but the run records %d events: events were removed from the end", n, headSeq)
	case prev != headHash:
		return broken(n, "event %d is not the head the run records (its hash differs)", n)
	}
	rep.OK = true
	return rep
}

// VerifyRun is VerifyEvents and then, if the chain holds, a check of rows
// (the contents of the run's rows as they are now) against it: the newest
// event that binds each row must carry the digest of its content; every
// row an event binds must be among rows; every row must be bound by an
// event, unless it was last written before rows were bound (an entity
// whose events are of format 1: counted as Unbound, which the chain
// cannot vouch for). The first row that fails, by the sequence number of
// the event that bound it, is named.
func VerifyRun(run RunID, events []*Event, headSeq int64, headHash string, rows []Content) ChainReport {
	rep := VerifyEvents(run, events, headSeq, headHash)
	if !rep.OK {
		return rep
	}
	rep.Rows = len(rows)
	if brk := verifyRows(events, rows, &rep.Unbound); brk != nil {
		rep.OK = false
		rep.BrokenSeq, rep.Reason = brk.seq, brk.reason
		rep.Entity, rep.EntityID = brk.key.split()
	}
	return rep
}

// rowBreak is a row that does not match the chain.
type rowBreak struct {
	seq    int64
	key    RowKey
	reason string
}

// binding is the newest event that bound a row, and the digest it bound.
type binding struct {
	event  *Event
	digest Digest
	seen   bool // the row is among those checked
}

// verifyRows checks rows against the bindings of events, which verify as a
// chain, and returns the first row that fails; unbound counts the rows
// written before rows were bound.
func verifyRows(events []*Event, rows []Content, unbound *int) *rowBreak {
	bindings := map[RowKey]*binding{}
	legacy := map[string]bool{} // "<entity>/<id>" with events of format 1
	anyLegacy := false
	for _, e := range events {
		if e.Format < EventFormat {
			legacy[e.EntityType+"/"+e.EntityID], anyLegacy = true, true
			continue
		}
		err := eachRow(e.Rows, func(key RowKey, digest Digest) {
			if b := bindings[key]; b != nil {
				b.event, b.digest = e, digest
			} else {
				bindings[key] = &binding{event: e, digest: digest}
			}
		})
		if err != nil {
			return &rowBreak{seq: e.Seq, reason: fmt.Sprintf("event %d binds rows that cannot be read: %v", e.Seq, err)}
		}
	}
	var first *rowBreak
	note := func(b *rowBreak) {
		if first == nil || b.seq < first.seq || b.seq == first.seq && b.key < first.key {
			first = b
		}
	}
	head := int64(len(events))
	for _, c := range rows {
		key := c.Key()
		entity, id := key.split()
		b := bindings[key]
		switch {
		case b == nil && (legacy[string(key)] || entity == "budget" && anyLegacy):
			*unbound++
		case b == nil:
			note(&rowBreak{seq: head, key: key, reason: fmt.Sprintf("%s %s is recorded, but no event of the run binds it", entity, id)})
		case b.seen:
			note(&rowBreak{seq: b.event.Seq, key: key, reason: fmt.Sprintf("%s %s appears twice", entity, id)})
		default:
			b.seen = true
			if c.Digest() == b.digest {
				continue
			}
			why := c.explain(b.event)
			if why == "" {
				why = "its content no longer has the digest that event recorded"
			}
			note(&rowBreak{seq: b.event.Seq, key: key, reason: fmt.Sprintf("%s %s was changed after event %d recorded it: %s",
				entity, id, b.event.Seq, why)})
		}
	}
	for key, b := range bindings {
		if !b.seen {
			entity, id := key.split()
			note(&rowBreak{seq: b.event.Seq, key: key, reason: fmt.Sprintf("%s %s, which event %d recorded, is missing",
				entity, id, b.event.Seq)})
		}
	}
	return first
}

// eventSpec is an event to append; the chain fields are filled in by append.
type eventSpec struct {
	RunID      RunID
	Type       string
	EntityType string
	EntityID   string
	From, To   string
	Actor      string
	Data       any
	// Rows are the rows the write changed that this event binds, each
	// with the digest of its content after the write.
	Rows []boundRow
}

// boundRow is one row an event binds.
type boundRow struct {
	key    RowKey
	digest Digest
}

// bind adds c, a row's content after the write, to the rows the event
// binds.
func (s eventSpec) bind(c ...Content) eventSpec {
	for _, r := range c {
		s.Rows = append(s.Rows, boundRow{key: r.Key(), digest: r.Digest()})
	}
	return s
}

// transitionEvent is the event of a state change: type "<entity>.<to>".
func transitionEvent[S ~string](run RunID, entity, id string, from, to S, actor string, data any) eventSpec {
	return eventSpec{RunID: run, Type: entity + "." + string(to), EntityType: entity, EntityID: id,
		From: string(from), To: string(to), Actor: actor, Data: data}
}

// encodeRows is the canonical JSON of rows (an object; nil if there are
// none). A key bound twice keeps its last digest. Keys are ids, ASCII,
// whose byte order is JCS's; any other key takes the general path.
func encodeRows(rows []boundRow) ([]byte, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	for _, r := range rows {
		for i := range len(r.key) {
			if r.key[i] >= utf8.RuneSelf {
				m := make(map[RowKey]Digest, len(rows))
				for _, r := range rows {
					m[r.key] = r.digest
				}
				return CanonicalJSON(m)
			}
		}
	}
	if len(rows) > 1 {
		sorted := slices.Clone(rows)
		slices.SortStableFunc(sorted, func(a, b boundRow) int { return strings.Compare(string(a.key), string(b.key)) })
		rows = sorted[:0]
		for i, r := range sorted {
			if i+1 < len(sorted) && sorted[i+1].key == r.key {
				continue // bound again later in the write: the later digest is the row's
			}
			rows = append(rows, r)
		}
	}
	var b bytes.Buffer
	b.Grow(96 * len(rows))
	b.WriteByte('{')
	for i, r := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		jcsString(&b, string(r.key))
		b.WriteByte(':')
		jcsString(&b, string(r.digest))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// parseRows reads the rows an event binds (encodeRows' text). The text
// encodeRows writes is read directly; anything else — escapes, other
// bytes, white space — through encoding/json, which also words the errors.
// A value that is not a digest is an error.
func parseRows(raw []byte) ([]boundRow, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if rows, ok := parsePlainRows(raw); ok {
		return rows, nil
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	rows := make([]boundRow, 0, len(m))
	for k, v := range m {
		if !Digest(v).Valid() {
			return nil, fmt.Errorf("row %q: %q is not a digest", k, v)
		}
		rows = append(rows, boundRow{key: RowKey(k), digest: Digest(v)})
	}
	slices.SortFunc(rows, func(a, b boundRow) int { return strings.Compare(string(a.key), string(b.key)) })
	return rows, nil
}

// eachRow calls fn with each row of raw (parseRows' text), in order:
// encodeRows' text directly, anything else through parseRows.
func eachRow(raw []byte, fn func(RowKey, Digest)) error {
	if len(raw) == 0 {
		return nil
	}
	if plainRows(raw, nil) {
		plainRows(raw, fn)
		return nil
	}
	rows, err := parseRows(raw)
	if err != nil {
		return err
	}
	for _, r := range rows {
		fn(r.key, r.digest)
	}
	return nil
}

// parsePlainRows reads {"k":"v",…} whose strings are printable ASCII
// without quotes or backslashes and whose values are digests, and reports
// whether raw was that.
func parsePlainRows(raw []byte) ([]boundRow, bool) {
	if !plainRows(raw, nil) {
		return nil, false
	}
	var rows []boundRow
	plainRows(raw, func(k RowKey, d Digest) { rows = append(rows, boundRow{key: k, digest: d}) })
	return rows, true
}

// plainRows reports whether raw is {"k":"v",…} whose strings are printable
// ASCII without quotes or backslashes and whose values are digests, and if
// fn is set calls it with each member (only call it so on raw it vouched
// for: it stops at the first member that is not so).
func plainRows(raw []byte, fn func(RowKey, Digest)) bool {
	if len(raw) < 2 || raw[0] != '{' || raw[len(raw)-1] != '}' {
		return false
	}
	body := raw[1 : len(raw)-1]
	for len(body) > 0 {
		k, rest, ok := plainString(body)
		if !ok || len(rest) == 0 || rest[0] != ':' {
			return false
		}
		v, rest, ok := plainString(rest[1:])
		if !ok || !validDigest(v) {
			return false
		}
		if fn != nil {
			fn(RowKey(k), Digest(v))
		}
		switch {
		case len(rest) == 0:
			return true
		case rest[0] != ',' || len(rest) == 1:
			return false
		}
		body = rest[1:]
	}
	return true
}

// validDigest is Digest.Valid without a regular expression.
func validDigest(s []byte) bool {
	const prefix = "sha256:"
	if len(s) != len(prefix)+64 || string(s[:len(prefix)]) != prefix {
		return false
	}
	for _, c := range s[len(prefix):] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// plainString reads the string at the start of b when it is printable
// ASCII without quotes or backslashes, and returns its bytes with the rest
// of b.
func plainString(b []byte) ([]byte, []byte, bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return b[1:i], b[i+1:], true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, nil, false
		}
	}
	return nil, nil, false
}

// chainHead is a run's chain head as a write sees it: where it stood when
// the write first read it (base) and where the write has moved it.
type chainHead struct {
	base int64
	seq  int64
	hash string
}

// appendEvent writes the next event of a run's chain. The head is read
// once per write and kept in the txn; flushHeads moves the run's recorded
// head once at the end, guarded on the head it read, so that two writers
// can never fork the chain (on SQLite the IMMEDIATE transaction already
// serializes them).
func (tx *txn) appendEvent(spec eventSpec) (*Event, error) {
	h := tx.heads[spec.RunID]
	if h == nil {
		h = &chainHead{}
		var err error
		if h.seq, h.hash, err = tx.d.ChainHead(tx.ctx, spec.RunID); err != nil {
			return nil, fmt.Errorf("append event: %w", err)
		}
		h.base = h.seq
		if tx.heads == nil {
			tx.heads = map[RunID]*chainHead{}
		}
		tx.heads[spec.RunID] = h
	}
	e := &Event{
		ID: EventID(tx.newID(PrefixEvent)), RunID: spec.RunID, Seq: h.seq + 1,
		Type: spec.Type, EntityType: spec.EntityType, EntityID: spec.EntityID,
		FromState: spec.From, ToState: spec.To, Actor: spec.Actor,
		CreatedAt: tx.now, PrevHash: h.hash, Format: EventFormat,
	}
	rows, err := encodeRows(spec.Rows)
	if err != nil {
		return nil, fmt.Errorf("append event %s: rows: %w", spec.Type, err)
	}
	e.Rows = rows
	if spec.Data != nil {
		data, err := eventData(spec.Data)
		if err != nil {
			return nil, fmt.Errorf("append event %s: data: %w", spec.Type, err)
		}
		e.Data = data
	}
	hash, err := e.ComputeHash()
	if err != nil {
		return nil, err
	}
	e.Hash = hash
	if err := tx.write(func(d Tx) error { return d.InsertEvent(tx.ctx, e) }); err != nil {
		return nil, fmt.Errorf("append event %s: %w", e.Type, err)
	}
	h.seq, h.hash = e.Seq, e.Hash
	tx.wrote = true
	return e, nil
}

// flushHeads records on each run the head its events moved to, and signs
// it if the store has a signing key. The move of the fenced run's head
// (txn.fence) is guarded on the lease's token in the same statement: a
// refused move is ErrLeaseLost if the token changed, and the whole write
// is rolled back.
func (tx *txn) flushHeads() error {
	for run, h := range tx.heads {
		if h.seq == h.base {
			continue
		}
		from, seq, hash := h.base, h.seq, h.hash
		fence := tx.fence
		if fence != nil && fence.Run != run {
			fence = nil
		}
		err := tx.write(func(d Tx) error {
			var (
				moved bool
				err   error
			)
			if fence != nil {
				moved, err = d.MoveChainHeadFenced(tx.ctx, run, from, seq, hash, fence.Token)
			} else {
				moved, err = d.MoveChainHead(tx.ctx, run, from, seq, hash)
			}
			if err != nil {
				return fmt.Errorf("move chain head of run %s: %w", run, err)
			}
			if !moved && fence != nil {
				now, err := d.GetRunLease(tx.ctx, run)
				if err != nil {
					return fmt.Errorf("move chain head of run %s: read its lease: %w", run, err)
				}
				if now.Token != fence.Token {
					return leaseLost(*fence, *now)
				}
			}
			if !moved {
				return Errorf(CodeConflict, "run %s: chain moved underneath", run)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if tx.signer != nil {
			if err := tx.sign(run, h.seq, h.hash); err != nil {
				return err
			}
		}
		h.base = h.seq
	}
	return nil
}

// FindEvents returns a run's events in sequence order.
func (s *DB) FindEvents(ctx context.Context, run RunID) ([]*Event, error) {
	return read(ctx, s, "find_events", func(r Reader) ([]*Event, error) { return r.ListEvents(ctx, run, 0) })
}

// FindEventsAfter returns the events of f.RunID after f.AfterSeq, at most
// f.Limit of them, in sequence order.
func (s *DB) FindEventsAfter(ctx context.Context, f EventFilter) ([]*Event, error) {
	if f.AfterSeq < 0 || f.Limit < 0 {
		return nil, Errorf(CodeInvalid, "find events after: AfterSeq and Limit cannot be negative")
	}
	return read(ctx, s, "find_events_after", func(r Reader) ([]*Event, error) { return r.ListEventsAfter(ctx, f) })
}

// FindChain reads a run's events, its recorded head, its rows, the rule
// sets its actions cite and its head's signature in one read transaction
// and verifies them (a cited rule set by its digest): readers that
// show events, rows and their verdict (timelines, evidence) get all of it
// from one snapshot, in one pass.
func (s *DB) FindChain(ctx context.Context, run RunID) (*Chain, error) {
	return s.findChain(ctx, "find_chain", run)
}

// findChain is FindChain as the operation op.
func (s *DB) findChain(ctx context.Context, op string, run RunID) (*Chain, error) {
	var out Chain
	err := s.readSnapshot(ctx, op, func(r Reader) error {
		if err := readRecord(ctx, r, run, &out); err != nil {
			return err
		}
		events, err := r.ListEvents(ctx, run, out.Run.EventSeq)
		if err != nil {
			return err
		}
		out.Events = events
		out.Report = VerifyRun(run, out.Events, out.Run.EventSeq, out.Run.EventHash, out.contents())
		verifyRuleSets(&out)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// contents are the contents of the chain's rows, in the order a report
// shows them.
func (c *Chain) contents() []Content {
	out := make([]Content, 0, 2+len(c.Actions)+len(c.Attempts)+len(c.Approvals)+len(c.Observations)+1)
	out = append(out, RunContentOf(c.Run), BudgetContentOf(c.Run.ID, c.Run.Budget))
	for _, a := range c.Actions {
		out = append(out, ActionContentOf(a))
	}
	for _, a := range c.Attempts {
		out = append(out, AttemptContentOf(a))
	}
	for _, a := range c.Approvals {
		out = append(out, ApprovalContentOf(a))
	}
	if c.Cancellation != nil {
		out = append(out, CancellationContentOf(c.Cancellation))
	}
	for _, o := range c.Observations {
		out = append(out, ObservationContentOf(o))
	}
	return out
}

// VerifyChain is FindChain's verdict alone.
func (s *DB) VerifyChain(ctx context.Context, run RunID) (ChainReport, error) {
	c, err := s.findChain(ctx, "verify_chain", run)
	if err != nil {
		return ChainReport{}, err
	}
	return c.Report, nil
}
