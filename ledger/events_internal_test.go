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
