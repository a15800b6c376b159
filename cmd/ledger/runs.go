package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newRunsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List and inspect runs on the server",
		Args:  usageArgs(cobra.NoArgs),
		Example: `  ledger runs list --state awaiting_approval
  ledger runs show $RUN
  ledger runs timeline $RUN`,
	}
	cmd.AddCommand(newRunsListCmd(), newRunsShowCmd(), newRunsTimelineCmd())
	return asUsage(cmd)
}

func newRunsListCmd() *cobra.Command {
	var (
		o      clientOptions
		state  string
		limit  int
		cursor string
	)
	cmd := &cobra.Command{
		Use:   "list [--state S] [--limit N] [--cursor C]",
		Short: "List the runs the token may read, oldest first (GET /v1/runs)",
		Long: `List runs the token may read. --state filters by run state (queued, running,
awaiting_approval, needs_review, stopping, completed, stopped, failed). When more runs
remain, the last line gives the --cursor of the next page.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return usagef("--limit must not be negative")
			}
			c, err := o.newClient()
			if err != nil {
				return err
			}
			q := url.Values{}
			if state != "" {
				q.Set("state", state)
			}
			if limit > 0 {
				q.Set("limit", strconv.Itoa(limit))
			}
			if cursor != "" {
				q.Set("cursor", cursor)
			}
			var list server.RunList
			raw, err := c.getJSON(cmd.Context(), "/v1/runs", q, &list)
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			return printRunList(cmd.OutOrStdout(), list)
		},
		Example: `  ledger runs list
  ledger runs list --state awaiting_approval --limit 20
  ledger runs list --json`,
	}
	cmd.Flags().StringVar(&state, "state", "", "only runs in this state")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many runs (0: the server's page size)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "the next_cursor of the previous page")
	addClientFlags(cmd, &o)
	return asUsage(cmd)
}

func printRunList(w io.Writer, list server.RunList) error {
	if len(list.Runs) == 0 && list.NextCursor == "" {
		_, err := fmt.Fprintln(w, "no runs")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tSTOP REASON\tAGENT\tSUBMITTED BY\tCREATED")
	for _, r := range list.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.State, orDash(string(r.StopReason)), r.Agent, r.SubmittedBy, fmtTime(r.CreatedAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.NextCursor != "" {
		_, err := fmt.Fprintf(w, "\nmore: --cursor %s\n", list.NextCursor)
		return err
	}
	return nil
}

func newRunsShowCmd() *cobra.Command {
	var (
		o           clientOptions
		field       string
		waitState   string
		waitTimeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "show RUN",
		Short: "Show a run with its actions, attempts, approvals and cancellation (GET /v1/runs/RUN)",
		Long: `Show one run. Each action is listed with its full digest and its arguments: approve
and deny take exactly that digest (--digest), so copy it from here, from
"ledger actions show" or from "ledger approvals list".

--wait-state S asks again every 100ms until the run is in state S (for example
awaiting_approval, or completed), then shows it. A run that ends in another state, or
is not in S after --wait-timeout, is shown as it is and exits 1.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutputFlags(o, field); err != nil {
				return err
			}
			want := ledger.RunState(waitState)
			switch {
			case waitState != "" && !want.Valid():
				return usagef("--wait-state %q: want one of %s", waitState, joinStates(ledger.RunStates()))
			case waitState == "" && cmd.Flags().Changed("wait-timeout"):
				return usagef("--wait-timeout goes with --wait-state")
			case waitTimeout <= 0:
				return usagef("--wait-timeout must be positive")
			}
			c, err := o.newClient()
			if err != nil {
				return err
			}
			run, raw, waitErr := getRun(cmd.Context(), c, args[0], want, waitTimeout)
			if raw == nil {
				return waitErr
			}
			switch {
			case o.asJSON:
				err = printJSON(cmd.OutOrStdout(), raw)
			case field != "":
				err = printField(cmd.OutOrStdout(), raw, "", field)
			default:
				err = printRun(cmd.OutOrStdout(), run)
			}
			return errors.Join(waitErr, err)
		},
		Example: `  ledger runs show run_01JBZ2W6Q8V1N3D5F7H9K0M2P4
  ledger runs show $RUN --json`,
	}
	addClientFlags(cmd, &o)
	addFieldFlag(cmd, &field)
	cmd.Flags().StringVar(&waitState, "wait-state", "", "wait until the run is in this state, e.g. awaiting_approval or completed")
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", time.Minute, "with --wait-state: give up after this long (exit 1)")
	return asUsage(cmd)
}

// getRun GETs the run once or, with want, until it is in state want. It
// returns the last answer it got (raw is nil if none) and, with want, an
// error (exit status 1) if the run ended in another state or was not in
// want within timeout.
func getRun(ctx context.Context, c *client, id string, want ledger.RunState, timeout time.Duration) (server.Run, []byte, error) {
	deadline := time.Now().Add(timeout)
	for {
		var run server.Run
		raw, err := c.getJSON(ctx, idPath("/v1/runs/%s", id), nil, &run)
		switch {
		case err != nil:
			return run, nil, err
		case want == "" || run.State == want:
			return run, raw, nil
		case run.State.Terminal():
			return run, raw, &waitError{msg: fmt.Sprintf("run %s ended %s (stop reason %s): it will not be %s", id, run.State, orDash(string(run.StopReason)), want)}
		case time.Until(deadline) < readyPollInterval:
			return run, raw, &waitError{msg: fmt.Sprintf("run %s is still %s after %s, not %s", id, run.State, timeout, want)}
		}
		if err := sleepCtx(ctx, readyPollInterval); err != nil {
			return run, raw, err
		}
	}
}

// waitError is a wait for a state that did not end in it: exit status 1.
type waitError struct{ msg string }

func (e *waitError) Error() string { return e.msg }
func (e *waitError) ExitCode() int { return exitOther }

func joinStates(states []ledger.RunState) string {
	names := make([]string, len(states))
	for i, st := range states {
		names[i] = string(st)
	}
	return strings.Join(names, ", ")
}

func printRun(w io.Writer, r server.Run) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "run:\t%s\n", r.ID)
	fmt.Fprintf(tw, "state:\t%s\n", r.State)
	fmt.Fprintf(tw, "stop reason:\t%s\n", orDash(string(r.StopReason)))
	fmt.Fprintf(tw, "agent:\t%s\n", r.Agent)
	fmt.Fprintf(tw, "tenant:\t%s\n", r.Tenant)
	fmt.Fprintf(tw, "submitted by:\t%s\n", r.SubmittedBy)
	fmt.Fprintf(tw, "created:\t%s\n", fmtTime(r.CreatedAt))
	fmt.Fprintf(tw, "updated:\t%s\n", fmtTime(r.UpdatedAt))
	fmt.Fprintf(tw, "budget:\t%s\n", budgetText(r.Budget))
	if d := r.Budget.Limits.Deadline; d != nil {
		fmt.Fprintf(tw, "deadline:\t%s\n", fmtTime(*d))
	}
	if c := r.Cancellation; c != nil {
		fmt.Fprintf(tw, "cancellation:\t%s (requested by %s at %s%s)\n", c.State, c.RequestedBy, fmtTime(c.RequestedAt), reasonSuffix(c.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Actions) == 0 {
		_, err := fmt.Fprintln(w, "\nno actions yet")
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tTOOL\tEFFECT\tSTATE\tDIGEST")
	for _, a := range r.Actions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.ID, displayText(a.Tool), a.Effect, a.State, a.ActionDigest)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, a := range r.Actions {
		fmt.Fprintf(w, "\n%s (%s):\n", a.ID, displayText(a.Tool))
		fmt.Fprintf(w, "  gate: %s\n", gateText(a.Gate))
		if a.Gate != nil {
			fmt.Fprintf(w, "  rules: %s\n", a.Gate.RulesDigest)
		}
		fmt.Fprintf(w, "  arguments:\n%s\n", indentLines(displayJSON(a.Arguments, true), "    "))
		if err := printActionHistory(w, a); err != nil {
			return err
		}
	}
	return nil
}

// budgetText is what a run has used of its budget, each measure with its
// limit if it has one; durations in milliseconds, as the API gives them.
func budgetText(b server.Budget) string {
	l, u := b.Limits, b.Used
	of := func(used, limit int64, unit string) string {
		if limit > 0 {
			return fmt.Sprintf("%d%s of %d%s", used, unit, limit, unit)
		}
		return fmt.Sprintf("%d%s", used, unit)
	}
	attempts := "attempts " + of(u.Attempts, l.MaxAttemptsPerRun, "")
	if l.MaxAttemptsPerAction > 0 {
		attempts += fmt.Sprintf(" (at most %d per action)", l.MaxAttemptsPerAction)
	}
	tokens := "tokens " + of(u.Tokens, l.MaxTokens, "")
	if u.TokensUnavailable {
		tokens = "tokens at least " + of(u.Tokens, l.MaxTokens, "") + " (a step reported no usage)"
	}
	return strings.Join([]string{attempts, "execution " + of(u.ExecutionMS, l.MaxExecutionMS, "ms"),
		"steps " + of(u.Steps, l.MaxSteps, ""), tokens}, "; ")
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return fmt.Sprintf(": %q", reason)
}

func newRunsTimelineCmd() *cobra.Command {
	var o clientOptions
	cmd := &cobra.Command{
		Use:   "timeline RUN",
		Short: "Show a run's redacted event timeline and whether its hash chain verifies (GET /v1/runs/RUN/timeline)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.newClient()
			if err != nil {
				return err
			}
			var tl server.Timeline
			raw, err := c.getJSON(cmd.Context(), idPath("/v1/runs/%s/timeline", args[0]), nil, &tl)
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			return printTimeline(cmd.OutOrStdout(), tl)
		},
		Example: `  ledger runs timeline $RUN
  ledger runs timeline $RUN --json`,
	}
	addClientFlags(cmd, &o)
	return asUsage(cmd)
}

func printTimeline(w io.Writer, tl server.Timeline) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tEVENT\tENTITY\tTRANSITION\tACTOR")
	for _, e := range tl.Events {
		transition := "-"
		if e.FromState != "" || e.ToState != "" {
			transition = orDash(e.FromState) + " -> " + orDash(e.ToState)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.Seq, fmtTime(e.CreatedAt), e.Type,
			strings.TrimSpace(e.EntityType+" "+e.EntityID), transition, orDash(e.Actor))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ch := tl.Chain
	if ch.OK {
		_, err := fmt.Fprintf(w, "\nchain: ok (%d events)\n", ch.Events)
		return err
	}
	_, err := fmt.Fprintf(w, "\nchain: BROKEN at event %d: %s\n", ch.BrokenSeq, ch.Reason)
	return err
}
