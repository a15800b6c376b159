package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// eventHashInput is what an event's hash covers: every field but the hash
// itself, the predecessor's hash included, so changing, removing or
// reordering any event breaks the chain from there on.
type eventHashInput struct {
	ID         EventID         `json:"id"`
	RunID      RunID           `json:"run_id"`
	Seq        int64           `json:"seq"`
	Type       string          `json:"type"`
	EntityType string          `json:"entity_type"`
	EntityID   string          `json:"entity_id"`
	FromState  string          `json:"from_state"`
	ToState    string          `json:"to_state"`
	Actor      string          `json:"actor"`
	Data       json.RawMessage `json:"data,omitempty"`
	CreatedAt  string          `json:"created_at"`
	PrevHash   string          `json:"prev_hash"`
}

// eventHashInputV2 is what the hash of an event of format 2 covers: the
// digest of its data instead of the data, its format, and the rows it
// binds.
type eventHashInputV2 struct {
	ID         EventID         `json:"id"`
	RunID      RunID           `json:"run_id"`
	Seq        int64           `json:"seq"`
	Type       string          `json:"type"`
	EntityType string          `json:"entity_type"`
	EntityID   string          `json:"entity_id"`
	FromState  string          `json:"from_state"`
	ToState    string          `json:"to_state"`
	Actor      string          `json:"actor"`
	DataDigest Digest          `json:"data_digest,omitempty"`
	Format     int             `json:"format"`
	Rows       json.RawMessage `json:"rows,omitempty"`
	CreatedAt  string          `json:"created_at"`
	PrevHash   string          `json:"prev_hash"`
}

// computeHashJCS is the general path ComputeHash must agree with: marshal,
// then canonicalize with the RFC 8785 implementation. Tests only.
func (e *Event) computeHashJCS() (string, error) {
	if e.Format == EventFormat {
		in := eventHashInputV2{ID: e.ID, RunID: e.RunID, Seq: e.Seq, Type: e.Type, EntityType: e.EntityType,
			EntityID: e.EntityID, FromState: e.FromState, ToState: e.ToState, Actor: e.Actor, DataDigest: e.DataDigest,
			Format: e.Format, Rows: e.Rows, CreatedAt: e.CreatedAt.UTC().Format(time.RFC3339Nano), PrevHash: e.PrevHash}
		if len(e.Data) > 0 {
			in.DataDigest = docDigest(e.Data) // held to the general path by TestTreeDigest
		}
		d, err := DigestOf(in)
		return string(d), err
	}
	d, err := DigestOf(eventHashInput{
		ID: e.ID, RunID: e.RunID, Seq: e.Seq, Type: e.Type,
		EntityType: e.EntityType, EntityID: e.EntityID,
		FromState: e.FromState, ToState: e.ToState, Actor: e.Actor,
		Data:      e.Data,
		CreatedAt: e.CreatedAt.UTC().Format(time.RFC3339Nano),
		PrevHash:  e.PrevHash,
	})
	if err != nil {
		return "", fmt.Errorf("event %d hash: %w", e.Seq, err)
	}
	return string(d), nil
}

// TestEventHashIsJCS holds the hand-written canonical encoding of
// ComputeHash to the general RFC 8785 path (marshal, then canonicalize),
// for any strings, including quotes, backslashes, control characters,
// non-ASCII, U+2028 and invalid UTF-8.
func TestEventHashIsJCS(t *testing.T) {
	text := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.RuneFrom([]rune{'"', '\\', '\n', '\t', 0x01, 0x1f, 0x7f, 0x2028, 'é', '😀', '<', '&', '/'})))
	str := rapid.OneOf(text, rapid.Custom(func(t *rapid.T) string { return string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")) }))
	rapid.Check(t, func(t *rapid.T) {
		e := &Event{
			ID: EventID(str.Draw(t, "id")), RunID: RunID(str.Draw(t, "run")), Seq: rapid.Int64().Draw(t, "seq"),
			Type: str.Draw(t, "type"), EntityType: str.Draw(t, "entity_type"), EntityID: str.Draw(t, "entity_id"),
			FromState: str.Draw(t, "from"), ToState: str.Draw(t, "to"), Actor: str.Draw(t, "actor"),
			CreatedAt: time.Unix(rapid.Int64Range(0, 1<<40).Draw(t, "sec"), rapid.Int64Range(0, 999999).Draw(t, "us")*1000),
			PrevHash:  str.Draw(t, "prev"),
		}
		if rapid.Bool().Draw(t, "has data") {
			data, err := CanonicalJSON(map[string]any{"k": str.Draw(t, "data"), "n": rapid.Int64().Draw(t, "n")})
			if err != nil {
				t.Fatal(err)
			}
			e.Data = data
		}
		var err error
		if rapid.Bool().Draw(t, "format 2") {
			e.Format = EventFormat
			if len(e.Data) == 0 && rapid.Bool().Draw(t, "data digest alone") {
				e.DataDigest = digestBytes([]byte(str.Draw(t, "hidden data")))
			}
			var rows []boundRow
			for i := range rapid.IntRange(0, 3).Draw(t, "rows") {
				// Row keys are "entity/id" of ledger-made ids, never invalid
				// UTF-8: two such keys would both read as U+FFFD.
				rows = append(rows, boundRow{key: RowKey(text.Draw(t, fmt.Sprint("key", i))), digest: digestBytes([]byte{byte(i)})})
			}
			if e.Rows, err = encodeRows(rows); err != nil {
				t.Fatal(err)
			}
		}
		fast, err := e.ComputeHash()
		if err != nil {
			t.Fatal(err)
		}
		slow, err := e.computeHashJCS()
		if err != nil {
			t.Fatal(err)
		}
		if fast != slow {
			t.Fatalf("hashes differ for %+v", e)
		}
	})
}

// jsonText is a string type with its own marshalling: eventData must leave
// it to encoding/json.
type jsonText string

func (j jsonText) MarshalText() ([]byte, error) { return []byte("text:" + string(j)), nil }

// TestEventDataIsJCS holds eventData's direct encoding of flat maps to the
// general RFC 8785 path (CanonicalJSON) for any keys and scalar values
// (an attempt's error among them),
// including the values it must hand over to the general path: big
// integers, floats, nested maps, raw JSON and types that marshal
// themselves.
func TestEventDataIsJCS(t *testing.T) {
	str := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.RuneFrom([]rune{'"', '\\', '\n', 0x01, 0x2028, 'é', '😀', '<', '&', 'a', 'B', '_'})),
		rapid.Custom(func(t *rapid.T) string { return string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")) }))
	scalar := rapid.OneOf(
		rapid.Just[any](nil), rapid.Map(rapid.Bool(), func(v bool) any { return v }),
		rapid.Map(str, func(v string) any { return v }), rapid.Map(str, func(v string) any { return ActionID(v) }),
		rapid.Map(rapid.Int(), func(v int) any { return v }), rapid.Map(rapid.Int64(), func(v int64) any { return v }),
		rapid.Map(rapid.Int64Range(-1<<53-3, -1<<53+3), func(v int64) any { return v }),
		rapid.Map(rapid.Int64Range(1<<53-3, 1<<53+3), func(v int64) any { return v }),
		rapid.Map(rapid.Int64Range(1<<53, 1<<62), func(v int64) any { return v }),
		rapid.Map(rapid.SliceOfN(str, 2, 2), func(v []string) any { return &AttemptError{Code: v[0], Message: v[1]} }),
		rapid.Just[any]((*AttemptError)(nil)),
	)
	general := rapid.OneOf(
		rapid.Map(rapid.Float64(), func(v float64) any { return v }),
		rapid.Map(str, func(v string) any { return jsonText(v) }),
		rapid.Map(str, func(v string) any { return map[string]any{"nested": v} }),
		rapid.Just[any](json.RawMessage(`{"b": 1, "a": [2, 1.0]}`)),
	)
	rapid.Check(t, func(t *rapid.T) {
		value := scalar
		if rapid.Bool().Draw(t, "beyond scalars") {
			value = rapid.OneOf(scalar, general)
		}
		key := rapid.StringOf(rapid.RuneFrom([]rune("abcAB_0<\"\\\x01")))
		if rapid.Bool().Draw(t, "any keys") {
			key = str
		}
		m := rapid.MapOf(key, value).Draw(t, "data")
		if rapid.IntRange(0, 9).Draw(t, "nil map") == 0 {
			m = nil // a typed nil map is JSON null
		}
		fast, fastErr := eventData(m)
		slow, slowErr := CanonicalJSON(m)
		if (fastErr == nil) != (slowErr == nil) || string(fast) != string(slow) {
			t.Fatalf("eventData = %s, %v; CanonicalJSON = %s, %v", fast, fastErr, slow, slowErr)
		}
	})
}

// TestEventHashFormats: the hash of a format 2 event covers the digest of
// its data, so DataDigest in place of the data gives the same hash; a
// format 1 event binds no rows; an unknown format is refused.
func TestEventHashFormats(t *testing.T) {
	rows, err := encodeRows([]boundRow{{key: "run/run_1", digest: digestBytes(nil)}})
	if err != nil {
		t.Fatal(err)
	}
	e := &Event{ID: "evt_1", RunID: "run_1", Seq: 1, Type: "run.queued", EntityType: "run", EntityID: "run_1",
		Data: []byte(`{"a":1}`), CreatedAt: time.Unix(1, 0), Format: EventFormat, Rows: rows}
	withData, err := e.ComputeHash()
	if err != nil {
		t.Fatal(err)
	}
	hidden := *e
	hidden.Data, hidden.DataDigest = nil, docDigest(e.Data)
	if got, err := hidden.ComputeHash(); err != nil || got != withData {
		t.Fatalf("hash with the data's digest = %s, %v; with the data %s", got, err, withData)
	}
	v1 := *e
	v1.Format = 1
	if _, err := v1.ComputeHash(); err == nil {
		t.Fatal("a format 1 event with rows was hashed")
	}
	v3 := *e
	v3.Format = 3
	if _, err := v3.ComputeHash(); err == nil {
		t.Fatal("format 3 was hashed")
	}
}

// TestParseRows: the rows encodeRows writes read back directly, and the
// same object in any other JSON text reads back the same through
// encoding/json; a key bound twice in one write keeps its last digest;
// values that are not digests are refused.
func TestParseRows(t *testing.T) {
	str := rapid.OneOf(rapid.StringMatching(`[a-z]{1,8}/[a-z_0-9]{1,12}`), rapid.String())
	rapid.Check(t, func(t *rapid.T) {
		var rows []boundRow
		want := map[RowKey]Digest{}
		for i := range rapid.IntRange(1, 5).Draw(t, "n") {
			k := RowKey(str.Draw(t, fmt.Sprint("key", i)))
			d := digestBytes([]byte{byte(i)})
			rows, want[k] = append(rows, boundRow{key: k, digest: d}), d
		}
		raw, err := encodeRows(rows)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseRows(raw)
		if err != nil {
			t.Fatalf("parse %s: %v", raw, err)
		}
		m := map[RowKey]Digest{}
		for _, r := range got {
			m[r.key] = r.digest
		}
		if !reflect.DeepEqual(m, want) || len(got) != len(want) {
			t.Fatalf("parse %s = %v, want %v", raw, got, want)
		}
		var spaced bytes.Buffer
		if err := json.Indent(&spaced, raw, "", " "); err != nil {
			t.Fatal(err)
		}
		again, err := parseRows(spaced.Bytes())
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("parse of indented %s = %v, %v; want %v", spaced.Bytes(), again, err, got)
		}
	})
	for _, bad := range []string{`{"a":"b"}`, `{"a":1}`, `[]`, `{"a":"sha256:00"}`, `{`} {
		if _, err := parseRows([]byte(bad)); err == nil {
			t.Errorf("parseRows(%s) accepted it", bad)
		}
	}
}
