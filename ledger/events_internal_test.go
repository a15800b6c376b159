package ledger

import (
	"encoding/json"
	"fmt"
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

// computeHashJCS is the general path ComputeHash must agree with: marshal,
// then canonicalize with the RFC 8785 implementation. Tests only.
func (e *Event) computeHashJCS() (string, error) {
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
	str := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.RuneFrom([]rune{'"', '\\', '\n', '\t', 0x01, 0x1f, 0x7f, 0x2028, 'é', '😀', '<', '&', '/'})),
		rapid.Custom(func(t *rapid.T) string { return string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")) }))
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
// general RFC 8785 path (CanonicalJSON) for any keys and scalar values,
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
