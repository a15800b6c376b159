package main

import (
	"fmt"
	"net/http"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newResolveCmd() *cobra.Command {
	var (
		o       clientOptions
		outcome string
		note    string
	)
	cmd := &cobra.Command{
		Use:   "resolve ACTION --outcome happened|not_happened|abandon [--note N]",
		Short: "Settle an action in review: did its effect happen? (POST /v1/actions/ACTION/resolve)",
		Long: `Settle an action whose effect the ledger could not establish (state
needs_review). Check the tool's own records first, then say what you found:

  happened      the effect took place; the action succeeded and the run goes on
  not_happened  it did not; the action failed and the run fails with tool_error
  abandon       stop here whatever happened; the run stops with user_cancelled

An action that is not in review is a conflict (exit status 6).`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch outcome {
			case "happened", "not_happened", "abandon":
			case "":
				return usagef("--outcome is required: happened, not_happened or abandon")
			default:
				return usagef("--outcome must be happened, not_happened or abandon, not %q", outcome)
			}
			c, err := o.newClient()
			if err != nil {
				return err
			}
			res, err := c.do(cmd.Context(), request{method: http.MethodPost, path: idPath("/v1/actions/%s/resolve", args[0]),
				body: server.ResolveRequest{Outcome: outcome, Note: note}})
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), res.body)
			}
			var a server.Action
			if err := decodeBody(res.body, &a); err != nil {
				return fmt.Errorf("resolve: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "resolved %s (%s) of run %s as %s: action %s\n", args[0], orDash(a.Tool), orDash(string(a.RunID)), outcome, orDash(string(a.State)))
			return nil
		},
		Example: `  ledger resolve $ACTION --outcome happened --note "the cards are in the deck"
  ledger resolve $ACTION --outcome abandon`,
	}
	cmd.Flags().StringVar(&outcome, "outcome", "", "happened, not_happened or abandon (required)")
	cmd.Flags().StringVar(&note, "note", "", "what you checked, recorded with the resolution")
	addClientFlags(cmd, &o)
	return asUsage(cmd)
}
