package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Make, list and revoke the bearer tokens of the server's tokens file",
		Args:  usageArgs(cobra.NoArgs),
		Example: `  ledger token new --principal alice --tenant acme --role submitter --add-to tokens.json
  ledger token list --file tokens.json`,
	}
	cmd.AddCommand(newTokenNewCmd(), newTokenListCmd(), newTokenRevokeCmd())
	return asUsage(cmd)
}

func newTokenNewCmd() *cobra.Command {
	var (
		principal string
		tenant    string
		roles     []string
		agents    []string
		addTo     string
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "new --principal P --tenant T --role R [--role R…] [--agent A…] [--add-to FILE]",
		Short: "Make a fresh token and the tokens-file entry that accepts it",
		Long: `Make a fresh random bearer token for a principal of a tenant with the given roles
(submitter, approver, auditor, agent, admin). A token with the role agent drives the
runs of the agents it names with --agent (one or more; required with that role, and
only with it): it submits them, reads and cancels them and reports their tool calls,
and never approves. The token is printed once, on the first line of
stdout; it is not stored anywhere, so keep it now. The second line is the entry to add
to the "tokens" array of the server's tokens file: it holds only the token's SHA-256.

--add-to FILE adds the entry to that tokens file itself (creating it, mode 0600, if
it does not exist). The server reads the file at start-up and again on SIGHUP: send
it one (kill -HUP PID) or restart it afterwards.
--json prints one object {"token": …, "entry": {…}} instead of the two lines.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if principal == "" || tenant == "" || len(roles) == 0 {
				return usagef("--principal, --tenant and at least one --role are required")
			}
			token, entry, err := server.NewTokenLine(principal, tenant, roles, agents...)
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
				fmt.Fprintf(cmd.ErrOrStderr(), "added %s (tenant %s) to %s; send the server SIGHUP (or restart it) to pick it up\n", principal, tenant, addTo)
			}
			return nil
		},
		Example: `  ledger token new --principal bob --tenant acme --role approver --add-to tokens.json
  ledger token new --principal ci --tenant acme --role submitter --role auditor --json
  ledger token new --principal payments-bot --tenant acme --role agent --agent my-python-agent --add-to tokens.json`,
	}
	f := cmd.Flags()
	f.StringVar(&principal, "principal", "", "who the token identifies, e.g. alice (required)")
	f.StringVar(&tenant, "tenant", "", "the tenant the token belongs to (required)")
	f.StringArrayVar(&roles, "role", nil, "submitter, approver, auditor, agent or admin; repeat for several (required)")
	f.StringArrayVar(&agents, "agent", nil, "with --role agent: an agent the token drives; repeat for several")
	f.StringVar(&addTo, "add-to", "", "also add the entry to this tokens file")
	f.BoolVar(&asJSON, "json", false, `print {"token": …, "entry": {…}}`)
	return asUsage(cmd)
}

// addTokenEntry appends entry to the tokens file at path and replaces the
// file atomically (mode 0600). An existing file must be a valid tokens file:
// one the server would refuse is not silently rewritten.
func addTokenEntry(path string, entry server.TokenEntry) error {
	doc, err := readTokensFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	doc.Tokens = append(doc.Tokens, entry)
	return writeTokensFile(path, doc)
}

// readTokensFile reads and checks the tokens file at path, as the server
// would (server.ParseTokens); a file it would refuse is a usage error. A
// missing file is an error matching fs.ErrNotExist.
func readTokensFile(path string) (server.TokensFile, error) {
	var doc server.TokensFile
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return doc, &usageError{err: fmt.Errorf("tokens file: %w", err)}
		}
		return doc, fmt.Errorf("tokens file: %w", err)
	}
	if _, err := server.ParseTokens(data); err != nil {
		return doc, &usageError{err: fmt.Errorf("%s: %w", path, err)}
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return doc, &usageError{err: fmt.Errorf("%s: %w", path, err)}
	}
	return doc, nil
}

// writeTokensFile replaces the tokens file at path with doc atomically: a
// temporary file in the same directory, mode 0600, synced, then renamed
// over it, so the server (on SIGHUP) reads the old file or the new one,
// never half of one.
func writeTokensFile(path string, doc server.TokensFile) error {
	if doc.Tokens == nil {
		doc.Tokens = []server.TokenEntry{} // "tokens" is required; a server refuses [] (server.ErrNoTokens)
	}
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

// minHashPrefix is the fewest hex digits of a token's hash that token list
// shows and token revoke --sha256 takes: 32 bits, which reveal nothing of a
// token, keep a prefix the same while entries come and go, and make a
// typo unlikely to match another entry.
const minHashPrefix = 8

// hashPrefixLen is how many hex digits of its hash tell each entry of
// entries apart from every other: minHashPrefix, or more when two hashes
// share a longer prefix. No more of a hash than that is ever shown.
func hashPrefixLen(entries []server.TokenEntry) int {
	n := minHashPrefix
	for i := range entries {
		for j := i + 1; j < len(entries); j++ {
			a, b := entries[i].SHA256, entries[j].SHA256
			common := 0
			for common < len(a) && common < len(b) && a[common] == b[common] {
				common++
			}
			n = max(n, min(common+1, len(a)))
		}
	}
	return n
}

// tokenRow is one entry as token list shows it: never the token, and only
// a prefix of its hash.
type tokenRow struct {
	Principal    string   `json:"principal"`
	Tenant       string   `json:"tenant"`
	Roles        []string `json:"roles"`
	Agents       []string `json:"agents,omitempty"`
	SHA256Prefix string   `json:"sha256_prefix"`
}

func tokenRows(entries []server.TokenEntry, prefixLen int) []tokenRow {
	rows := make([]tokenRow, 0, len(entries))
	for _, e := range entries {
		rows = append(rows, tokenRow{Principal: e.Principal, Tenant: e.Tenant, Roles: e.Roles, Agents: e.Agents, SHA256Prefix: e.SHA256[:prefixLen]})
	}
	return rows
}

func printTokenRows(w io.Writer, rows []tokenRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tTENANT\tROLES\tAGENTS\tSHA256")
	for _, r := range rows {
		agents := "-"
		if len(r.Agents) > 0 {
			agents = strings.Join(r.Agents, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", displayText(r.Principal), displayText(r.Tenant), strings.Join(r.Roles, ","), agents, r.SHA256Prefix)
	}
	return tw.Flush()
}

// tokensFileFlag registers --file, falling back to $LEDGER_TOKENS_FILE as
// serve does, and returns a function that gives the path or a usage error.
func tokensFileFlag(cmd *cobra.Command) func() (string, error) {
	var path string
	cmd.Flags().StringVar(&path, "file", "", "the tokens file (env "+envTokensFile+")")
	return func() (string, error) {
		if path == "" {
			path = os.Getenv(envTokensFile)
		}
		if path == "" {
			return "", usagef("--file is required (or set $%s)", envTokensFile)
		}
		return path, nil
	}
}

func newTokenListCmd() *cobra.Command {
	var (
		asJSON bool
		file   func() (string, error)
	)
	cmd := &cobra.Command{
		Use:   "list --file FILE [--json]",
		Short: "List the entries of a tokens file: who, which tenant, which roles",
		Long: `List every entry of the tokens file: its principal, tenant, roles and agents, and the first
hex digits of the token's SHA-256, as many as it takes to tell the entries apart (at
least 8). The tokens themselves are not in the file and cannot be shown. The prefix is
what "ledger token revoke --sha256" takes. A file the server would refuse is refused
here too, with the reason (exit status 2).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := file()
			if err != nil {
				return err
			}
			doc, err := readTokensFile(path)
			if err != nil {
				return err
			}
			rows := tokenRows(doc.Tokens, hashPrefixLen(doc.Tokens))
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(struct {
					Tokens []tokenRow `json:"tokens"`
				}{rows})
			}
			if len(rows) == 0 {
				_, err := fmt.Fprintln(out, "no tokens: a server refuses this file (it would let nobody in)")
				return err
			}
			return printTokenRows(out, rows)
		},
		Example: `  ledger token list --file tokens.json
  LEDGER_TOKENS_FILE=/etc/ledger/tokens.json ledger token list --json`,
	}
	file = tokensFileFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"tokens": [{"principal", "tenant", "roles", "agents", "sha256_prefix"}]}`)
	return cmd
}

func newTokenRevokeCmd() *cobra.Command {
	var (
		principal string
		tenant    string
		prefix    string
		file      func() (string, error)
	)
	cmd := &cobra.Command{
		Use:   "revoke --file FILE (--principal P [--tenant T] | --sha256 PREFIX)",
		Short: "Remove entries from a tokens file, so their tokens stop working",
		Long: `Remove from the tokens file every entry of --principal (in every tenant, or only in
--tenant), or the one entry whose hash starts with --sha256 PREFIX (at least 8 hex
digits, as "ledger token list" shows them; a prefix that matches more than one entry
is refused). The file is replaced atomically, mode 0600. A running server reads the
file again on SIGHUP (kill -HUP PID): from then on the revoked tokens get 401. A file
left with no tokens is one a server refuses: it does not start with it, and on SIGHUP
keeps the tokens in force, so stop the server to shut everyone out.

Prints each entry removed. Nothing matching is exit status 5 and leaves the file as it
was; so does a file the server would refuse (exit status 2).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			match, err := revokeMatcher(principal, tenant, prefix)
			if err != nil {
				return err
			}
			path, err := file()
			if err != nil {
				return err
			}
			doc, err := readTokensFile(path)
			if err != nil {
				return err
			}
			prefixLen := hashPrefixLen(doc.Tokens)
			var kept, removed []server.TokenEntry
			for _, e := range doc.Tokens {
				if match(e) {
					removed = append(removed, e)
				} else {
					kept = append(kept, e)
				}
			}
			switch {
			case len(removed) == 0:
				return &notFoundError{err: fmt.Errorf("%s: no entry matches; see ledger token list --file %s", path, path)}
			case prefix != "" && len(removed) > 1:
				return usagef("--sha256 %s matches %d entries: give more of it (ledger token list --file %s)", prefix, len(removed), path)
			}
			doc.Tokens = kept
			if err := writeTokensFile(path, doc); err != nil {
				return err
			}
			for _, r := range tokenRows(removed, prefixLen) {
				fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (tenant %s, roles %s) sha256 %s\n", displayText(r.Principal),
					displayText(r.Tenant), strings.Join(r.Roles, ","), r.SHA256Prefix)
			}
			if len(kept) == 0 {
				// A server refuses the file (server.ErrNoTokens): SIGHUP
				// keeps what is in force, the revoked tokens included.
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (no tokens left). A server refuses a file without tokens: it does not start with it, "+
					"and on SIGHUP it keeps the tokens in force, the revoked ones included. Stop the server to shut everyone out, "+
					"or add a token (ledger token new --add-to %s) and send SIGHUP\n", path, path)
				return nil
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%d tokens left); send the server SIGHUP (kill -HUP PID) to apply it\n", path, len(kept))
			return nil
		},
		Example: `  ledger token revoke --file tokens.json --principal alice --tenant acme
  ledger token revoke --file tokens.json --sha256 3f9a2c71
  kill -HUP $(pidof ledger)                 # the running server drops the revoked tokens`,
	}
	file = tokensFileFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&principal, "principal", "", "revoke every token of this principal")
	f.StringVar(&tenant, "tenant", "", "with --principal: only in this tenant")
	f.StringVar(&prefix, "sha256", "", "revoke the one token whose SHA-256 starts with this (at least 8 hex digits)")
	return cmd
}

// revokeMatcher checks revoke's selection flags and returns the test of an
// entry against them.
func revokeMatcher(principal, tenant, prefix string) (func(server.TokenEntry) bool, error) {
	switch {
	case principal != "" && prefix != "":
		return nil, usagef("give --principal or --sha256, not both")
	case principal == "" && prefix == "":
		return nil, usagef("say what to revoke: --principal P [--tenant T] or --sha256 PREFIX")
	case tenant != "" && principal == "":
		return nil, usagef("--tenant goes with --principal")
	case principal != "":
		return func(e server.TokenEntry) bool {
			return e.Principal == principal && (tenant == "" || e.Tenant == tenant)
		}, nil
	}
	p := strings.ToLower(prefix)
	if len(p) < minHashPrefix || len(p) > 64 || strings.Trim(p, "0123456789abcdef") != "" {
		return nil, usagef("--sha256 %q: want %d to 64 hex digits of the token's SHA-256, as ledger token list shows them", prefix, minHashPrefix)
	}
	return func(e server.TokenEntry) bool { return strings.HasPrefix(e.SHA256, p) }, nil
}
