package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "token",
		Example: `  ledger token new --principal alice --tenant acme --role submitter --add-to tokens.json
  ledger token list --file tokens.json`,
		Short: "Make bearer tokens for the server's tokens file",
		Args:  usageArgs(cobra.NoArgs),
	}
	cmd.AddCommand(newTokenNewCmd())
	return asUsage(cmd)
}

func newTokenNewCmd() *cobra.Command {
	var (
		principal string
		tenant    string
		roles     []string
		addTo     string
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use: "new --principal P --tenant T --role R [--role R…] [--add-to FILE]",
		Example: `  ledger token new --principal bob --tenant acme --role approver --add-to tokens.json
  ledger token new --principal ci --tenant acme --role submitter --role auditor --json`,
		Short: "Make a fresh token and the tokens-file entry that accepts it",
		Long: `Make a fresh random bearer token for a principal of a tenant with the given roles
(submitter, approver, auditor, admin). The token is printed once, on the first line of
stdout; it is not stored anywhere, so keep it now. The second line is the entry to add
to the "tokens" array of the server's tokens file: it holds only the token's SHA-256.

--add-to FILE adds the entry to that tokens file itself (creating it, mode 0600, if
it does not exist). The server reads the file at start-up: restart it afterwards.
--json prints one object {"token": …, "entry": {…}} instead of the two lines.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if principal == "" || tenant == "" || len(roles) == 0 {
				return usagef("--principal, --tenant and at least one --role are required")
			}
			token, entry, err := server.NewTokenLine(principal, tenant, roles)
			if err != nil {
				// The inputs are the only thing the caller controls.
				return &usageError{err: err}
			}
			if addTo != "" {
				if err := addTokenEntry(addTo, entry); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(struct {
					Token string            `json:"token"`
					Entry server.TokenEntry `json:"entry"`
				}{token, entry})
			}
			line, err := json.Marshal(entry)
			if err != nil {
				return err
			}
			// One write: a reader that takes only the first line (head -n 1)
			// cannot cut the second one off with SIGPIPE.
			if _, err := fmt.Fprintf(out, "%s\n%s\n", token, line); err != nil {
				return err
			}
			if addTo != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "added %s (tenant %s) to %s; restart the server to pick it up\n", principal, tenant, addTo)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&principal, "principal", "", "who the token identifies, e.g. alice (required)")
	f.StringVar(&tenant, "tenant", "", "the tenant the token belongs to (required)")
	f.StringArrayVar(&roles, "role", nil, "submitter, approver, auditor or admin; repeat for several (required)")
	f.StringVar(&addTo, "add-to", "", "also add the entry to this tokens file")
	f.BoolVar(&asJSON, "json", false, `print {"token": …, "entry": {…}}`)
	return asUsage(cmd)
}

// addTokenEntry appends entry to the tokens file at path and replaces the
// file atomically (mode 0600). An existing file must be a valid tokens file:
// one the server would refuse is not silently rewritten.
func addTokenEntry(path string, entry server.TokenEntry) error {
	var doc server.TokensFile
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("tokens file: %w", err)
	default:
		if _, err := server.ParseTokens(data); err != nil {
			return &usageError{err: fmt.Errorf("%s: %w", path, err)}
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			return &usageError{err: fmt.Errorf("%s: %w", path, err)}
		}
	}
	doc.Tokens = append(doc.Tokens, entry)
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tokens-*.json")
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	if err := tmp.Chmod(0o600); err != nil {
		return errors.Join(err, tmp.Close())
	}
	if _, err := tmp.Write(append(out, '\n')); err != nil {
		return errors.Join(err, tmp.Close())
	}
	if err := tmp.Sync(); err != nil {
		return errors.Join(err, tmp.Close())
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	return nil
}
