package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newWorkerCmd() *cobra.Command {
	var (
		dbPath, signingKey, configPath string
		untilIdle, allowUnsigned       bool
	)
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Advance runs on a database file without serving HTTP",
		Long: `Run the recovery scan, then advance every runnable run (queued, running, stopping)
until none is left (--until-idle) or until interrupted. Runs waiting for a person stay
waiting. It advances only the runs whose leases it claims: several workers and servers
may share one database, each run advanced by one of them at a time; a run another live
process holds is left to it (--until-idle does not wait for it). The crash tests and the
fault matrix start this command with a fault plan.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			svc, err := openLocalService(ctx, cmd.ErrOrStderr(), dbPath, signingKey, configPath, allowUnsigned)
			if err != nil {
				return err
			}
			defer svc.Close()
			if err := svc.recover(ctx); err != nil {
				return err
			}
			advanced := 0
			for {
				n, err := svc.engine.AdvanceRunnable(ctx)
				if err != nil {
					return err
				}
				advanced += n
				if n == 0 {
					if untilIdle {
						fmt.Fprintf(cmd.OutOrStdout(), "idle after %d advances\n", advanced)
						return nil
					}
					svc.engine.Start(ctx)
					<-ctx.Done()
					return nil
				}
			}
		},
		Example: `  ledger worker --db ./ledger.db
  ledger worker --db ./ledger.db --until-idle`,
	}
	addDBFlag(cmd, &dbPath)
	cmd.Flags().BoolVar(&untilIdle, "until-idle", false, "exit once no run can advance without a person")
	cmd.Flags().StringVar(&configPath, "config", "", "the operator's config file, as serve's: its agents, tools and rules (env "+envConfig+")")
	cmd.Flags().StringVar(&signingKey, "signing-key", "", "sign chain heads with this Ed25519 key file (env "+envSigningKeyFile+")")
	cmd.Flags().BoolVar(&allowUnsigned, "allow-unsigned", false, allowUnsignedUsage)
	return cmd
}
