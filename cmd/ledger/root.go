package main

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/actionledger/ledger/ledger"
	"github.com/spf13/cobra"
)

// Version is set at build time with -ldflags "-X main.Version=…".
var Version = "dev"

// Run runs the CLI with args, writing to stdout and stderr.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// newRootCmd builds the command tree; no globals, no init().
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "ledger",
		Short:         "An approval-gated action ledger for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newVersionCmd(), newMigrateCmd(), newDemoCmd(), newSimulatorCmd())
	root.AddCommand(httpCommands()...)
	root.AddCommand(localCommands()...)
	return root
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// exitCode maps an error to the process exit status: 2 for usage and input
// errors, 3 for a database too new for this build, 1 otherwise.
func exitCode(err error) int {
	switch {
	case errors.Is(err, ledger.ErrUnsupportedVersion):
		return 3
	case errors.Is(err, ledger.ErrInvalid):
		return 2
	default:
		return 1
	}
}
