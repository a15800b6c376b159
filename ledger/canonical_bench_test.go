package ledger

import (
	"encoding/json"
	"testing"
	"time"
)

// The hand-written canonical encodings of the write path, each beside the
// general path (encoding/json, then RFC 8785 by gowebpki/jcs) that its
// property test holds it to, on the inputs an auto-approved action writes.
// A fast path is kept only while it pays here (BENCHMARKS.md, "the durable
// action's CPU"):
//
//	go test -run '^$' -bench 'Canonical' -benchmem ./ledger/

func benchEvent(b *testing.B) *Event {
	b.Helper()
	rows, err := encodeRows([]boundRow{
		{key: "attempt/att_01JZ8X4Q2W3E4R5T6Y7U8I9O0P", digest: digestBytes([]byte("a"))},
		{key: "budget/run_01JZ8X4Q2W3E4R5T6Y7U8I9O0P", digest: digestBytes([]byte("b"))},
	})
	if err != nil {
		b.Fatal(err)
	}
	data, err := eventData(benchEventData)
	if err != nil {
		b.Fatal(err)
	}
	return &Event{ID: "evt_01JZ8X4Q2W3E4R5T6Y7U8I9O0P", RunID: "run_01JZ8X4Q2W3E4R5T6Y7U8I9O0P", Seq: 7,
		Type: "attempt.started", EntityType: "attempt", EntityID: "att_01JZ8X4Q2W3E4R5T6Y7U8I9O0P", ToState: "started",
		Actor: "engine", Data: data, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC),
		PrevHash: string(digestBytes([]byte("prev"))), Format: EventFormat, Rows: rows}
}

var benchEventData = map[string]any{"action_id": ActionID("act_01JZ8X4Q2W3E4R5T6Y7U8I9O0P"), "attempt_no": int64(1),
	"dedup_key": "run_01JZ8X4Q2W3E4R5T6Y7U8I9O0P/act_01JZ8X4Q2W3E4R5T6Y7U8I9O0P"}

func BenchmarkCanonicalEventHash(b *testing.B) {
	e := benchEvent(b)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.ComputeHash(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("jcs", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.computeHashJCS(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCanonicalEventData(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := eventData(benchEventData); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("jcs", func(b *testing.B) {
		for b.Loop() {
			if _, err := CanonicalJSON(benchEventData); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCanonicalRows(b *testing.B) {
	e := benchEvent(b)
	rows, err := parseRows(e.Rows)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode/direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := encodeRows(rows); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode/jcs", func(b *testing.B) {
		for b.Loop() {
			m := make(map[RowKey]Digest, len(rows))
			for _, r := range rows {
				m[r.key] = r.digest
			}
			if _, err := CanonicalJSON(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse/direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := parseRows(e.Rows); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse/json", func(b *testing.B) {
		for b.Loop() {
			var m map[string]string
			if err := json.Unmarshal(e.Rows, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCanonicalContentDigest(b *testing.B) {
	args := json.RawMessage(`{"cards":[{"back":"a","front":"q1"}],"title":"t"}`)
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	a := &Action{ID: "act_01JZ8X4Q2W3E4R5T6Y7U8I9O0P", RunID: "run_01JZ8X4Q2W3E4R5T6Y7U8I9O0P", Seq: 3, Tool: "cards.write",
		ToolVersion: "1", Effect: EffectWrite, State: ActionRunning, ActionDigest: digestBytes(args), Arguments: args,
		DedupKey: "run_01JZ8X4Q2W3E4R5T6Y7U8I9O0P/act_01JZ8X4Q2W3E4R5T6Y7U8I9O0P", CreatedAt: at, UpdatedAt: at,
		Gate: &ActionGate{Decision: ActionApproved, Rule: 0, Reason: "rule 0: cards.write is auto-approved", RulesDigest: digestBytes(nil)}}
	c := ActionContentOf(a)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			_ = c.Digest()
		}
	})
	b.Run("jcs", func(b *testing.B) {
		for b.Loop() {
			if _, err := DigestOf(c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCanonicalActionDigest(b *testing.B) {
	in := ActionDigestInput{Tool: "cards.write", ToolVersion: "1", Effect: EffectWrite,
		Arguments: json.RawMessage(`{"title":"t","cards":[{"front":"q1","back":"a"}]}`)}
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := ActionDigest(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("jcs", func(b *testing.B) {
		for b.Loop() {
			if _, err := DigestOf(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCanonicalCheckJSON(b *testing.B) {
	doc := []byte(`{"title":"t","cards":[{"front":"q1","back":"a"},{"front":"q2","back":"b"}]}`)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if err := CheckJSON(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decoder", func(b *testing.B) {
		for b.Loop() {
			if err := checkJSONTokens(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
