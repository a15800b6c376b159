package ledger

import (
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// jsonDoc draws a JSON text, most often well formed, with keys from a small
// set (spelled plainly, with escapes or with invalid UTF-8, so that
// duplicates are frequent and not always byte-equal), nesting around
// MaxJSONDepth, and sometimes cut short or followed by more data.
func jsonDoc(t *rapid.T) string {
	keys := []string{`"a"`, `"\u0061"`, `"b"`, `"é"`, `"\u00e9"`, `"\"q"`, "\"\xff\"", "\"\xfe\"", `""`}
	scalars := []string{`1`, `-0.5e3`, `true`, `null`, `"x\n"`, `"\ud83d\ude00"`, `"a"`, `"b"`}
	var value func(depth int) string
	value = func(depth int) string {
		// Near the top most values are containers with several members;
		// deeper down most are leaves, so documents stay small.
		if depth > MaxJSONDepth+2 || (depth > 0 && rapid.IntRange(0, 2+depth).Draw(t, "leaf") > 2) {
			return rapid.SampledFrom(scalars).Draw(t, "scalar")
		}
		n := rapid.IntRange(0, 5).Draw(t, "n")
		parts := make([]string, n)
		if rapid.IntRange(0, 2).Draw(t, "object") > 0 {
			for i := range parts {
				parts[i] = rapid.SampledFrom(keys).Draw(t, "key") + rapid.SampledFrom([]string{":", " : "}).Draw(t, "colon") + value(depth+1)
			}
			return "{" + strings.Join(parts, ",") + "}"
		}
		for i := range parts {
			parts[i] = value(depth + 1)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	var doc string
	if rapid.IntRange(0, 4).Draw(t, "deep") == 0 { // right at the depth limit
		d := rapid.IntRange(MaxJSONDepth-2, MaxJSONDepth+2).Draw(t, "depth")
		doc = strings.Repeat(`{"a":`, d) + value(MaxJSONDepth+1) + strings.Repeat("}", d)
	} else {
		doc = value(0)
	}
	switch rapid.IntRange(0, 9).Draw(t, "damage") {
	case 0:
		doc = doc[:rapid.IntRange(0, len(doc)).Draw(t, "cut")]
	case 1:
		doc += rapid.SampledFrom([]string{" ", "x", "{}", " 1"}).Draw(t, "tail")
	}
	return doc
}

// TestCheckJSONPaths holds CheckJSON's one-pass check of well-formed JSON to
// the json.Decoder path it replaced, on the same verdict and message.
func TestCheckJSONPaths(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		doc := []byte(jsonDoc(t))
		fast, slow := CheckJSON(doc), checkJSONTokens(doc)
		if (fast == nil) != (slow == nil) || (fast != nil && fast.Error() != slow.Error()) {
			t.Fatalf("%s:\n  CheckJSON:        %v\n  checkJSONTokens: %v", doc, fast, slow)
		}
	})
}

// TestActionDigestIsDigestOf holds ActionDigest's directly written document
// to the general path, DigestOf of the input (marshal, then canonicalize),
// for any tool names and argument documents — except arguments nested
// exactly MaxJSONDepth deep, which the general path refused for the level
// its wrapping object adds and ActionDigest accepts.
func TestActionDigestIsDigestOf(t *testing.T) {
	str := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.RuneFrom([]rune{'"', '\\', '\n', 0x01, 0x2028, 'é', '<', 'a'})),
		rapid.Custom(func(t *rapid.T) string { return string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")) }))
	rapid.Check(t, func(t *rapid.T) {
		in := ActionDigestInput{Tool: str.Draw(t, "tool"), ToolVersion: str.Draw(t, "version"),
			Effect: Effect(rapid.SampledFrom([]string{"read", "write", "é\x00"}).Draw(t, "effect")), Arguments: []byte(jsonDoc(t))}
		got, gotErr := ActionDigest(in)
		want, wantErr := DigestOf(in)
		if gotErr == nil && wantErr != nil && strings.Contains(wantErr.Error(), "nesting deeper") {
			if err := CheckJSON(in.Arguments); err != nil {
				t.Fatalf("ActionDigest accepted arguments CheckJSON refuses: %v", err)
			}
			return // the one difference: the wrapper's level
		}
		if (gotErr == nil) != (wantErr == nil) || got != want {
			t.Fatalf("%+v:\n  ActionDigest: %s, %v\n  DigestOf:     %s, %v", in, got, gotErr, want, wantErr)
		}
	})
}
