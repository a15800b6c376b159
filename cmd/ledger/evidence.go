package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
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
		Long: `Work on the evidence of one run in a database file.

  export  the run, its actions with attempts (status and effect as separate facts) and
          approvals, cancellation, budget, recovery decisions with their rationale,
          observations and the redacted event timeline, with the chain verdict, as
          JSON (checked against the report schema), Markdown or a self-contained HTML page.
  verify  recompute the run's event hash chain, check its rows against it and report the
          first broken link; from the database, or offline from a JSON report, with the
          signed chain head checked against a public key (--public-key).`,
		Example: `  ledger evidence export $RUN --db ./ledger.db --format md
  ledger evidence verify $RUN --db ./ledger.db
  ledger evidence verify --report report.json --public-key signing.pub`,
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
	addDBFlag(cmd, &dbPath)
	f.StringVar(&format, "format", "json", "report format: json, md or html")
	f.StringVar(&outPath, "out", "", "write the report to this file (atomically) instead of stdout")
	f.StringVar(&keyFile, "key-file", "", "file holding the redaction key (hex, or at least 16 raw bytes); default $"+envRedactionKey)
	return cmd
}

func newEvidenceVerifyCmd() *cobra.Command {
	var dbPath, reportPath, publicKeyPath string
	cmd := &cobra.Command{
		Use:   "verify (RUN --db PATH | --report FILE) [--public-key FILE]",
		Short: "Check a run's event chain and rows, in the database or in an exported report",
		Long: `Check the evidence of a run, and report the first thing that does not hold.

verify RUN --db PATH recomputes the hash chain of RUN's events from the database (every
event carries the hash of its predecessor, and the run records the head of the chain) and
checks every row of the run (the run, its budget, actions, attempts, approvals,
cancellation, observations) against the newest event that recorded it: each such event
carries the digest of the row's content after the write. Rows written before this check
existed are counted as unbound: the chain cannot vouch for them.

verify --report FILE does the same without the database, from a JSON report of
"ledger evidence export": it recomputes every event's hash from what the report shows
(with the digests it gives of what redaction hid), checks every row against the event
that recorded it and the recovery decisions against their events.

With --public-key FILE (PEM, from "ledger signing-key new" or "public"), the head of the
chain must also carry a valid signature by that key that covers every event: without
it a chain rewritten together with its head looks intact.

Prints OK with what was checked, or BROKEN with the first broken link (where and why)
and exits with status 1.`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var pub ed25519.PublicKey
			if publicKeyPath != "" {
				var err error
				if pub, err = readPublicKey(publicKeyPath); err != nil {
					return err
				}
			}
			switch {
			case reportPath != "" && (len(args) > 0 || cmd.Flags().Changed("db")):
				return usagef("evidence verify: --report checks a report without the database: give no RUN and no --db")
			case reportPath != "":
				return verifyReport(cmd, reportPath, pub)
			case len(args) == 0:
				return usagef("evidence verify: give RUN (with --db) or --report FILE")
			}
			return verifyDatabase(cmd, dbPath, ledger.RunID(args[0]), pub)
		},
		Example: `  ledger evidence verify $RUN --db ./ledger.db`,
	}
	f := cmd.Flags()
	addDBFlag(cmd, &dbPath)
	f.StringVar(&reportPath, "report", "", "check this JSON report instead of the database")
	f.StringVar(&publicKeyPath, "public-key", "", "require the chain head to be signed by this Ed25519 public key (PEM)")
	return cmd
}

// verifyDatabase is evidence verify RUN --db PATH.
func verifyDatabase(cmd *cobra.Command, dbPath string, id ledger.RunID, pub ed25519.PublicKey) error {
	ctx := cmd.Context()
	store, err := openExistingStore(ctx, dbPath)
	if err != nil {
		return err
	}
	defer store.Close()
	chain, err := store.FindChain(ctx, id)
	if err != nil {
		return notFoundExit(err)
	}
	rep, out := chain.Report, cmd.OutOrStdout()
	if !rep.OK {
		fmt.Fprintf(out, "BROKEN: run %s, event %d: %s\n", rep.RunID, rep.BrokenSeq, rep.Reason)
		return &chainBrokenError{report: rep}
	}
	var signed string
	if pub != nil {
		if err := ledger.VerifySignedHead(chain.Signature, pub, id, chain.Run.EventSeq, chain.Run.EventHash); err != nil {
			fmt.Fprintf(out, "BROKEN: run %s: %s\n", id, errText(err))
			return &unverifiedError{err: err}
		}
		signed = signedText(chain.Signature.Seq, chain.Signature.KeyID, chain.Signature.SignedAt)
	}
	_, err = fmt.Fprintf(out, "OK: run %s, %d events, chain intact; %s%s\n", rep.RunID, rep.Events, rowsText(rep.Rows, rep.Unbound), signed)
	return err
}

// verifyReport is evidence verify --report FILE.
func verifyReport(cmd *cobra.Command, path string, pub ed25519.PublicKey) error {
	out := cmd.OutOrStdout()
	data, err := os.ReadFile(path)
	if err != nil {
		return usagef("evidence verify: %v", err)
	}
	rep, err := evidence.ReadReport(data)
	var v evidence.Verified
	if err == nil {
		v, err = rep.Verify(pub)
	}
	var ve *evidence.VerifyError
	if errors.As(err, &ve) {
		if ve.RunID == "" {
			fmt.Fprintf(out, "BROKEN: %s: %s\n", path, ve.Reason)
		} else {
			fmt.Fprintf(out, "BROKEN: report of run %s: %s\n", ve.RunID, ve.Reason)
		}
		return &unverifiedError{err: err}
	}
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "OK: report of run %s, %d events, chain intact; %s", v.RunID, v.Events, rowsText(v.Rows, v.Unbound))
	if v.Hidden > 0 {
		fmt.Fprintf(&b, "; %d redacted values covered only by their digests", v.Hidden)
	}
	switch {
	case v.Signature != nil:
		b.WriteString(signedText(v.Signature.Seq, v.Signature.KeyID, v.Signature.SignedAt))
	case rep.Signature != nil:
		fmt.Fprintf(&b, "; head signed by key %s, not checked (no --public-key)", rep.Signature.KeyID)
	default:
		b.WriteString("; not signed: anyone able to rewrite the database or the file could have made it consistent")
	}
	_, err = fmt.Fprintln(out, b.String())
	return err
}

// rowsText says how many rows were checked, and how many of them the chain
// cannot vouch for.
func rowsText(rows, unbound int) string {
	s := fmt.Sprintf("%d rows as their events recorded them", rows-unbound)
	if unbound > 0 {
		s += fmt.Sprintf(", %d written before rows were bound and not covered", unbound)
	}
	return s
}

func signedText(seq int64, keyID string, at time.Time) string {
	return fmt.Sprintf("; head (event %d) signed by key %s at %s", seq, keyID, at.UTC().Format(time.RFC3339Nano))
}

// errText is a ledger error's message without its code.
func errText(err error) string {
	var e *ledger.Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

// unverifiedError is a check that ran and failed (a signature, a report):
// exit status 1.
type unverifiedError struct{ err error }

func (e *unverifiedError) Error() string { return "evidence verify: " + e.err.Error() }
func (e *unverifiedError) Unwrap() error { return e.err }

// ExitCode is 1: the check ran and failed.
func (e *unverifiedError) ExitCode() int { return 1 }

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
func openExistingStore(ctx context.Context, path string) (*ledger.DB, error) {
	if isPostgres(path) {
		return openStore(ctx, storeConfig{DB: path})
	}
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ledger.Errorf(ledger.CodeInvalid, "database %s does not exist", path)
		}
		return nil, err
	}
	return openStore(ctx, storeConfig{DB: path})
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
