package main

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the build version and the database schema version it writes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(versionInfo())
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
		Example: `  ledger version
  ledger --version
  ledger version --json`,
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// buildInfo is what `ledger version` reports.
type buildInfo struct {
	Version       string `json:"version"`
	SchemaVersion int    `json:"schema_version"`
	Go            string `json:"go"`
}

func versionInfo() buildInfo {
	return buildInfo{Version, sqlite.SchemaVersion(), runtime.Version()}
}

// versionLine is the line of `ledger version` and `ledger --version`.
func versionLine() string {
	info := versionInfo()
	return fmt.Sprintf("ledger %s (schema %d, %s)", info.Version, info.SchemaVersion, info.Go)
}
