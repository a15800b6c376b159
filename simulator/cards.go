package simulator

import (
	"embed"
	"errors"
	"strings"
)

// Card is one practice card: a question on the front, its answer on the back.
type Card struct {
	Front string `json:"front"`
	Back  string `json:"back"`
}

// ErrNoCards is returned by ParseCards for a document without a single
// heading that has a body.
var ErrNoCards = errors.New("simulator: no cards: the document has no heading with a body")

// ParseCards turns a Markdown study document into practice cards.
//
// Each level-2 ATX heading ("## ") starts a card: its text is the front and
// the section's body, up to the next heading of level 1 or 2, is the back.
// A document without level-2 headings falls back to level-1 ("# ")
// headings. Text before the first heading is ignored, and so is text under a
// level-1 heading in a document that has level-2 headings (it is a title or
// a chapter, not a card).
//
// The rules are kept small and deterministic rather than full CommonMark:
// up to three spaces of indentation and a closing sequence of '#' are
// allowed on a heading; lines inside fenced code blocks (``` or ~~~) are
// never headings; setext headings and deeper ATX headings are body text.
// The back keeps the body's non-blank lines, trailing spaces removed,
// joined by a single "\n", so blank lines collapse away. A heading whose
// text or body is empty is skipped. A document that yields no card fails
// with ErrNoCards.
func ParseCards(markdown string) ([]Card, error) {
	lines := strings.Split(strings.ReplaceAll(markdown, "\r\n", "\n"), "\n")
	level := 2
	if !hasHeading(lines, 2) {
		level = 1
	}
	var (
		cards   []Card
		front   string
		body    []string
		inCard  bool
		inFence string
	)
	flush := func() {
		back := strings.TrimSpace(strings.Join(body, "\n"))
		if inCard && front != "" && back != "" {
			cards = append(cards, Card{Front: front, Back: back})
		}
		front, body, inCard = "", nil, false
	}
	for _, line := range lines {
		if inFence == "" {
			if l, text, ok := heading(line); ok && l <= level {
				flush()
				if l == level {
					front, inCard = text, true
				}
				continue
			}
		}
		inFence = nextFence(inFence, line)
		if !inCard {
			continue
		}
		if line = strings.TrimRight(line, " \t"); strings.TrimSpace(line) != "" {
			body = append(body, line)
		}
	}
	flush()
	if len(cards) == 0 {
		return nil, ErrNoCards
	}
	return cards, nil
}

// hasHeading reports whether lines hold an ATX heading of the given level
// outside fenced code.
func hasHeading(lines []string, level int) bool {
	fence := ""
	for _, line := range lines {
		if fence == "" {
			if l, _, ok := heading(line); ok && l == level {
				return true
			}
		}
		fence = nextFence(fence, line)
	}
	return false
}

// heading parses an ATX heading line: its level (1–6) and its text, without
// a closing sequence of '#'.
func heading(line string) (level int, text string, ok bool) {
	trimmed := strings.TrimLeft(line, " ")
	if len(line)-len(trimmed) > 3 {
		return 0, "", false
	}
	for level < len(trimmed) && trimmed[level] == '#' {
		level++
	}
	if level == 0 || level > 6 {
		return 0, "", false
	}
	rest := trimmed[level:]
	if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
		return 0, "", false // "#hashtag" is text
	}
	text = strings.TrimSpace(rest)
	if closing := strings.TrimRight(text, "#"); closing == "" {
		text = ""
	} else if closing != text && (strings.HasSuffix(closing, " ") || strings.HasSuffix(closing, "\t")) {
		text = strings.TrimSpace(closing)
	}
	return level, text, true
}

// nextFence returns the fence that is open after line, given the one open
// before it ("" for none).
func nextFence(open, line string) string {
	trimmed := strings.TrimLeft(line, " ")
	if len(line)-len(trimmed) > 3 {
		return open
	}
	for _, marker := range []string{"```", "~~~"} {
		if !strings.HasPrefix(trimmed, marker) {
			continue
		}
		switch {
		case open == "":
			return marker
		case open == marker && strings.TrimSpace(trimmed) == strings.Repeat(marker[:1], len(strings.TrimSpace(trimmed))):
			return ""
		}
	}
	return open
}

//go:embed testdata/*.md
var sampleFS embed.FS

// sampleFile is the study document SampleDocument returns.
const sampleFile = "testdata/rust-ownership.md"

// SampleDocument returns the study document the demo submits: its title
// (the text of its level-1 heading) and its Markdown.
func SampleDocument() (title, markdown string) {
	data, err := sampleFS.ReadFile(sampleFile)
	if err != nil {
		// The file is embedded at build time; failing to read it is a
		// broken build, not a runtime condition.
		panic("simulator: embedded sample document missing: " + err.Error())
	}
	markdown = string(data)
	for _, line := range strings.Split(markdown, "\n") {
		if l, text, ok := heading(line); ok && l == 1 {
			return text, markdown
		}
	}
	return "", markdown
}
