package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newToolsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tools",
		Short: "The tools agents of your tenant may call",
		Args:  usageArgs(cobra.NoArgs),
		Example: `  ledger tools list
  ledger tools list --json`,
	}
	cmd.AddCommand(newToolsListCmd())
	return asUsage(cmd)
}

func newToolsListCmd() *cobra.Command {
	var o clientOptions
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the tools of the agents your tenant may use, and the http tools (GET /v1/tools)",
		Long: `List every tool of the agents the token's tenant may submit runs of, in name order:
its version and effect, what it guarantees (query, dedup, cancel), its timeout, who
executes it (client: the agent's own process, reporting each call through the agent
protocol; builtin: the ledger, with a tool of its own; http: the ledger, over HTTP) and,
for a client tool, its lease (the heartbeat timeout, and how long heartbeats may renew
it). The config file's http tools are listed whether or not an agent names them yet.
--json prints the server's answer as it is, arguments schemas included.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.newClient()
			if err != nil {
				return err
			}
			var list server.ToolList
			raw, err := c.getJSON(cmd.Context(), "/v1/tools", nil, &list)
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			return printTools(cmd.OutOrStdout(), list)
		},
		Example: `  LEDGER_TOKEN=$ALICE ledger tools list
  ledger tools list --json | jq '.tools[] | select(.executor == "client") | .name'`,
	}
	addClientFlags(cmd, &o)
	return asUsage(cmd)
}

func printTools(w io.Writer, list server.ToolList) error {
	if len(list.Tools) == 0 {
		_, err := fmt.Fprintln(w, "no tools")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tEFFECT\tGUARANTEES\tTIMEOUT\tEXECUTOR\tHEARTBEAT\tMAX DURATION")
	for _, t := range list.Tools {
		heartbeat, maxDuration := "-", "-"
		if t.HeartbeatTimeoutMS > 0 {
			heartbeat = msText(t.HeartbeatTimeoutMS)
		}
		if t.MaxDurationMS > 0 {
			maxDuration = msText(t.MaxDurationMS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", displayText(t.Name), displayText(t.Version), t.Effect,
			guaranteesText(t), msText(t.TimeoutMS), t.Executor, heartbeat, maxDuration)
	}
	return tw.Flush()
}

// guaranteesText names what a tool guarantees, "-" for nothing.
func guaranteesText(t server.Tool) string {
	var g []string
	if t.Guarantees.Query {
		g = append(g, "query")
	}
	if t.Guarantees.Dedup {
		g = append(g, "dedup")
	}
	if t.Guarantees.Cancel {
		g = append(g, "cancel")
	}
	if len(g) == 0 {
		return "-"
	}
	return strings.Join(g, ",")
}

// msText is a number of milliseconds as a duration: 30s, 10m0s.
func msText(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }
