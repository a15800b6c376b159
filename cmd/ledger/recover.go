package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/actionledger/ledger/recovery"
	"github.com/spf13/cobra"
)

// recover runs the recovery scan over the ledger before the service takes
// work, so every interrupted action gets its decision first.
func (svc *service) recover(ctx context.Context) error {
	rep, err := svc.engine.Recover(ctx)
	if err != nil {
		return fmt.Errorf("recovery scan: %w", err)
	}
	if rep.Actions > 0 || len(rep.Errors) > 0 || len(rep.Cancellations) > 0 || rep.Held > 0 {
		svc.log.InfoContext(ctx, "recovery scan", "actions", rep.Actions, "decisions", rep.Decisions,
			"cancellations_settled", len(rep.Cancellations), "held_elsewhere", rep.Held, "errors", len(rep.Errors))
	}
	return nil
}

func newRecoverCmd() *cobra.Command {
	var (
		dbPath, signingKey, configPath string
		asJSON, allowUnsigned          bool
	)
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Decide, record and act on every interrupted action of the database",
		Long: `Run the recovery scan on a database file: every approved, running or uncertain action of
a live run gets one decision from the recovery table (continue, reconcile, stop or review),
recorded with its rationale as an event, and acted on. First it settles cancellations an older
version left half-done (too_late on a run that ended first). ` + "`ledger serve`" + ` runs the same
scan at start-up. It recovers only the runs whose leases it can claim: a run another live
process holds is that process's to recover, and is counted as held.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			svc, err := openLocalService(ctx, cmd.ErrOrStderr(), dbPath, signingKey, configPath, allowUnsigned)
			if err != nil {
				return err
			}
			defer svc.Close()
			rep, err := svc.engine.Recover(ctx)
			if err != nil {
				return err
			}
			return printScan(cmd, rep, asJSON)
		},
		Example: `  ledger recover --db ./ledger.db
  ledger recover --db ./ledger.db --json`,
	}
	addDBFlag(cmd, &dbPath)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&configPath, "config", "", "the operator's config file, as serve's: its agents, tools and rules (env "+envConfig+")")
	cmd.Flags().StringVar(&signingKey, "signing-key", "", "sign chain heads with this Ed25519 key file (env "+envSigningKeyFile+")")
	cmd.Flags().BoolVar(&allowUnsigned, "allow-unsigned", false, allowUnsignedUsage)
	return cmd
}

func printScan(cmd *cobra.Command, rep recovery.ScanReport, asJSON bool) error {
	out := cmd.OutOrStdout()
	if asJSON {
		return json.NewEncoder(out).Encode(rep)
	}
	fmt.Fprintf(out, "%d actions scanned\n", rep.Actions)
	kinds := make([]string, 0, len(rep.Decisions))
	for k := range rep.Decisions {
		kinds = append(kinds, string(k))
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(out, "  %-10s %d\n", k, rep.Decisions[recovery.Kind(k)])
	}
	for _, c := range rep.Cancellations {
		fmt.Fprintf(out, "  cancellation %s of %s: %s\n", c.ID, c.RunID, c.State)
	}
	if rep.Held > 0 {
		fmt.Fprintf(out, "  %d runs held by another process, left to it\n", rep.Held)
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(out, "  error: %s\n", e)
	}
	if len(rep.Errors) > 0 {
		return fmt.Errorf("recovery: %d actions could not be recovered", len(rep.Errors))
	}
	return nil
}
