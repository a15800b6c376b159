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
	}
	cmd.AddCommand(newApprovalsListCmd())
	return asUsage(cmd)
}

func newApprovalsListCmd() *cobra.Command {
	var (
		o      clientOptions
		state  string
		limit  int
		cursor string
	)
	cmd := &cobra.Command{
		Use:   "list [--state pending] [--limit N] [--cursor C]",
		Short: "List approvals of the tenant, oldest first (GET /v1/approvals)",
		Long: `List approvals, by default the pending ones, with the action each one is for,
its run, its tool, the full action digest to pass to "ledger approve --digest", and
when it expires, a page at a time: when more approvals remain, the last line gives
the --cursor of the next page. The table looks up each action's tool
(GET /v1/actions/ACTION); --json prints the server's page as it is.`,
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
			var list server.ApprovalList
			raw, err := c.getJSON(cmd.Context(), "/v1/approvals", q, &list)
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			tools, err := actionTools(cmd.Context(), c, list.Approvals)
			if err != nil {
				return err
			}
			return printApprovals(cmd.OutOrStdout(), list, tools)
		},
	}
	cmd.Flags().StringVar(&state, "state", "pending", "approval state to list")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many approvals (0: the server's page size)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "the next_cursor of the previous page")
	addClientFlags(cmd, &o)
	return asUsage(cmd)
}

// actionTools looks up the tool of each approval's action: the approval
// itself does not name it, and a person deciding needs to see it. An
// action that vanished meanwhile (404) shows as "?".
func actionTools(ctx context.Context, c *client, approvals []server.Approval) (map[string]string, error) {
	tools := map[string]string{}
	for _, ap := range approvals {
		id := string(ap.ActionID)
		if _, ok := tools[id]; ok {
			continue
		}
		var a server.Action
		if _, err := c.getJSON(ctx, idPath("/v1/actions/%s", id), nil, &a); err != nil {
			if apiErr := (*APIError)(nil); errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
				tools[id] = "?"
				continue
			}
			return nil, err
		}
		tools[id] = a.Tool
	}
	return tools, nil
}

func printApprovals(w io.Writer, list server.ApprovalList, tools map[string]string) error {
	if len(list.Approvals) == 0 && list.NextCursor == "" {
		_, err := fmt.Fprintln(w, "no approvals")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tRUN\tTOOL\tSTATE\tDIGEST\tEXPIRES")
	for _, ap := range list.Approvals {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", ap.ActionID, ap.RunID, orDash(tools[string(ap.ActionID)]),
			ap.State, ap.ActionDigest, fmtTimePtr(ap.ExpiresAt))
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
