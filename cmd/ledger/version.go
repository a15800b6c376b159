package main

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/actionledger/ledger/ledger"
	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the build version and the database schema version it writes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := struct {
				Version       string `json:"version"`
				SchemaVersion int    `json:"schema_version"`
				Go            string `json:"go"`
			}{Version, ledger.SchemaVersion(), runtime.Version()}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(info)
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "ledger %s (schema %d, %s)\n", info.Version, info.SchemaVersion, info.Go)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
