package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
)

// TestCommandTree walks every command the root builds, so a command added
// later is held to the same rules without anyone remembering to test it:
// an unknown flag is a usage error (exit status 2); a group answers an
// unknown or a missing subcommand with exit status 2, never with its help
// and 0; and every help text has Examples.
func TestCommandTree(t *testing.T) {
	t.Parallel()
	root := newRootCmd(io.Discard, io.Discard)
	var paths [][]string
	var walk func(cmd *cobra.Command, path []string)
	walk = func(cmd *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, sub := range cmd.Commands() {
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(root, nil)
	require.Greater(t, len(paths), 20, "the whole tree, help and completion included")

	for _, path := range paths {
		name := strings.Join(append([]string{"ledger"}, path...), " ")
		cmd, rest, err := root.Find(path)
		require.NoError(t, err, name)
		require.Empty(t, rest, name)
		t.Run(name, func(t *testing.T) {
			t.Run("Example", func(t *testing.T) {
				require.NotEmpty(t, strings.TrimSpace(cmd.Example), "%s --help shows no Examples", name)
			})
			t.Run("UnknownFlag", func(t *testing.T) {
				out, _, err := runCLI(t, nil, append(path, "--no-such-flag")...)
				requireExit(t, err, exitUsage)
				require.Contains(t, err.Error(), "unknown flag: --no-such-flag")
				require.Empty(t, out)
			})
			if !cmd.HasSubCommands() {
				return
			}
			t.Run("UnknownSubcommand", func(t *testing.T) {
				out, _, err := runCLI(t, nil, append(path, "no-such-command")...)
				requireExit(t, err, exitUsage)
				require.Contains(t, err.Error(), `unknown command "no-such-command"`)
				require.Empty(t, out, "no help on stdout as if it had worked")
			})
			t.Run("MissingSubcommand", func(t *testing.T) {
				out, _, err := runCLI(t, nil, path...)
				requireExit(t, err, exitUsage)
				require.Empty(t, out)
			})
		})
	}
}

// TestUsageSuggestions: a typo of a subcommand names the one meant.
func TestUsageSuggestions(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"runs", "lsit"}, {"submti"}, {"token", "nwe"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			_, _, err := runCLI(t, nil, args...)
			requireExit(t, err, exitUsage)
			require.Contains(t, err.Error(), "did you mean")
		})
	}
	t.Run("help of an unknown topic", func(t *testing.T) {
		out, _, err := runCLI(t, nil, "help", "runs", "lsit")
		requireExit(t, err, exitUsage)
		require.Empty(t, out)
	})
	t.Run("help of a known topic", func(t *testing.T) {
		out, _, err := runCLI(t, nil, "help", "runs", "list")
		require.NoError(t, err)
		require.Contains(t, out, "Examples:")
	})
}
