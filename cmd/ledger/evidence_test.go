package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// evidenceRun runs the practice-cards flow once on a fresh database (the
// demo's steps: submit, approve as bob, execute) and returns the database
// path and the run's id.
func evidenceRun(t *testing.T) (string, ledger.RunID) {
	t.Helper()
	return evidenceRunSigned(t, nil)
}

// evidenceRunSigned is evidenceRun on a service that signs chain heads
// with key (nil: none).
func evidenceRunSigned(t *testing.T, key ed25519.PrivateKey) (string, ledger.RunID) {
	t.Helper()
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "ledger.db")
	svc, err := openService(ctx, serviceConfig{DBPath: db, Logger: discardLogger(), SigningKey: key})
	require.NoError(t, err)
	defer svc.Close()
	title, md := simulator.SampleDocument()
	input, err := json.Marshal(map[string]string{"title": title, "markdown": md})
	require.NoError(t, err)
	res, err := svc.store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "evidence-cli",
		Principal: "alice", Agent: simulator.AgentName, Input: input})
	require.NoError(t, err)
	id := res.Run.ID
	require.NoError(t, svc.engine.Advance(ctx, id))
	pending, err := svc.approvals.Pending(ctx, "acme", 10)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	_, err = svc.approvals.Decide(ctx, approval.DecideParams{Tenant: "acme", Principal: "bob", ActionID: pending[0].ActionID,
		ActionDigest: pending[0].ActionDigest, Decision: ledger.DecisionGrant, Reason: "looks right"})
	require.NoError(t, err)
	require.NoError(t, svc.engine.Advance(ctx, id))
	run, err := svc.store.FindRunByID(ctx, id)
	require.NoError(t, err)
	require.Equal(t, ledger.RunCompleted, run.State)
	return db, id
}

// runEvidence runs the CLI and returns stdout, stderr and the error.
func runEvidence(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := Run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestEvidenceExport(t *testing.T) {
	db, id := evidenceRun(t)
	keyFile := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(keyFile, []byte(hex.EncodeToString([]byte("0123456789abcdef0123"))+"\n"), 0o600))

	for _, format := range []string{"json", "md", "html"} {
		t.Run(format, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "report."+format)
			stdout, stderr, err := runEvidence(t, "evidence", "export", string(id), "--db", db, "--format", format, "--out", out, "--key-file", keyFile)
			require.NoError(t, err)
			require.Empty(t, stdout, "the report goes to --out")
			require.Empty(t, stderr, "a key was given: no notice")
			got, err := os.ReadFile(out)
			require.NoError(t, err)
			require.Contains(t, string(got), string(id))
			if format == "json" {
				require.NoError(t, contracts.Validate(contracts.SchemaReport, got))
			}
			// No temporary file is left beside the report.
			entries, err := os.ReadDir(filepath.Dir(out))
			require.NoError(t, err)
			require.Len(t, entries, 1)

			// The same key gives the same markers; to stdout this time.
			stdout, _, err = runEvidence(t, "evidence", "export", string(id), "--db", db, "--format", format, "--key-file", keyFile)
			require.NoError(t, err)
			require.Equal(t, keyIDOf(t, string(got)), keyIDOf(t, stdout))
		})
	}

	t.Run("KeyFromEnvironment", func(t *testing.T) {
		t.Setenv(envRedactionKey, "an environment key of enough bytes")
		stdout, stderr, err := runEvidence(t, "evidence", "export", string(id), "--db", db)
		require.NoError(t, err)
		require.Empty(t, stderr)
		require.NoError(t, contracts.Validate(contracts.SchemaReport, []byte(stdout)))
		require.NotContains(t, stdout, "an environment key of enough bytes")
	})

	t.Run("RandomKeyIsAnnounced", func(t *testing.T) {
		t.Setenv(envRedactionKey, "")
		stdout1, stderr, err := runEvidence(t, "evidence", "export", string(id), "--db", db)
		require.NoError(t, err)
		require.Contains(t, stderr, "using a random key for this export")
		stdout2, _, err := runEvidence(t, "evidence", "export", string(id), "--db", db)
		require.NoError(t, err)
		require.NotEqual(t, keyIDOf(t, stdout1), keyIDOf(t, stdout2), "a fresh key per export")
	})
}

// keyIDOf finds the redaction key id in a report of any format.
func keyIDOf(t *testing.T, report string) string {
	t.Helper()
	for _, marker := range []string{`"key_id": "`, "key id `", "key id <code>"} {
		if _, rest, ok := strings.Cut(report, marker); ok {
			return rest[:8]
		}
	}
	t.Fatalf("no key id in the report")
	return ""
}

func TestEvidenceExportErrors(t *testing.T) {
	db, id := evidenceRun(t)
	t.Setenv(envRedactionKey, "")
	dir := t.TempDir()
	out := filepath.Join(dir, "report.json")
	short := filepath.Join(dir, "short.key")
	require.NoError(t, os.WriteFile(short, []byte("too-short-key"), 0o600))

	tests := []struct {
		name     string
		args     []string
		exit     int
		contains string
	}{
		{"unknown run", []string{"evidence", "export", "run_01JDQ3Z8K4T5V6W7X8Y9Z0ABCE", "--db", db, "--out", out}, 5, "not found"},
		{"bad format", []string{"evidence", "export", string(id), "--db", db, "--format", "pdf", "--out", out}, 2, `unknown --format "pdf"`},
		{"missing database", []string{"evidence", "export", string(id), "--db", filepath.Join(dir, "nope.db"), "--out", out}, 2, "does not exist"},
		{"short key", []string{"evidence", "export", string(id), "--db", db, "--key-file", short, "--out", out}, 2, "at least 16"},
		{"missing key file", []string{"evidence", "export", string(id), "--db", db, "--key-file", filepath.Join(dir, "nope.key"), "--out", out}, 2, "key-file"},
		{"no run", []string{"evidence", "export", "--db", db, "--out", out}, 2, "accepts 1 arg"},
		{"unknown flag", []string{"evidence", "export", string(id), "--db", db, "--out", out, "--nope"}, 2, "unknown flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := runEvidence(t, tt.args...)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.contains)
			require.NotContains(t, err.Error(), "too-short-key", "a key is never quoted")
			require.Equal(t, tt.exit, exitStatus(err))
			require.Empty(t, stdout)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			for _, e := range entries {
				require.NotEqual(t, "report.json", e.Name(), "nothing is written on error")
				require.False(t, strings.HasSuffix(e.Name(), ".tmp"), "no temporary file is left")
			}
			_, err = os.Stat(filepath.Join(dir, "nope.db"))
			require.ErrorIs(t, err, os.ErrNotExist, "no database is created")
		})
	}

	t.Run("RedactionFailureWritesNothing", func(t *testing.T) {
		// Tampered, malformed JSON cannot be redacted: no report at all,
		// never the raw text.
		db, id := evidenceRun(t)
		raw, err := sql.Open("sqlite3", "file:"+db+"?_busy_timeout=5000")
		require.NoError(t, err)
		defer raw.Close()
		_, err = raw.Exec(`UPDATE attempts SET result = '{"api_key": "sk-unfinished' WHERE run_id = ?`, id)
		require.NoError(t, err)
		target := filepath.Join(t.TempDir(), "report.html")
		stdout, _, err := runEvidence(t, "evidence", "export", string(id), "--db", db, "--format", "html", "--out", target)
		require.ErrorIs(t, err, redact.ErrRedaction)
		require.NotContains(t, err.Error(), "sk-unfinished")
		require.Empty(t, stdout)
		entries, err := os.ReadDir(filepath.Dir(target))
		require.NoError(t, err)
		require.Empty(t, entries)
		stdout, _, err = runEvidence(t, "evidence", "export", string(id), "--db", db)
		require.ErrorIs(t, err, redact.ErrRedaction)
		require.Empty(t, stdout)
	})

	t.Run("ExistingOutputKeptOnError", func(t *testing.T) {
		require.NoError(t, os.WriteFile(out, []byte("earlier report"), 0o600))
		_, _, err := runEvidence(t, "evidence", "export", "run_01JDQ3Z8K4T5V6W7X8Y9Z0ABCE", "--db", db, "--out", out)
		require.Error(t, err)
		got, err := os.ReadFile(out)
		require.NoError(t, err)
		require.Equal(t, "earlier report", string(got))
	})
}

func TestEvidenceVerify(t *testing.T) {
	db, id := evidenceRun(t)

	t.Run("OK", func(t *testing.T) {
		stdout, _, err := runEvidence(t, "evidence", "verify", string(id), "--db", db)
		require.NoError(t, err)
		require.Regexp(t, `^OK: run `+string(id)+`, \d+ events, chain intact; \d+ rows as their events recorded them\n$`, stdout)
	})

	t.Run("ErrNotFound", func(t *testing.T) {
		_, _, err := runEvidence(t, "evidence", "verify", "run_01JDQ3Z8K4T5V6W7X8Y9Z0ABCE", "--db", db)
		require.ErrorIs(t, err, ledger.ErrNotFound)
		require.Equal(t, 5, exitStatus(err))
	})

	t.Run("EditedEvent", func(t *testing.T) {
		raw, err := sql.Open("sqlite3", "file:"+db+"?_busy_timeout=5000")
		require.NoError(t, err)
		defer raw.Close()
		_, err = raw.Exec(`DROP TRIGGER events_no_update`)
		require.NoError(t, err)
		_, err = raw.Exec(`UPDATE events SET actor = 'mallory' WHERE run_id = ? AND seq = 3`, id)
		require.NoError(t, err)

		stdout, _, err := runEvidence(t, "evidence", "verify", string(id), "--db", db)
		require.Error(t, err)
		require.Equal(t, "BROKEN: run "+string(id)+", event 3: event 3 was changed after it was written (hash differs)\n", stdout)
		require.Contains(t, err.Error(), "broken at event 3")
		require.Equal(t, 1, exitCode(err))
		require.Equal(t, 1, exitStatus(err))

		// Export still works and carries the verdict, with a warning.
		t.Setenv(envRedactionKey, "")
		stdout, stderr, err := runEvidence(t, "evidence", "export", string(id), "--db", db, "--format", "md")
		require.NoError(t, err)
		require.Contains(t, stdout, "BROKEN at event 3")
		require.Contains(t, stderr, "broken at event 3")
	})
}
