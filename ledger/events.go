package ledger

import (
	"bytes"
	"context"
	"database/sql"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
	"gorm.io/gorm"
)

// ComputeHash returns the hash the event should carry given its content and
// its PrevHash: the sha256 of the RFC 8785 canonical JSON of every field
// but Hash. It writes that JSON directly (keys in order, JCS string
// escaping) instead of marshalling and re-parsing it, since it runs for
// every event written and verified; Data must already be canonical, as
// appendEvent stores it. TestEventHashIsJCS holds it to the general path.
func (e *Event) ComputeHash() (string, error) {
	if len(e.Data) > 0 && !json.Valid(e.Data) {
		return "", Errorf(CodeInvalid, "event %d hash: data is not JSON", e.Seq)
	}
	var b bytes.Buffer
	b.Grow(384 + len(e.Data))
	field := func(first bool, key string) {
		if !first {
			b.WriteByte(',')
		}
		jcsString(&b, key)
		b.WriteByte(':')
	}
	b.WriteByte('{')
	field(true, "actor")
	jcsString(&b, e.Actor)
	field(false, "created_at")
	jcsString(&b, e.CreatedAt.UTC().Format(time.RFC3339Nano))
	if len(e.Data) > 0 {
		field(false, "data")
		b.Write(e.Data)
	}
	field(false, "entity_id")
	jcsString(&b, e.EntityID)
	field(false, "entity_type")
	jcsString(&b, e.EntityType)
	field(false, "from_state")
	jcsString(&b, e.FromState)
	field(false, "id")
	jcsString(&b, string(e.ID))
	field(false, "prev_hash")
	jcsString(&b, e.PrevHash)
	field(false, "run_id")
	jcsString(&b, string(e.RunID))
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
	jcsString(&b, e.ToState)
	field(false, "type")
	jcsString(&b, e.Type)
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
// double, a boolean or nil, and reports whether it did.
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
// predecessor's hash, content that no longer matches its hash, or a chain
// that stops short of the run's recorded head.
func VerifyEvents(run RunID, events []*Event, headSeq int64, headHash string) ChainReport {
	rep := ChainReport{RunID: run, Events: len(events)}
	broken := func(seq int64, format string, args ...any) ChainReport {
		rep.BrokenSeq, rep.Reason = seq, fmt.Sprintf(format, args...)
		return rep
	}
	prev := ""
	for i, e := range events {
		want := int64(i + 1)
		switch {
		case e.RunID != run:
			return broken(want, "event %s belongs to run %s", e.ID, e.RunID)
		case e.Seq != want:
			return broken(want, "event %d is missing or out of order (found seq %d in its place)", want, e.Seq)
		case e.PrevHash != prev:
			return broken(want, "event %d does not point at event %d (prev_hash differs)", want, want-1)
		}
		h, err := e.ComputeHash()
		if err != nil {
			return broken(want, "event %d cannot be hashed: %v", want, err)
		}
		if h != e.Hash {
			return broken(want, "event %d was changed after it was written (hash differs)", want)
		}
		prev = e.Hash
	}
	n := int64(len(events))
	if n != headSeq || prev != headHash {
		return broken(n+1, "chain ends at event %d but the run records %d events: events were removed from the end", n, headSeq)
	}
	rep.OK = true
	return rep
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
}

// transitionEvent is the event of a state change: type "<entity>.<to>".
func transitionEvent[S ~string](run RunID, entity, id string, from, to S, actor string, data any) eventSpec {
	return eventSpec{RunID: run, Type: entity + "." + string(to), EntityType: entity, EntityID: id,
		From: string(from), To: string(to), Actor: actor, Data: data}
}

var (
	insertEventSQL = writeStmt(`INSERT INTO events (id, run_id, seq, type, entity_type, entity_id, from_state, to_state,
	actor, data, created_at, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	selectHeadSQL = writeStmt(`SELECT event_seq, event_hash FROM runs WHERE id = ?`)
	moveHeadSQL   = writeStmt(`UPDATE runs SET event_seq = ?, event_hash = ? WHERE id = ? AND event_seq = ?`)
)

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
		rows, err := tx.query(selectHeadSQL, string(spec.RunID))
		err = scanOne(rows, err, "run "+string(spec.RunID), func(rows *sql.Rows) error { return rows.Scan(&h.seq, &h.hash) })
		if err != nil {
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
		CreatedAt: tx.now, PrevHash: h.hash,
	}
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
	if _, err := tx.exec(insertEventSQL, string(e.ID), string(e.RunID), e.Seq, e.Type, e.EntityType, e.EntityID,
		e.FromState, e.ToState, e.Actor, rawPtr(e.Data), micros(e.CreatedAt), e.PrevHash, e.Hash); err != nil {
		return nil, fmt.Errorf("append event %s: %w", e.Type, err)
	}
	h.seq, h.hash = e.Seq, e.Hash
	return e, nil
}

// flushHeads records on each run the head its events moved to.
func (tx *txn) flushHeads() error {
	for run, h := range tx.heads {
		if h.seq == h.base {
			continue
		}
		moved, err := tx.execOne(moveHeadSQL, h.seq, h.hash, string(run), h.base)
		if err != nil {
			return fmt.Errorf("move chain head of run %s: %w", run, err)
		}
		if !moved {
			return Errorf(CodeConflict, "run %s: chain moved underneath", run)
		}
		h.base = h.seq
	}
	return nil
}

// FindEvents returns a run's events in sequence order.
func (s *GormStore) FindEvents(ctx context.Context, run RunID) ([]*Event, error) {
	events, err := readChainEvents(s.r.WithContext(ctx), run, 0)
	if err != nil {
		return nil, wrapErr("find events", err)
	}
	return events, nil
}

// FindChain reads a run's events and its recorded head in one read
// transaction and verifies them: readers that show events and their
// verdict (timelines, evidence) get both from one snapshot, in one pass.
func (s *GormStore) FindChain(ctx context.Context, run RunID) (*Chain, error) {
	var out Chain
	err := s.r.WithContext(ctx).Transaction(func(db *gorm.DB) error {
		var head runRow
		if err := db.Select("id", "event_seq", "event_hash").Where("id = ?", run).Take(&head).Error; err != nil {
			return err
		}
		events, err := readChainEvents(db, run, head.EventSeq)
		if err != nil {
			return err
		}
		out.Events = events
		out.Report = VerifyEvents(run, out.Events, head.EventSeq, head.EventHash)
		return nil
	})
	if err != nil {
		return nil, wrapErr("find chain of "+string(run), err)
	}
	return &out, nil
}

// VerifyChain is FindChain's verdict alone.
func (s *GormStore) VerifyChain(ctx context.Context, run RunID) (ChainReport, error) {
	c, err := s.FindChain(ctx, run)
	if err != nil {
		return ChainReport{}, err
	}
	return c.Report, nil
}
