package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newAgentsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agents",
		Short: "The agents your tenant may submit runs of",
		Args:  usageArgs(cobra.NoArgs),
		Example: `  ledger agents list
  ledger agents list --json`,
	}
	cmd.AddCommand(newAgentsListCmd())
	return asUsage(cmd)
}

func newAgentsListCmd() *cobra.Command {
	var o clientOptions
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the agents your tenant may submit runs of (GET /v1/agents)",
		Long: `List the agents the token's tenant may submit runs of ("ledger submit" names one), in
name order: who drives each (builtin: the ledger runs its loop; client: a process of
its own, through the agent protocol), the tools it may call ("ledger tools list") and
the loop-policy thresholds its runs are held to. --json prints the server's answer as
it is.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.newClient()
			if err != nil {
				return err
			}
			var list server.AgentList
			raw, err := c.getJSON(cmd.Context(), "/v1/agents", nil, &list)
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			return printAgents(cmd.OutOrStdout(), list)
		},
		Example: `  LEDGER_TOKEN=$ALICE ledger agents list
  ledger agents list --json`,
	}
	addClientFlags(cmd, &o)
	return asUsage(cmd)
}

func printAgents(w io.Writer, list server.AgentList) error {
	if len(list.Agents) == 0 {
		_, err := fmt.Fprintln(w, "no agents")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDRIVER\tTOOLS\tREPEAT LIMIT\tNO PROGRESS\tCONSECUTIVE ERRORS")
	for _, a := range list.Agents {
		tools := make([]string, len(a.Tools))
		for i, t := range a.Tools {
			tools[i] = displayText(t)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", displayText(a.Name), a.Driver, strings.Join(tools, ","),
			a.Policies.RepeatLimit, a.Policies.NoProgressWindow, a.Policies.ConsecutiveErrors)
	}
	return tw.Flush()
}
