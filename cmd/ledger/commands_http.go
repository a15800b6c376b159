package main

import "github.com/spf13/cobra"

// httpCommands are the commands of the HTTP service and its clients: the
// server itself, its token tool, and the client commands of API v1.
func httpCommands() []*cobra.Command {
	return []*cobra.Command{
		newServeCmd(),
		newTokenCmd(),
		newReadyCmd(),
		newSubmitCmd(),
		newRunsCmd(),
		newApprovalsCmd(),
		newActionsCmd(),
		newApproveCmd(),
		newDenyCmd(),
		newCancelCmd(),
		newResolveCmd(),
		newToolsCmd(),
		newAgentsCmd(),
	}
}
