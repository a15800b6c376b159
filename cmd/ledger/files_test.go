package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// serveRefused runs `ledger serve --addr 127.0.0.1:0 args…` in process and
// returns its log and what it returned. A serve that starts listening
// instead is stopped and fails the test, rather than hanging it.
func serveRefused(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...), &bytes.Buffer{}, logs)
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return logs.String(), err
		case <-tick.C:
			if listenURL(logs.String()) != "" {
				cancel()
				<-done
				t.Fatalf("serve started instead of refusing:\n%s", logs.String())
			}
		}
	}
}

// newTokensFile makes a tokens file of one token with token new --add-to,
// as an operator would, and returns its path.
func newTokensFile(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "tokens.json")
	_, _, err := runCLI(t, nil, "token", "new", "--principal", "alice", "--tenant", "acme", "--role", "submitter", "--add-to", path)
	require.NoError(t, err)
	return path
}

// TestServeTokensFile: serve refuses, before it opens anything, a tokens
// file that lists no tokens (it would let nobody in) and one that group or
// others may write (whoever writes it decides who may act); it reads a
// symlinked file through the link, checking what the link resolves to and
// saying so.
func TestServeTokensFile(t *testing.T) {
	t.Parallel()
	t.Run("ErrEmpty", func(t *testing.T) {
		dir := t.TempDir()
		tokens := writeFile(t, dir, "tokens.json", `{"tokens": []}`)
		db := filepath.Join(dir, "ledger.db")
		_, err := serveRefused(t, "--db", db, "--tokens", tokens)
		requireExit(t, err, exitUsage)
		require.Contains(t, err.Error(), "tokens file: load tokens "+tokens+": the file lists no tokens, so nobody could get in")
		_, err = os.Stat(db)
		require.ErrorIs(t, err, os.ErrNotExist, "refused before anything is opened")
	})

	for _, mode := range []os.FileMode{0o666, 0o620, 0o602} {
		t.Run(fmt.Sprintf("ErrWritableBy/%04o", mode), func(t *testing.T) {
			dir := t.TempDir()
			tokens := newTokensFile(t, dir)
			require.NoError(t, os.Chmod(tokens, mode))
			db := filepath.Join(dir, "ledger.db")
			_, err := serveRefused(t, "--db", db, "--tokens", tokens)
			requireExit(t, err, exitUsage)
			require.Contains(t, err.Error(), "tokens file: load tokens "+tokens+": group or others may write it (mode "+fmt.Sprintf("%04o", mode)+
				"), and whoever writes it decides who may act: chmod 600 "+tokens)
			_, err = os.Stat(db)
			require.ErrorIs(t, err, os.ErrNotExist, "refused before anything is opened")
		})
	}

	t.Run("ReadableByOthers", func(t *testing.T) {
		// It holds only hashes: a copy lets nobody in.
		dir := t.TempDir()
		tokens := newTokensFile(t, dir)
		require.NoError(t, os.Chmod(tokens, 0o644))
		_, _, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0", "--tokens", tokens)
		require.NoError(t, stop())
	})

	t.Run("Symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := newTokensFile(t, dir)
		link := filepath.Join(dir, "link.json")
		require.NoError(t, os.Symlink(target, link))
		target, err := filepath.EvalSymlinks(target) // TMPDIR may be a link itself
		require.NoError(t, err)
		_, logs, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0", "--tokens", link)
		require.Contains(t, logs.String(), `"level":"WARN","msg":"tokens file is a symlink: its target is read, and its target's permissions checked","file":"`+
			link+`","target":"`+target+`"`)
		require.NoError(t, stop())

		require.NoError(t, os.Chmod(target, 0o666))
		_, err = serveRefused(t, "--db", filepath.Join(dir, "ledger.db"), "--tokens", link)
		requireExit(t, err, exitUsage)
		require.Contains(t, err.Error(), "group or others may write it (mode 0666)", "the target's mode, not the link's")
	})
}

// TestSigningKeyFile: a signing key that group or others may read or write
// is refused wherever it is read, as ssh refuses such a private key; one
// reached through a symlink is checked where the link leads, and the
// link's target is logged.
func TestSigningKeyFile(t *testing.T) {
	key, _ := signingKey(t)
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620} {
		t.Run(fmt.Sprintf("Err/%04o", mode), func(t *testing.T) {
			exposed := filepath.Join(t.TempDir(), "exposed.pem")
			data, err := os.ReadFile(key)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(exposed, data, 0o600))
			require.NoError(t, os.Chmod(exposed, mode))
			want := "signing key " + exposed + ": group or others may read or write it (mode " + fmt.Sprintf("%04o", mode) +
				"), and whoever reads it can sign chain heads: chmod 600 " + exposed
			db := filepath.Join(t.TempDir(), "ledger.db")

			_, err = serveRefused(t, "--db", db, "--signing-key", exposed)
			requireExit(t, err, exitUsage)
			require.Contains(t, err.Error(), want)
			_, err = os.Stat(db)
			require.ErrorIs(t, err, os.ErrNotExist, "refused before anything is opened")

			for _, args := range [][]string{
				{"worker", "--db", db, "--until-idle", "--signing-key", exposed},
				{"recover", "--db", db, "--signing-key", exposed},
				{"signing-key", "public", "--key", exposed},
			} {
				_, _, err = runCLI(t, nil, args...)
				requireExit(t, err, exitUsage)
				require.Contains(t, err.Error(), want, args[0])
			}
			t.Setenv(envSigningKeyFile, exposed)
			_, _, err = runCLI(t, nil, "demo")
			requireExit(t, err, exitUsage)
			require.Contains(t, err.Error(), want)
		})
	}

	t.Run("Symlink", func(t *testing.T) {
		dir := t.TempDir()
		link := filepath.Join(dir, "link.pem")
		require.NoError(t, os.Symlink(key, link))
		key, err := filepath.EvalSymlinks(key) // TMPDIR may be a link itself
		require.NoError(t, err)
		_, logs, stop := startServe(t, "--db", filepath.Join(dir, "ledger.db"), "--addr", "127.0.0.1:0", "--signing-key", link)
		require.Contains(t, logs.String(), `"level":"WARN","msg":"signing key is a symlink: its target is read, and its target's permissions checked","file":"`+
			link+`","target":"`+key+`"`)
		require.NoError(t, stop())

		var stderr string
		_, stderr, err = runCLI(t, nil, "worker", "--db", filepath.Join(dir, "ledger.db"), "--until-idle", "--signing-key", link)
		require.NoError(t, err)
		require.Contains(t, stderr, `level=WARN msg="signing key is a symlink: its target is read, and its target's permissions checked" file=`+link+" target="+key)
	})
}

// TestSignedDatabaseWithoutKey: a database whose chain heads are signed is
// refused by serve, worker, recover and demo started without a signing
// key, naming the database and how to give the key; --allow-unsigned
// writes on with a loud warning, and another key is taken with a warning
// naming the key that signed before.
func TestSignedDatabaseWithoutKey(t *testing.T) {
	keyFile, _ := signingKey(t)
	key, err := readSigningKey(discardLogger(), keyFile)
	require.NoError(t, err)
	db, _ := evidenceRunSigned(t, key)
	keyID := ledgerKeyID(key)
	want := "database " + db + " has chain heads signed by key " + keyID + " (1 run), and this process has no signing key: " +
		"the runs it moves would get heads no key signed, and their reports would stop verifying. " +
		"Give the key with --signing-key FILE (or $" + envSigningKeyFile + "), or --allow-unsigned to write unsigned heads anyway"
	t.Setenv(envSigningKeyFile, "")

	_, err = serveRefused(t, "--db", db)
	requireExit(t, err, exitUsage)
	require.Contains(t, err.Error(), want)
	for _, args := range [][]string{
		{"worker", "--db", db, "--until-idle"},
		{"recover", "--db", db},
		{"demo", "--keep", filepath.Dir(db)},
	} {
		_, _, err := runCLI(t, nil, args...)
		requireExit(t, err, exitUsage)
		require.Contains(t, err.Error(), want, args[0])
	}

	t.Run("AllowUnsigned", func(t *testing.T) {
		_, stderr, err := runCLI(t, nil, "worker", "--db", db, "--until-idle", "--allow-unsigned")
		require.NoError(t, err)
		require.Contains(t, stderr, `level=WARN msg="UNSIGNED: this database's chain heads are signed, and this process has no signing key: `+
			`the heads of the runs it moves will not be signed" db=`+db+` signed_by="`+keyID+` (1 run)"`)
		_, logs, stop := startServe(t, "--db", db, "--addr", "127.0.0.1:0", "--allow-unsigned")
		require.Contains(t, logs.String(), `"level":"WARN","msg":"UNSIGNED: this database's chain heads are signed`)
		require.NoError(t, stop())
	})

	t.Run("AnotherKey", func(t *testing.T) {
		other, _ := signingKey(t)
		otherKey, err := readSigningKey(discardLogger(), other)
		require.NoError(t, err)
		_, stderr, err := runCLI(t, nil, "worker", "--db", db, "--until-idle", "--signing-key", other)
		require.NoError(t, err)
		require.Contains(t, stderr, `level=WARN msg="this database's chain heads were signed by other keys: `+
			`the runs this process moves are signed by its own key from now on; keep the others' public keys to check the reports exported before" `+
			`db=`+db+` key_id=`+ledgerKeyID(otherKey)+` other_keys="`+keyID+` (1 run)"`)
	})

	t.Run("TheKey", func(t *testing.T) {
		_, stderr, err := runCLI(t, nil, "worker", "--db", db, "--until-idle", "--signing-key", keyFile)
		require.NoError(t, err)
		require.NotContains(t, stderr, "WARN")
	})
}

// ledgerKeyID is the id of key's public key.
func ledgerKeyID(key ed25519.PrivateKey) string {
	return ledger.SigningKeyID(key.Public().(ed25519.PublicKey))
}
