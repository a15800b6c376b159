package provider

import (
	"encoding/json"
	"sort"
)

// Reasons an opaque item is left out of a request.
const (
	// DropOtherFormat: the item was written by another wire format, which
	// alone can read it.
	DropOtherFormat = "other_format"
	// DropNoEncryptedContent: an OpenAI Responses reasoning item without
	// encrypted_content, which a stateless request (store: false) cannot
	// refer to; ask for it with the tier's reasoning_effort.
	DropNoEncryptedContent = "no_encrypted_content"
)

// Drop records opaque items left out of the request sent to one tier.
type Drop struct {
	Tier      string `json:"tier"`
	TierIndex int    `json:"tier_index"`
	Kind      Kind   `json:"kind"` // the format that wrote the items
	Type      string `json:"type"` // their type: reasoning, thinking, redacted_thinking
	Count     int    `json:"count"`
	Reason    string `json:"reason"` // DropOtherFormat or DropNoEncryptedContent
}

// sendable reports whether an adapter of kind to can send o back, and if
// not, why.
func sendable(to Kind, o Opaque) (bool, string) {
	if o.Kind != to {
		return false, DropOtherFormat
	}
	if to == KindOpenAIResponses && o.Type == "reasoning" {
		var item struct {
			EncryptedContent string `json:"encrypted_content"`
		}
		if json.Unmarshal(o.Data, &item) != nil || item.EncryptedContent == "" {
			return false, DropNoEncryptedContent
		}
	}
	return true, ""
}

// keptOpaque returns the items of a message an adapter of kind to sends.
func keptOpaque(to Kind, items []Opaque) []Opaque {
	var kept []Opaque
	for _, o := range items {
		if ok, _ := sendable(to, o); ok {
			kept = append(kept, o)
		}
	}
	return kept
}

// drops counts the opaque items of req a tier of kind to leaves out, by
// writer, type and reason, in a stable order.
func drops(to Kind, req Request) []Drop {
	type key struct {
		kind        Kind
		typ, reason string
	}
	counts := map[key]int{}
	for _, m := range req.Messages {
		for _, o := range m.Opaque {
			if ok, reason := sendable(to, o); !ok {
				counts[key{o.Kind, o.Type, reason}]++
			}
		}
	}
	out := make([]Drop, 0, len(counts))
	for k, n := range counts {
		out = append(out, Drop{Kind: k.kind, Type: k.typ, Reason: k.reason, Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Type != b.Type {
			return a.Type < b.Type
		}
		return a.Reason < b.Reason
	})
	return out
}
