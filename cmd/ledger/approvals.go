package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newApprovalsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "Approvals waiting for a person",
		Args:  usageArgs(cobra.NoArgs),
		Example: `  ledger approvals list
  ledger approvals list --state granted --json`,
	}
	cmd.AddCommand(newApprovalsListCmd())
	return asUsage(cmd)
}

func newApprovalsListCmd() *cobra.Command {
	var (
		o      clientOptions
		state  string
		field  string
		limit  int
		cursor string
	)
	cmd := &cobra.Command{
		Use:   "list [--state pending] [--limit N] [--cursor C]",
		Short: "List approvals of the tenant, oldest first (GET /v1/approvals)",
		Long: `List approvals, by default the pending ones, with the action each one is for,
its run, its tool, the full action digest to pass to "ledger approve --digest", when
it expires, and the start of the action's arguments on one line, a page at a time:
when more approvals remain, the last line gives the --cursor of the next page. The
table looks up each action (GET /v1/actions/ACTION) for its tool and arguments, since
an approval names neither; "ledger actions show ACTION" shows the arguments in full.
--json prints the server's page as it is; --field prints one field of each approval.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFlags(o, field); err != nil {
				return err
			}
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
			var list server.ApprovalList
			raw, err := c.getJSON(cmd.Context(), "/v1/approvals", q, &list)
			if err != nil {
				return err
			}
			switch {
			case o.asJSON:
				return printJSON(cmd.OutOrStdout(), raw)
			case field != "":
				return printField(cmd.OutOrStdout(), raw, "approvals", field)
			}
			actions, err := approvalActions(cmd.Context(), c, list.Approvals)
			if err != nil {
				return err
			}
			return printApprovals(cmd.OutOrStdout(), list, actions)
		},
		Example: `  LEDGER_TOKEN=$BOB ledger approvals list
  ledger approvals list --state expired
  ledger approvals list --json`,
	}
	cmd.Flags().StringVar(&state, "state", "pending", "approval state to list")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many approvals (0: the server's page size)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "the next_cursor of the previous page")
	addClientFlags(cmd, &o)
	addFieldFlag(cmd, &field)
	return asUsage(cmd)
}

// approvalActions looks up the action of each approval: the approval
// itself names neither its tool nor its arguments, and a person deciding
// needs to see both. An action that vanished meanwhile (404) is left out,
// and shows as "?".
func approvalActions(ctx context.Context, c *client, approvals []server.Approval) (map[string]server.Action, error) {
	actions := map[string]server.Action{}
	missing := map[string]bool{}
	for _, ap := range approvals {
		id := string(ap.ActionID)
		if _, ok := actions[id]; ok || missing[id] {
			continue
		}
		var a server.Action
		if _, err := c.getJSON(ctx, idPath("/v1/actions/%s", id), nil, &a); err != nil {
			if apiErr := (*APIError)(nil); errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
				missing[id] = true
				continue
			}
			return nil, err
		}
		actions[id] = a
	}
	return actions, nil
}

// approvalArgumentsWidth is how much of an action's arguments a row of
// approvals list shows; actions show shows them whole.
const approvalArgumentsWidth = 60

func printApprovals(w io.Writer, list server.ApprovalList, actions map[string]server.Action) error {
	if len(list.Approvals) == 0 && list.NextCursor == "" {
		_, err := fmt.Fprintln(w, "no approvals")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tRUN\tTOOL\tSTATE\tDIGEST\tEXPIRES\tARGUMENTS")
	for _, ap := range list.Approvals {
		tool, args := "?", "?"
		if a, ok := actions[string(ap.ActionID)]; ok {
			tool, args = displayText(a.Tool), compactJSON(a.Arguments, approvalArgumentsWidth)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ap.ActionID, ap.RunID, tool,
			ap.State, ap.ActionDigest, fmtTimePtr(ap.ExpiresAt), args)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w, "\nthe arguments in full: ledger actions show ACTION"); err != nil {
		return err
	}
	if list.NextCursor != "" {
		_, err := fmt.Fprintf(w, "\nmore: --cursor %s\n", list.NextCursor)
		return err
	}
	return nil
}
