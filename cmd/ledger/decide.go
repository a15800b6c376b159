package main

import (
	"fmt"
	"net/http"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newApproveCmd() *cobra.Command { return newDecideCmd(ledger.DecisionGrant) }

func newDenyCmd() *cobra.Command { return newDecideCmd(ledger.DecisionDeny) }

// newDecideCmd builds approve or deny: the same request to two endpoints.
func newDecideCmd(decision ledger.ApprovalDecision) *cobra.Command {
	var (
		o      clientOptions
		digest string
		reason string
	)
	verb, done, path := "approve", "approved", "/v1/actions/%s/approve"
	if decision == ledger.DecisionDeny {
		verb, done, path = "deny", "denied", "/v1/actions/%s/deny"
	}
	cmd := &cobra.Command{
		Use:   verb + " ACTION --digest sha256:… [--reason R]",
		Short: fmt.Sprintf("%s a pending action, bound to its exact digest (POST %s)", capitalize(verb), fmt.Sprintf(path, "ACTION")),
		Long: fmt.Sprintf(`%s the pending approval of ACTION. --digest is required and must be the action's
digest as shown by "ledger approvals list" or "ledger runs show": the decision binds to
it, so if the action changed since you looked, the server refuses (exit status 6) and
nothing is decided. Deciding an action of a run you submitted is refused (exit
status 4) unless the server runs in dev mode.`, capitalize(verb)),
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if digest == "" {
				return usagef("--digest is required: copy the action's digest from `ledger approvals list`")
			}
			c, err := o.newClient()
			if err != nil {
				return err
			}
			res, err := c.do(cmd.Context(), request{method: http.MethodPost, path: idPath(path, args[0]),
				body: server.DecisionRequest{ActionDigest: ledger.Digest(digest), Reason: reason}})
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), res.body)
			}
			var dr server.DecisionResponse
			if err := decodeBody(res.body, &dr); err != nil {
				return fmt.Errorf("%s: %w", verb, err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%s %s (%s) of run %s\n", done, dr.Action.ID, dr.Action.Tool, dr.Action.RunID)
			fmt.Fprintf(out, "digest:   %s\n", dr.Approval.ActionDigest)
			fmt.Fprintf(out, "approval: %s %s by %s%s\n", dr.Approval.ID, dr.Approval.State, dr.Approval.DecidedBy, reasonSuffix(dr.Approval.Reason))
			fmt.Fprintf(out, "action:   %s\n", dr.Action.State)
			return nil
		},
		Example: fmt.Sprintf(`  ledger actions show $ACTION      # the tool, its arguments and the digest you decide on
  ledger %[1]s act_01JBZ2W6QA0B1C2D3E4F5G6H7J --digest sha256:0620851b7fa5b158cec5681f4382b14b3f5d4ad9d756bad6268d1e7f14628143 --reason "cards look right"`, verb),
	}
	cmd.Flags().StringVar(&digest, "digest", "", "the action digest being decided (required)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the decision")
	addClientFlags(cmd, &o)
	return asUsage(cmd)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
