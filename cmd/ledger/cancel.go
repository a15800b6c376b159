package main

import (
	"fmt"
	"net/http"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newCancelCmd() *cobra.Command {
	var (
		o      clientOptions
		reason string
	)
	cmd := &cobra.Command{
		Use:   "cancel RUN [--reason R]",
		Short: "Request cancellation of a run (POST /v1/runs/RUN/cancel)",
		Long: `Request that RUN stop. The server answers with the cancellation's state
(requested, accepted, stopping, stopped): acceptance means no new attempt starts;
it says nothing about a call already in flight, whose effect the run's actions show
once it is established ("ledger runs show RUN"). Cancelling a finished run is a
conflict (exit status 6).`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.newClient()
			if err != nil {
				return err
			}
			res, err := c.do(cmd.Context(), request{method: http.MethodPost, path: idPath("/v1/runs/%s/cancel", args[0]),
				body: server.CancelRequest{Reason: reason}})
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), res.body)
			}
			var cn server.Cancellation
			if err := decodeBody(res.body, &cn); err != nil {
				return fmt.Errorf("cancel: %w", err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "cancellation of run %s: %s\n", args[0], cn.State)
			fmt.Fprintf(out, "requested by %s at %s%s\n", cn.RequestedBy, fmtTime(cn.RequestedAt), reasonSuffix(cn.Reason))
			if cn.StoppedAt == nil {
				fmt.Fprintf(out, "the run stops once no call is in flight; follow it with: ledger runs show %s\n", args[0])
			}
			return nil
		},
		Example: `  ledger cancel run_01JBZ2W6Q8V1N3D5F7H9K0M2P4 --reason "wrong document"
  ledger cancel $RUN --json`,
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the cancellation")
	addClientFlags(cmd, &o)
	return asUsage(cmd)
}
