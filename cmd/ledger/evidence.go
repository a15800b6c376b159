package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/simulator"
	"github.com/spf13/cobra"
)

// envRedactionKey holds the evidence redaction key when --key-file is not
// given: hex, or raw bytes, at least redact.MinKeyLen bytes either way.
const envRedactionKey = "LEDGER_REDACTION_KEY"

// evidenceExitNotFound is the exit status of an unknown run: 5, "not
// found", as in the CLI's table of exit statuses (client.go).
const evidenceExitNotFound = 5

// evidenceFormats are the formats of `ledger evidence export`.
var evidenceFormats = []string{"json", "md", "html"}

func newEvidenceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "evidence",
		Short: "Export a run's redacted evidence report, or verify its event chain",
		Long: `Work on the evidence of one run in a database file (DESIGN.md section 7).

  export  the run, its actions with attempts (status and effect as separate facts) and
          approvals, cancellation, budget, recovery decisions with their rationale,
          observations and the redacted event timeline, with the chain verdict, as
          JSON (checked against the report schema), Markdown or a self-contained HTML page.
  verify  recompute the run's event hash chain and report the first broken link.`,
		Example: `  ledger evidence export $RUN --db ./ledger.db --format md
  ledger evidence verify $RUN --db ./ledger.db`,
	}
	// A bad flag or argument is a usage error: exit status 2.
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return ledger.Errorf(ledger.CodeInvalid, "%v", err)
	})
	cmd.AddCommand(newEvidenceExportCmd(), newEvidenceVerifyCmd())
	return cmd
}

// oneRun accepts exactly one argument, the run id; anything else is a
// usage error (exit status 2).
func oneRun(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return ledger.Errorf(ledger.CodeInvalid, "%s: %v", cmd.CommandPath(), err)
	}
	return nil
}

func newEvidenceExportCmd() *cobra.Command {
	var (
		dbPath, format, outPath, keyFile string
	)
	cmd := &cobra.Command{
		Use:   "export RUN",
		Short: "Write a run's redacted evidence report",
		Long: `Build the evidence report of RUN from the database and write it to --out, or to stdout.

Secrets are replaced by "[redacted:<8 hex>]", a keyed HMAC of the secret, so equal secrets
carry equal markers: values at the argument paths a tool descriptor marks secret, and
anything that looks like a credential (API keys, bearer tokens, passwords in URLs, ...).
The key comes from --key-file or $` + envRedactionKey + ` (hex, or at least 16 raw bytes);
exports with the same key can be correlated. Without one, a random key is used for this
export alone: secrets are still hidden, but markers match no other export.

Nothing is written unless the whole report was built and redacted: --out is written to a
temporary file in its directory and renamed into place. The report of a run whose chain
is broken is still written, and says where the chain broke.`,
		Args: oneRun,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if !slices.Contains(evidenceFormats, format) {
				return ledger.Errorf(ledger.CodeInvalid, "evidence export: unknown --format %q (want %s)", format, strings.Join(evidenceFormats, ", "))
			}
			key, generated, err := redactionKey(keyFile)
			if err != nil {
				return err
			}
			redactor, err := redact.NewRedactor(key)
			if err != nil {
				return err
			}
			if generated {
				fmt.Fprintf(cmd.ErrOrStderr(), "evidence: no redaction key (--key-file or $%s): using a random key for this export; "+
					"secrets are redacted, but their markers match no other export\n", envRedactionKey)
			}
			store, err := openExistingStore(ctx, dbPath)
			if err != nil {
				return err
			}
			defer store.Close()
			rep, err := evidence.Build(ctx, store, ledger.RunID(args[0]), evidence.Options{
				Redactor: redactor, Tools: simulatorSecretPaths(), Now: time.Now})
			if err != nil {
				return notFoundExit(err)
			}
			var buf bytes.Buffer
			switch format {
			case "json":
				err = rep.JSON(&buf)
			case "md":
				err = rep.Markdown(&buf)
			case "html":
				err = rep.HTML(&buf)
			}
			if err != nil {
				return err
			}
			if !rep.Chain.OK {
				fmt.Fprintf(cmd.ErrOrStderr(), "evidence: warning: the event chain of run %s is broken at event %d; the report says so\n",
					rep.Run.ID, derefInt(rep.Chain.BrokenSeq))
			}
			if outPath == "" {
				_, err := cmd.OutOrStdout().Write(buf.Bytes())
				return err
			}
			return writeFileAtomic(outPath, buf.Bytes())
		},
		Example: `  ledger evidence export $RUN --db ./ledger.db --format html --out report.html
  LEDGER_REDACTION_KEY=$(cat key.hex) ledger evidence export $RUN --format json`,
	}
	f := cmd.Flags()
	f.StringVar(&dbPath, "db", "./ledger.db", "path of the SQLite database")
	f.StringVar(&format, "format", "json", "report format: json, md or html")
	f.StringVar(&outPath, "out", "", "write the report to this file (atomically) instead of stdout")
	f.StringVar(&keyFile, "key-file", "", "file holding the redaction key (hex, or at least 16 raw bytes); default $"+envRedactionKey)
	return cmd
}

func newEvidenceVerifyCmd() *cobra.Command {
	var dbPath string
	cmd := &cobra.Command{
		Use:   "verify RUN",
		Short: "Recompute a run's event hash chain and report the first broken link",
		Long: `Recompute the hash chain of RUN's events from the database: every event carries the hash
of its predecessor, and the run records the head of the chain. Prints OK with the event
count, or the first broken link (its sequence number and why) and exits with status 1.`,
		Args: oneRun,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			store, err := openExistingStore(ctx, dbPath)
			if err != nil {
				return err
			}
			defer store.Close()
			rep, err := store.VerifyChain(ctx, ledger.RunID(args[0]))
			if err != nil {
				return notFoundExit(err)
			}
			out := cmd.OutOrStdout()
			if rep.OK {
				_, err := fmt.Fprintf(out, "OK: run %s, %d events, chain intact\n", rep.RunID, rep.Events)
				return err
			}
			fmt.Fprintf(out, "BROKEN: run %s, event %d: %s\n", rep.RunID, rep.BrokenSeq, rep.Reason)
			return &chainBrokenError{report: rep}
		},
		Example: `  ledger evidence verify $RUN --db ./ledger.db`,
	}
	cmd.Flags().StringVar(&dbPath, "db", "./ledger.db", "path of the SQLite database")
	return cmd
}

// chainBrokenError is a verified chain with a broken link: exit status 1.
type chainBrokenError struct{ report ledger.ChainReport }

func (e *chainBrokenError) Error() string {
	return fmt.Sprintf("evidence verify: the event chain of run %s is broken at event %d: %s",
		e.report.RunID, e.report.BrokenSeq, e.report.Reason)
}

// ExitCode is 1: the check ran and failed.
func (e *chainBrokenError) ExitCode() int { return 1 }

// notFoundError is an unknown run: exit status 5, like a 404 of the API.
type notFoundError struct{ err error }

func (e *notFoundError) Error() string { return e.err.Error() }
func (e *notFoundError) Unwrap() error { return e.err }
func (e *notFoundError) ExitCode() int { return evidenceExitNotFound }

func notFoundExit(err error) error {
	if errors.Is(err, ledger.ErrNotFound) {
		return &notFoundError{err: err}
	}
	return err
}

// openExistingStore opens the ledger at path, refusing to create one: an
// export from a mistyped path must fail, not leave an empty database.
func openExistingStore(ctx context.Context, path string) (*ledger.GormStore, error) {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ledger.Errorf(ledger.CodeInvalid, "database %s does not exist", path)
		}
		return nil, err
	}
	return ledger.Open(ctx, ledger.Config{Path: path})
}

// redactionKey reads the key from keyFile, else $LEDGER_REDACTION_KEY,
// else makes a random one (generated true). Errors never quote the key.
func redactionKey(keyFile string) (key []byte, generated bool, err error) {
	var raw []byte
	switch {
	case keyFile != "":
		raw, err = os.ReadFile(keyFile)
		if err != nil {
			return nil, false, ledger.Errorf(ledger.CodeInvalid, "read --key-file: %v", err)
		}
		if key, err = parseRedactionKey(raw); err != nil {
			return nil, false, ledger.Errorf(ledger.CodeInvalid, "--key-file %s: %v", keyFile, err)
		}
		return key, false, nil
	case os.Getenv(envRedactionKey) != "":
		if key, err = parseRedactionKey([]byte(os.Getenv(envRedactionKey))); err != nil {
			return nil, false, ledger.Errorf(ledger.CodeInvalid, "$%s: %v", envRedactionKey, err)
		}
		return key, false, nil
	default:
		key = make([]byte, 32)
		if _, err := io.ReadFull(rand.Reader, key); err != nil {
			return nil, false, fmt.Errorf("random redaction key: %w", err)
		}
		return key, true, nil
	}
}

// parseRedactionKey takes hex if the text (surrounding whitespace trimmed)
// is hex of at least MinKeyLen bytes, else the text's raw bytes, which must
// be at least MinKeyLen long.
func parseRedactionKey(raw []byte) ([]byte, error) {
	text := bytes.TrimSpace(raw)
	if b, err := hex.DecodeString(string(text)); err == nil && len(b) >= redact.MinKeyLen {
		return b, nil
	}
	if len(text) < redact.MinKeyLen {
		return nil, fmt.Errorf("the key has %d bytes, at least %d are required", len(text), redact.MinKeyLen)
	}
	return text, nil
}

// simulatorSecretPaths is what the export knows of tools: the descriptors
// of the simulator's registered tools. Arguments of any other tool are
// replaced as a whole.
func simulatorSecretPaths() func(string) ([]string, bool) {
	known := map[string][]string{}
	for _, d := range []contracts.ToolDescriptor{simulator.CardsWriteDescriptor(), simulator.CardsCountDescriptor()} {
		known[d.Name] = d.SecretPaths
	}
	return func(name string) ([]string, bool) {
		paths, ok := known[name]
		return paths, ok
	}
}

// writeFileAtomic writes data to a temporary file beside path and renames it
// into place, so path holds the old content or all of the new, never part.
// The file is readable by its owner only: evidence is not for everyone.
func writeFileAtomic(path string, data []byte) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func derefInt(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
