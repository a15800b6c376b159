package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/actionledger/ledger/ledger"
	"github.com/spf13/cobra"
)

// envSigningKeyFile names the signing key file of serve, worker, recover
// and demo when --signing-key is not given.
const envSigningKeyFile = "LEDGER_SIGNING_KEY_FILE"

// Key files are PEM: the private key as PKCS #8 ("PRIVATE KEY"), the
// public key as PKIX ("PUBLIC KEY"), the forms openssl reads and writes
// for Ed25519 (openssl pkey -in key.pem -pubout).
const (
	pemPrivateKey = "PRIVATE KEY"
	pemPublicKey  = "PUBLIC KEY"
)

func newSigningKeyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "signing-key",
		Short: "Make or show the Ed25519 key that signs each run's chain head",
		Long: `A ledger given a signing key (--signing-key FILE or $` + envSigningKeyFile + ` on serve, worker,
recover and demo) signs the head of a run's event chain whenever a write moves it, and
evidence reports carry the newest signature. "ledger evidence verify --report FILE
--public-key FILE" then checks a report without the database, and a chain rewritten
together with its head no longer verifies. The key stays in its file: the ledger never
stores or logs it, only its id (16 hex digits of the SHA-256 of the public key). A key
file that group or others may read or write is refused (chmod 600 FILE), as ssh refuses
such a private key. A database whose heads are signed is refused by a process started
without a key (exit status 2), unless it is given --allow-unsigned.

  new     make a key pair: the private key into --out (mode 0600, never overwritten),
          the public key on stdout (and into --public-out), the key id on stderr.
  public  print the public key of a private key file, and its id on stderr.`,
		Example: `  ledger signing-key new --out /etc/ledger/signing.key --public-out signing.pub
  ledger serve --signing-key /etc/ledger/signing.key
  ledger evidence verify --report report.json --public-key signing.pub`,
	}
	cmd.AddCommand(newSigningKeyNewCmd(), newSigningKeyPublicCmd())
	return asUsage(cmd)
}

func newSigningKeyNewCmd() *cobra.Command {
	var out, publicOut string
	cmd := &cobra.Command{
		Use:   "new --out FILE [--public-out FILE]",
		Short: "Make an Ed25519 key pair for signing chain heads",
		Example: `  ledger signing-key new --out /etc/ledger/signing.key
  ledger signing-key new --out signing.key --public-out signing.pub`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required: the file the private key is written to")
			}
			pub, key, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return fmt.Errorf("make key: %w", err)
			}
			der, err := x509.MarshalPKCS8PrivateKey(key)
			if err != nil {
				return fmt.Errorf("encode key: %w", err)
			}
			pubPEM, err := publicKeyPEM(pub)
			if err != nil {
				return err
			}
			if err := writeNewFile(out, pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), 0o600); err != nil {
				return err
			}
			if publicOut != "" {
				if err := writeNewFile(publicOut, pubPEM, 0o644); err != nil {
					return err
				}
			}
			if _, err := cmd.OutOrStdout().Write(pubPEM); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "signing key %s written to %s (keep it there: whoever holds it can sign chain heads)\n",
				ledger.SigningKeyID(pub), out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to write the private key to (PEM, mode 0600); must not exist")
	cmd.Flags().StringVar(&publicOut, "public-out", "", "also write the public key (PEM) to this file; must not exist")
	return cmd
}

func newSigningKeyPublicCmd() *cobra.Command {
	var keyFile string
	cmd := &cobra.Command{
		Use:     "public --key FILE",
		Short:   "Print the public key of a signing key file",
		Example: `  ledger signing-key public --key /etc/ledger/signing.key > signing.pub`,
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keyFile == "" {
				return usagef("--key is required")
			}
			key, err := readSigningKey(warningLogger(cmd.ErrOrStderr()), keyFile)
			if err != nil {
				return err
			}
			pub := key.Public().(ed25519.PublicKey)
			b, err := publicKeyPEM(pub)
			if err != nil {
				return err
			}
			if _, err := cmd.OutOrStdout().Write(b); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "key id %s\n", ledger.SigningKeyID(pub))
			return nil
		},
	}
	cmd.Flags().StringVar(&keyFile, "key", "", "private key file (PEM)")
	return cmd
}

func publicKeyPEM(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encode public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Bytes: der}), nil
}

// writeNewFile writes data to path, which must not exist yet: a key file
// is never overwritten.
func writeNewFile(path string, data []byte, mode fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return usagef("%s exists already: a key file is never overwritten", path)
	}
	if err != nil {
		return usagef("write %s: %v", path, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// signingKeyFrom reads the signing key named by flag, else by
// $LEDGER_SIGNING_KEY_FILE; nil if neither names one. A symlink is
// logged on log (readSigningKey).
func signingKeyFrom(log *slog.Logger, flag string) (ed25519.PrivateKey, error) {
	path := flag
	if path == "" {
		path = os.Getenv(envSigningKeyFile)
	}
	if path == "" {
		return nil, nil
	}
	return readSigningKey(log, path)
}

// readSigningKey reads an Ed25519 private key from a PEM file. As ssh does
// with a private key, it refuses a file that group or others may read or
// write, where files have Unix permissions: whoever reads the key can sign
// chain heads. A symlink is followed, its target's permissions checked,
// and a warning naming the target logged on log. Its errors never quote
// the file's content.
func readSigningKey(log *slog.Logger, path string) (ed25519.PrivateKey, error) {
	noteSymlink(log, "signing key", path)
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("signing key: %v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, usagef("signing key: %v", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 && runtime.GOOS != "windows" {
		return nil, usagef("signing key %s: group or others may read or write it (mode %04o), and whoever reads it can sign chain heads: chmod 600 %s",
			path, perm, path)
	}
	raw, err := io.ReadAll(f)
	if err != nil {
		return nil, usagef("signing key: %v", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != pemPrivateKey {
		return nil, usagef("signing key %s: not a PEM %q block (make one with `ledger signing-key new`)", path, pemPrivateKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, usagef("signing key %s: not a PKCS #8 private key", path)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, usagef("signing key %s: a %T, not an Ed25519 key", path, k)
	}
	return key, nil
}

// readPublicKey reads an Ed25519 public key from a PEM file.
func readPublicKey(path string) (ed25519.PublicKey, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("public key: %v", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != pemPublicKey {
		return nil, usagef("public key %s: not a PEM %q block (print one with `ledger signing-key public`)", path, pemPublicKey)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, usagef("public key %s: not a PKIX public key", path)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, usagef("public key %s: a %T, not an Ed25519 key", path, k)
	}
	return pub, nil
}

// allowUnsignedUsage is the help of --allow-unsigned (serve, worker,
// recover, demo).
const allowUnsignedUsage = "without a signing key, write to a database whose chain heads are signed anyway (the heads of the runs this process moves stay unsigned)"

// checkSigners compares the keys that signed the database's chain heads
// with the process's own. A database with signed heads opened without a
// key is refused (a usage error naming the database and how to give the
// key), unless cfg.AllowUnsigned: every run the process moved would end
// with heads no key signed, and its reports would stop verifying, with
// nobody told. Heads signed by another key (a rotation, or replicas given
// different keys) are logged as a warning.
func checkSigners(ctx context.Context, store *ledger.DB, cfg serviceConfig) error {
	counts, err := store.CountByState(ctx)
	if err != nil {
		return fmt.Errorf("read which keys signed the database's chain heads: %w", err)
	}
	var own string
	if cfg.SigningKey != nil {
		own = ledger.SigningKeyID(cfg.SigningKey.Public().(ed25519.PublicKey))
	}
	var others []string
	for id := range counts.Signatures {
		if id != own {
			others = append(others, id)
		}
	}
	if len(others) == 0 {
		return nil
	}
	slices.Sort(others)
	shown := make([]string, len(others))
	for i, id := range others {
		shown[i] = fmt.Sprintf("%s (%d %s)", id, counts.Signatures[id], plural(counts.Signatures[id], "run", "runs"))
	}
	signers := strings.Join(shown, ", ")
	db := shownDB(cfg.DBPath)
	switch {
	case cfg.SigningKey != nil:
		cfg.Warnings.Warn("this database's chain heads were signed by other keys: the runs this process moves are signed by its own key from now on; "+
			"keep the others' public keys to check the reports exported before", "db", db, "key_id", own, "other_keys", signers)
	case cfg.AllowUnsigned:
		cfg.Warnings.Warn("UNSIGNED: this database's chain heads are signed, and this process has no signing key: "+
			"the heads of the runs it moves will not be signed", "db", db, "signed_by", signers)
	default:
		return usagef("database %s has chain heads signed by %s %s, and this process has no signing key: "+
			"the runs it moves would get heads no key signed, and their reports would stop verifying. "+
			"Give the key with --signing-key FILE (or $%s), or --allow-unsigned to write unsigned heads anyway",
			db, plural(int64(len(others)), "key", "keys"), signers, envSigningKeyFile)
	}
	return nil
}

// plural is one if n is 1, else many.
func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
