package simulator_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/simulator"
)

func TestParseCards(t *testing.T) {
	tests := []struct {
		name     string
		markdown string
		want     []simulator.Card
	}{
		{
			name: "Level2",
			markdown: "# Title\n\nIntro ignored.\n\n## First question\n\nLine one.\n\n\n\nLine two.  \n" +
				"## Second ##\nAnswer two\n### Sub\nmore\n",
			want: []simulator.Card{
				{Front: "First question", Back: "Line one.\nLine two."},
				{Front: "Second", Back: "Answer two\n### Sub\nmore"},
			},
		},
		{
			name:     "FallbackLevel1",
			markdown: "preface\n# One\nfirst\n# Two\r\nsecond\r\n",
			want: []simulator.Card{
				{Front: "One", Back: "first"},
				{Front: "Two", Back: "second"},
			},
		},
		{
			name:     "EmptySectionsSkipped",
			markdown: "## Empty\n\n   \n## Full\nbody\n## \nno front\n## Also empty\n",
			want:     []simulator.Card{{Front: "Full", Back: "body"}},
		},
		{
			name:     "Level1EndsACardInLevel2Mode",
			markdown: "## Q\nA\n# Chapter\nchapter text is not a card\n## R\nB\n",
			want:     []simulator.Card{{Front: "Q", Back: "A"}, {Front: "R", Back: "B"}},
		},
		{
			name:     "FencedCodeIsBody",
			markdown: "## Q\n```sh\n## not a heading\n```\n~~~\n# nor this\n~~~\n",
			want:     []simulator.Card{{Front: "Q", Back: "```sh\n## not a heading\n```\n~~~\n# nor this\n~~~"}},
		},
		{
			name:     "HashtagIsText",
			markdown: "## C#\n#tag line\n",
			want:     []simulator.Card{{Front: "C#", Back: "#tag line"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := simulator.ParseCards(tt.markdown)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseCardsErrors(t *testing.T) {
	for name, md := range map[string]string{
		"Empty":         "",
		"NoHeadings":    "just text\nand more\n",
		"OnlyEmpty":     "## A\n\n## B\n",
		"HeadingInCode": "```\n## Q\nA\n```\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := simulator.ParseCards(md)
			require.ErrorIs(t, err, simulator.ErrNoCards)
		})
	}
}

func TestParseCardsDeterministic(t *testing.T) {
	_, md := simulator.SampleDocument()
	first, err := simulator.ParseCards(md)
	require.NoError(t, err)
	for range 5 {
		again, err := simulator.ParseCards(md)
		require.NoError(t, err)
		require.Equal(t, first, again)
	}
}

func TestSampleDocument(t *testing.T) {
	title, md := simulator.SampleDocument()
	require.Equal(t, "Rust ownership and borrowing", title)
	cards, err := simulator.ParseCards(md)
	require.NoError(t, err)
	require.Len(t, cards, 5)
	require.Equal(t, "What are the three ownership rules?", cards[0].Front)
	require.Equal(t, "Each value in Rust has an owner.\nThere can only be one owner at a time.\n"+
		"When the owner goes out of scope, the value is dropped.", cards[0].Back)
}
