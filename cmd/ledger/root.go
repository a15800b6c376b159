package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/actionledger/ledger/ledger"
	"github.com/spf13/cobra"
)

// Version is set at build time with -ldflags "-X main.Version=…".
var Version = "dev"

// Run runs the CLI with args, writing to stdout and stderr. An error it
// has shown already (a *reportedError) is not for the caller to print.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err != nil {
		return printProblem(cmd, stderr, err)
	}
	return nil
}

// newRootCmd builds the command tree; no globals, no init().
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "ledger",
		Short: "An approval-gated action ledger for AI agents",
		// --version prints what `ledger version` prints.
		Version:       versionLine(),
		SilenceUsage:  true,
		SilenceErrors: true,
		// $LEDGER_DB names the database of every command with a --db
		// flag that was not given one.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return useDBEnv(cmd) },
		Example: `  ledger serve --db ./ledger.db --tokens tokens.json
  ledger runs list --server http://127.0.0.1:8080
  ledger help runs show`,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newVersionCmd(), newMigrateCmd(), newDemoCmd(), newSimulatorCmd(), newMCPCmd())
	root.AddCommand(httpCommands()...)
	root.AddCommand(localCommands()...)
	// cobra adds help and completion when it executes; adding them now puts
	// them in the tree strictUsage walks, so they follow the same rules.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	defaultCommandExamples(root)
	strictUsage(root)
	return root
}

// strictUsage makes every usage mistake anywhere in the tree a usage error
// (exit status 2), so a command added later cannot forget it:
//
//   - a bad flag: the root's flag error function, which every command
//     without its own inherits;
//   - a bad positional argument: each command's Args validator, wrapped;
//   - an unknown or a missing subcommand of a group: cobra prints the
//     group's help and exits 0 for both, since a group has no Run; each
//     group without a Run of its own gets one that refuses instead.
//
// The help command refuses an unknown topic the same way.
func strictUsage(cmd *cobra.Command) {
	if !cmd.HasParent() {
		cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })
	}
	switch {
	case cmd.HasSubCommands() && cmd.Run == nil && cmd.RunE == nil:
		cmd.Args = unknownSubcommand
		cmd.RunE = missingSubcommand
	case cmd.Args != nil:
		cmd.Args = usageArgs(cmd.Args)
	}
	if cmd.Name() == "help" && cmd.HasParent() && !cmd.Parent().HasParent() {
		strictHelp(cmd)
	}
	for _, sub := range cmd.Commands() {
		strictUsage(sub)
	}
}

// unknownSubcommand is the Args of a group: any argument is a subcommand
// it does not have.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, set only on its own path
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usagef("%s (see %s --help)", msg, cmd.CommandPath())
}

// missingSubcommand is the Run of a group called without a subcommand.
func missingSubcommand(cmd *cobra.Command, _ []string) error {
	var names []string
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	return usagef("missing command for %q: one of %s (see %s --help)", cmd.CommandPath(), strings.Join(names, ", "), cmd.CommandPath())
}

// strictHelp makes `ledger help TOPIC` refuse a topic that is not a
// command (cobra prints "Unknown help topic" and exits 0).
func strictHelp(help *cobra.Command) {
	show := help.Run
	help.RunE = func(cmd *cobra.Command, args []string) error {
		if found, rest, err := cmd.Root().Find(args); err != nil || found == nil || len(rest) > 0 {
			return usagef("unknown help topic %q (see %s --help)", strings.Join(args, " "), cmd.Root().CommandPath())
		}
		show(cmd, args)
		return nil
	}
}

// defaultCommandExamples gives cobra's own help and completion commands the
// Examples every command's help has.
func defaultCommandExamples(root *cobra.Command) {
	examples := map[string]string{
		"help":                  "  ledger help\n  ledger help runs show",
		"completion":            "  ledger completion bash > /etc/bash_completion.d/ledger\n  source <(ledger completion zsh)",
		"completion bash":       "  source <(ledger completion bash)\n  ledger completion bash > /etc/bash_completion.d/ledger",
		"completion zsh":        "  ledger completion zsh > \"${fpath[1]}/_ledger\"",
		"completion fish":       "  ledger completion fish > ~/.config/fish/completions/ledger.fish",
		"completion powershell": "  ledger completion powershell | Out-String | Invoke-Expression",
	}
	var walk func(cmd *cobra.Command, path string)
	walk = func(cmd *cobra.Command, path string) {
		if ex, ok := examples[path]; ok && cmd.Example == "" {
			cmd.Example = ex
		}
		for _, sub := range cmd.Commands() {
			walk(sub, strings.TrimPrefix(path+" "+sub.Name(), " "))
		}
	}
	walk(root, "")
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
