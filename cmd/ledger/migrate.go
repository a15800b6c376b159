package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
)

func newMigrateCmd() *cobra.Command {
	var (
		dbPath string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the ledger database and print its schema version",
		Long: `Create the database (a SQLite file, or the schema of a PostgreSQL database named by a
postgres:// URL) if it does not exist and apply pending migrations. A database written by a
newer ledger is refused (exit status 3) and left untouched. Several processes may migrate one
database at once, and a server may run beside: each migration is applied once, in its own
transaction. A server of an older build then reports not ready (/readyz: the schema is newer
than it writes) until it is upgraded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			s, err := openStore(ctx, storeConfig{DB: dbPath})
			if err != nil {
				return err
			}
			defer s.Close()
			v, err := s.CurrentSchemaVersion(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"db": shownDB(dbPath), "schema_version": v})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: schema version %d (current)\n", shownDB(dbPath), v)
			return err
		},
		Example: `  ledger migrate --db ./ledger.db
  ledger migrate --db /var/lib/ledger/ledger.db --json`,
	}
	addDBFlag(cmd, &dbPath)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
