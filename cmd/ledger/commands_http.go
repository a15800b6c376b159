package main

import "github.com/spf13/cobra"

// httpCommands are the commands of the HTTP service and its clients.
func httpCommands() []*cobra.Command { return nil }
