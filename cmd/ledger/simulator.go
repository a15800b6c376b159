package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/actionledger/ledger/simulator"
	"github.com/spf13/cobra"
)

func newSimulatorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "simulator",
		Short: "Inspect the tool simulator's own side-effect store",
		Example: `  ledger simulator effects --store ./ledger.db.effects.db
  ledger simulator effects --store ./ledger.db.effects.db --json`,
	}
	cmd.AddCommand(newSimulatorEffectsCmd())
	return cmd
}

func newSimulatorEffectsCmd() *cobra.Command {
	var (
		path   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "effects --store PATH",
		Short: "List the side effects the simulated tools recorded, read from their own store",
		Long: `List every side effect in the simulator's store (by default beside the ledger database,
<db>.effects.db). The ledger never writes this file, so its count is independent evidence
of how often a tool really acted. --json prints one JSON object per effect.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Opening creates a missing file; a typo must not read as "no effects".
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("effect store: %w", err)
			}
			store, err := simulator.OpenEffectStore(cmd.Context(), path, nil)
			if err != nil {
				return err
			}
			defer store.Close()
			effects, err := store.Effects(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				for _, e := range effects {
					if err := enc.Encode(e); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tTOOL\tDEDUP KEY\tARGUMENTS DIGEST\tTIME")
			for _, e := range effects {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", e.Seq, e.Tool, e.DedupKey, e.ArgumentsDigest, e.CreatedAt.Format("2006-01-02T15:04:05.000Z07:00"))
			}
			fmt.Fprintf(tw, "\n%d effects\n", len(effects))
			return tw.Flush()
		},
		Example: `  ledger simulator effects --store ./ledger.db.effects.db
  ledger simulator effects --store ./ledger.db.effects.db --json`,
	}
	cmd.Flags().StringVar(&path, "store", "./ledger.db.effects.db", "path of the simulator's effect store")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per effect")
	return cmd
}
