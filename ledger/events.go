package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"
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

// ComputeHash returns the hash the event should carry given its content and
// its PrevHash.
func (e *Event) ComputeHash() (string, error) {
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

// appendEvent writes the next event of a run's chain and moves the run's
// head, guarded on the head it read so that two writers can never fork the
// chain (on SQLite the IMMEDIATE transaction already serializes them).
func (tx *txn) appendEvent(spec eventSpec) (*Event, error) {
	var head struct {
		EventSeq  int64
		EventHash string
	}
	res := tx.db.Model(&runRow{}).Select("event_seq", "event_hash").Where("id = ?", spec.RunID).Take(&head)
	if res.Error != nil {
		return nil, fmt.Errorf("append event: run %s: %w", spec.RunID, res.Error)
	}
	e := &Event{
		ID: EventID(tx.newID(PrefixEvent)), RunID: spec.RunID, Seq: head.EventSeq + 1,
		Type: spec.Type, EntityType: spec.EntityType, EntityID: spec.EntityID,
		FromState: spec.From, ToState: spec.To, Actor: spec.Actor,
		CreatedAt: tx.now, PrevHash: head.EventHash,
	}
	if spec.Data != nil {
		data, err := CanonicalJSON(spec.Data)
		if err != nil {
			return nil, fmt.Errorf("append event %s: data: %w", spec.Type, err)
		}
		e.Data = data
	}
	h, err := e.ComputeHash()
	if err != nil {
		return nil, err
	}
	e.Hash = h
	row := eventRow{
		ID: string(e.ID), RunID: string(e.RunID), Seq: e.Seq, Type: e.Type,
		EntityType: e.EntityType, EntityID: e.EntityID, FromState: e.FromState, ToState: e.ToState,
		Actor: e.Actor, Data: rawPtr(e.Data), CreatedAt: micros(e.CreatedAt), PrevHash: e.PrevHash, Hash: e.Hash,
	}
	if err := tx.db.Create(&row).Error; err != nil {
		return nil, fmt.Errorf("append event %s: %w", e.Type, err)
	}
	res = tx.db.Model(&runRow{}).Where("id = ? AND event_seq = ?", spec.RunID, head.EventSeq).
		Updates(map[string]any{"event_seq": e.Seq, "event_hash": e.Hash})
	if res.Error != nil {
		return nil, fmt.Errorf("append event %s: move head: %w", e.Type, res.Error)
	}
	if res.RowsAffected != 1 {
		return nil, Errorf(CodeConflict, "append event %s: run %s chain moved underneath", e.Type, spec.RunID)
	}
	return e, nil
}

// FindEvents returns a run's events in sequence order.
func (s *GormStore) FindEvents(ctx context.Context, run RunID) ([]*Event, error) {
	var rows []eventRow
	if err := s.r.WithContext(ctx).Where("run_id = ?", run).Order("seq").Find(&rows).Error; err != nil {
		return nil, wrapErr("find events", err)
	}
	out := make([]*Event, len(rows))
	for i := range rows {
		out[i] = rows[i].toEvent()
	}
	return out, nil
}

// VerifyChain recomputes a run's chain from the database.
func (s *GormStore) VerifyChain(ctx context.Context, run RunID) (ChainReport, error) {
	// One read transaction, so the head and the events are one snapshot.
	var rep ChainReport
	err := s.r.WithContext(ctx).Transaction(func(db *gorm.DB) error {
		var head runRow
		if err := db.Select("id", "event_seq", "event_hash").Where("id = ?", run).Take(&head).Error; err != nil {
			return err
		}
		var rows []eventRow
		if err := db.Where("run_id = ?", run).Order("seq").Find(&rows).Error; err != nil {
			return err
		}
		events := make([]*Event, len(rows))
		for i := range rows {
			events[i] = rows[i].toEvent()
		}
		rep = VerifyEvents(run, events, head.EventSeq, head.EventHash)
		return nil
	})
	if err != nil {
		return ChainReport{}, wrapErr("verify chain "+string(run), err)
	}
	return rep, nil
}
