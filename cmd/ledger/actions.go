package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newActionsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "actions",
		Short:   "Inspect the actions of runs: what a tool is asked to do",
		Example: "  ledger actions show $ACTION\n  ledger actions show $ACTION --json",
	}
	cmd.AddCommand(newActionsShowCmd())
	return cmd
}

func newActionsShowCmd() *cobra.Command {
	var (
		o     clientOptions
		field string
	)
	cmd := &cobra.Command{
		Use:   "show ACTION",
		Short: "Show one action with its arguments, digest, attempts and approvals (GET /v1/actions/ACTION)",
		Long: `Show what ACTION asks its tool to do: the tool and its effect, the action's state,
its full digest (what "ledger approve --digest" binds to), its arguments as the
server shows them (secret values redacted), its attempts and its approvals. Look here
before you approve: the digest covers exactly these arguments. "gate" says which
rule of the rules file (or the default) chose the state the action entered, and
why; "rules" is the digest of the rule set in force, as "ledger serve" logs it at start-up.

Characters that could hide or reorder text on a terminal (control and format
characters, such as escape sequences or right-to-left overrides) are shown as \uXXXX
escapes. --json prints the server's JSON instead.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutputFlags(o, field); err != nil {
				return err
			}
			c, err := o.newClient()
			if err != nil {
				return err
			}
			var a server.Action
			raw, err := c.getJSON(cmd.Context(), idPath("/v1/actions/%s", args[0]), nil, &a)
			if err != nil {
				return err
			}
			switch {
			case o.asJSON:
				return printJSON(cmd.OutOrStdout(), raw)
			case field != "":
				return printField(cmd.OutOrStdout(), raw, "", field)
			}
			return printAction(cmd.OutOrStdout(), a)
		},
		Example: `  ledger actions show act_01JBZ2W6QA0B1C2D3E4F5G6H7J
  DIGEST=$(ledger actions show $ACTION --field action_digest)
  ledger actions show $ACTION --json`,
	}
	addClientFlags(cmd, &o)
	addFieldFlag(cmd, &field)
	return cmd
}

func printAction(w io.Writer, a server.Action) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "action:\t%s\n", a.ID)
	fmt.Fprintf(tw, "run:\t%s\n", a.RunID)
	tool := displayText(a.Tool)
	if a.ToolVersion != "" {
		tool += " (version " + displayText(a.ToolVersion) + ")"
	}
	fmt.Fprintf(tw, "tool:\t%s\n", tool)
	fmt.Fprintf(tw, "effect:\t%s\n", a.Effect)
	fmt.Fprintf(tw, "state:\t%s\n", a.State)
	fmt.Fprintf(tw, "gate:\t%s\n", gateText(a.Gate))
	if a.Gate != nil {
		fmt.Fprintf(tw, "rules:\t%s\n", a.Gate.RulesDigest)
	}
	fmt.Fprintf(tw, "digest:\t%s\n", a.ActionDigest)
	fmt.Fprintf(tw, "dedup key:\t%s\n", displayText(a.DedupKey))
	if a.Supersedes != "" {
		fmt.Fprintf(tw, "supersedes:\t%s\n", a.Supersedes)
	}
	fmt.Fprintf(tw, "created:\t%s\n", fmtTime(a.CreatedAt))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\narguments:\n%s\n", indentLines(displayJSON(a.Arguments, true), "  "))
	if len(a.Attempts) == 0 && len(a.Approvals) == 0 {
		_, err := fmt.Fprintln(w, "\nno attempts, no approvals")
		return err
	}
	fmt.Fprintln(w)
	return printActionHistory(w, a)
}

// gateText is the gate's decision on an action in words: which rule (or
// the default) chose which state, and why, e.g. "rule 2 — approved:
// cards.write is auto-approved". The reason's own "rule 2: " is not
// repeated.
func gateText(g *server.ActionGate) string {
	if g == nil {
		return "not recorded (the action predates the gate's audit)"
	}
	by := "default"
	if g.Rule != nil {
		by = "rule " + strconv.Itoa(*g.Rule)
	}
	return fmt.Sprintf("%s — %s: %s", by, g.Decision, displayText(strings.TrimPrefix(g.Reason, by+": ")))
}

// printActionHistory writes an action's attempts, then its approvals: two
// tables, since their columns differ.
func printActionHistory(w io.Writer, a server.Action) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, at := range a.Attempts {
		errText := ""
		if at.Error != nil {
			errText = fmt.Sprintf("\terror %s: %s", displayText(at.Error.Code), displayText(at.Error.Message))
		}
		fmt.Fprintf(tw, "  attempt %d\t%s\tstatus %s\teffect %s\tstarted %s\tfinished %s%s\n",
			at.No, at.ID, at.Status, at.Effect, fmtTime(at.StartedAt), fmtTimePtr(at.FinishedAt), errText)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, ap := range a.Approvals {
		decided := ""
		if ap.DecidedBy != "" {
			decided = fmt.Sprintf("\tby %s at %s%s", displayText(ap.DecidedBy), fmtTimePtr(ap.DecidedAt), reasonSuffix(ap.Reason))
		}
		fmt.Fprintf(tw, "  approval\t%s\t%s\texpires %s\tdigest %s%s\n", ap.ID, ap.State, fmtTimePtr(ap.ExpiresAt), ap.ActionDigest, decided)
	}
	return tw.Flush()
}

// displayJSON renders a JSON value for a person: indented, or compact on
// one line, with every character that could hide or reorder text on a
// terminal escaped (see displayText). A value that is not JSON is shown
// quoted.
func displayJSON(raw json.RawMessage, indent bool) string {
	var buf bytes.Buffer
	var err error
	if indent {
		err = json.Indent(&buf, raw, "", "  ")
	} else {
		err = json.Compact(&buf, raw)
	}
	if err != nil {
		return strconv.Quote(string(raw))
	}
	return displayText(buf.String())
}

// displayText escapes, as JSON's \uXXXX, every rune of s that is not
// printable but a newline: control characters (a terminal's escape
// sequences), format characters (bidirectional overrides, zero-width
// characters, tag characters) and non-ASCII spaces. Arguments come from a
// model or an agent, and an approver must read exactly what the digest
// covers. Inside a JSON string the escape is the same character.
func displayText(s string) string {
	if !strings.ContainsFunc(s, hidden) {
		return s
	}
	var b strings.Builder
	for i, w := 0, 0; i < len(s); i += w {
		r, width := utf8.DecodeRuneInString(s[i:])
		w = width
		switch {
		case r == utf8.RuneError && width == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case hidden(r):
			if r1, r2 := utf16.EncodeRune(r); r1 != unicode.ReplacementChar {
				fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func hidden(r rune) bool { return r != '\n' && (r == utf8.RuneError || !unicode.IsPrint(r)) }

// compactJSON is a JSON value on one line for a table cell, cut after max
// runes with "…".
func compactJSON(raw json.RawMessage, max int) string {
	s := displayJSON(raw, false)
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	runes := []rune(s)
	return string(runes[:max]) + "…"
}

func indentLines(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}
