package main

import "github.com/spf13/cobra"

// localCommands are the commands that work on a database file directly.
func localCommands() []*cobra.Command {
	return []*cobra.Command{newRecoverCmd(), newWorkerCmd(), newEvidenceCmd(),
		newFaultMatrixCmd(), newBenchCmd(), newSigningKeyCmd(), newRulesCmd()}
}
