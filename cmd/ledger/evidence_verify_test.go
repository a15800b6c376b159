package main

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/stretchr/testify/require"
)

// forge runs SQL on the database file behind the ledger's back, as someone
// with write access to the file would.
func forge(t *testing.T, db string, queries ...string) {
	t.Helper()
	raw, err := sql.Open("sqlite3", "file:"+db+"?_busy_timeout=5000")
	require.NoError(t, err)
	defer raw.Close()
	for _, q := range queries {
		_, err := raw.Exec(q)
		require.NoError(t, err, q)
	}
}

// exportJSON exports run's JSON report to a file and returns its path.
func exportJSON(t *testing.T, db string, id ledger.RunID) string {
	t.Helper()
	t.Setenv(envRedactionKey, "a redaction key of the tests, long enough")
	out := filepath.Join(t.TempDir(), "report.json")
	_, _, err := runEvidence(t, "evidence", "export", string(id), "--db", db, "--out", out)
	require.NoError(t, err)
	return out
}

// TestEvidenceVerifyForgedRows: a row edited with SQL (the events left as
// they were) is caught by evidence verify, which names the row, the field
// and the event that recorded it, and by the verdict an export shows.
// Before rows were bound into the chain all three passed as intact.
func TestEvidenceVerifyForgedRows(t *testing.T) {
	cases := []struct {
		name   string
		sql    string
		entity string
		why    string // %[1]d is the event's seq
	}{
		{"approvals.decided_by", `UPDATE approvals SET decided_by = 'mallory'`, "approval",
			`decided_by is "mallory", but event %[1]d records the decision by "bob"`},
		{"actions.arguments", `UPDATE actions SET arguments = '{"title":"forged","cards":[]}' WHERE effect = 'write'`, "action",
			"its tool, version, effect or arguments no longer match its action digest"},
		{"runs.state", `UPDATE runs SET state = 'failed', stop_reason = 'tool_error'`, "run",
			`state is "failed", but event %[1]d moved it to "completed"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db, id := evidenceRun(t)
			forge(t, db, tc.sql)

			stdout, _, err := runEvidence(t, "evidence", "verify", string(id), "--db", db)
			require.Error(t, err)
			require.Equal(t, 1, exitStatus(err))
			m := regexp.MustCompile(`^BROKEN: run ` + string(id) + `, event (\d+): ` + tc.entity + ` (\S+) was changed after event (\d+) recorded it: (.*)\n$`).
				FindStringSubmatch(stdout)
			require.NotNil(t, m, stdout)
			require.Equal(t, m[1], m[3])
			var seq int
			_, err = fmt.Sscan(m[1], &seq)
			require.NoError(t, err)
			why := tc.why
			if strings.Contains(why, "%[1]d") {
				why = fmt.Sprintf(why, seq)
			}
			require.Contains(t, m[4], why)

			// The verdict an export shows is the same.
			data, err := os.ReadFile(exportJSON(t, db, id))
			require.NoError(t, err)
			var rep struct {
				Chain struct {
					OK        bool   `json:"ok"`
					BrokenSeq int    `json:"broken_seq"`
					Reason    string `json:"reason"`
				} `json:"chain"`
			}
			require.NoError(t, json.Unmarshal(data, &rep))
			require.False(t, rep.Chain.OK)
			require.Equal(t, seq, rep.Chain.BrokenSeq)
			require.Contains(t, rep.Chain.Reason, tc.entity+" "+m[2]+" was changed")
		})
	}
}

// TestRunsTimelineForgedRow: the chain verdict of a timeline catches an
// edited approval too.
func TestRunsTimelineForgedRow(t *testing.T) {
	t.Parallel()
	env := newAPIEnv(t, envOptions{})
	id, a := env.awaiting(t, "k1")
	_, _, err := env.cli(t, "bob", "approve", string(a.ID), "--digest", string(a.ActionDigest))
	require.NoError(t, err)
	out, _, err := env.cli(t, "alice", "runs", "timeline", string(id))
	require.NoError(t, err)
	require.Regexp(t, `\nchain: ok \(\d+ events\)\n$`, out)

	forge(t, filepath.Join(env.dir, "ledger.db"), `UPDATE approvals SET decided_by = 'mallory'`)
	out, _, err = env.cli(t, "alice", "runs", "timeline", string(id))
	require.NoError(t, err, "a broken chain is shown, not an error")
	require.Regexp(t, `\nchain: BROKEN at event (\d+): approval apr_\S+ was changed after event \d+ recorded it: decided_by is "mallory", but event \d+ records the decision by "bob"\n$`, out)
}

// signingKey makes a key pair with signing-key new and returns the
// private and public key files.
func signingKey(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	key, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub")
	stdout, stderr, err := runEvidence(t, "signing-key", "new", "--out", key, "--public-out", pub)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(stdout, "-----BEGIN PUBLIC KEY-----\n"), stdout)
	written, err := os.ReadFile(pub)
	require.NoError(t, err)
	require.Equal(t, stdout, string(written))
	require.Regexp(t, `^signing key [0-9a-f]{16} written to `, stderr)
	return key, pub
}

func TestSigningKey(t *testing.T) {
	t.Parallel()
	key, pub := signingKey(t)

	t.Run("files", func(t *testing.T) {
		info, err := os.Stat(key)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
		private, err := readSigningKey(discardLogger(), key)
		require.NoError(t, err)
		public, err := readPublicKey(pub)
		require.NoError(t, err)
		require.True(t, public.Equal(private.Public()))

		stdout, stderr, err := runEvidence(t, "signing-key", "public", "--key", key)
		require.NoError(t, err)
		written, err := os.ReadFile(pub)
		require.NoError(t, err)
		require.Equal(t, string(written), stdout)
		require.Equal(t, "key id "+ledger.SigningKeyID(public)+"\n", stderr)
		keyText, err := os.ReadFile(key)
		require.NoError(t, err)
		require.NotContains(t, stdout+stderr, string(keyText))
	})

	t.Run("ErrUsage", func(t *testing.T) {
		dir := t.TempDir()
		garbage := filepath.Join(dir, "garbage.pem")
		require.NoError(t, os.WriteFile(garbage, []byte("not a key"), 0o600))
		for name, args := range map[string][]string{
			"never overwritten":    {"signing-key", "new", "--out", key},
			"no out":               {"signing-key", "new"},
			"no key":               {"signing-key", "public"},
			"public key for a key": {"signing-key", "public", "--key", pub},
			"garbage":              {"signing-key", "public", "--key", garbage},
			"missing":              {"signing-key", "public", "--key", filepath.Join(dir, "nope.pem")},
		} {
			t.Run(name, func(t *testing.T) {
				before, err := os.ReadFile(key)
				require.NoError(t, err)
				_, _, err = runEvidence(t, args...)
				require.Error(t, err)
				require.Equal(t, 2, exitStatus(err), err.Error())
				require.NotContains(t, err.Error(), string(before))
				after, err := os.ReadFile(key)
				require.NoError(t, err)
				require.Equal(t, before, after, "a key file is never overwritten")
			})
		}
	})
}

// TestEvidenceVerifyReport: a report exported from a signing ledger
// verifies without the database against the public key; each edit of the
// file — a row's field, an event, the signed head, the signature — is
// caught with a clear message and exit status 1; and a chain rewritten in
// the database together with its head, consistent as it is, fails the
// signature check.
func TestEvidenceVerifyReport(t *testing.T) {
	keyFile, pubFile := signingKey(t)
	key, err := readSigningKey(discardLogger(), keyFile)
	require.NoError(t, err)
	keyID := ledger.SigningKeyID(key.Public().(ed25519.PublicKey))
	db, id := evidenceRunSigned(t, key)
	report := exportJSON(t, db, id)

	t.Run("OK", func(t *testing.T) {
		stdout, _, err := runEvidence(t, "evidence", "verify", "--report", report, "--public-key", pubFile)
		require.NoError(t, err)
		require.Regexp(t, `^OK: report of run `+string(id)+`, \d+ events, chain intact; \d+ rows as their events recorded them; `+
			`(\d+ redacted values covered only by their digests; )?head \(event \d+\) signed by key `+keyID+` at \S+\n$`, stdout)

		stdout, _, err = runEvidence(t, "evidence", "verify", "--report", report)
		require.NoError(t, err)
		require.Contains(t, stdout, "; head signed by key "+keyID+", not checked (no --public-key)\n")

		stdout, _, err = runEvidence(t, "evidence", "verify", string(id), "--db", db, "--public-key", pubFile)
		require.NoError(t, err)
		require.Regexp(t, `^OK: run `+string(id)+`, \d+ events, chain intact; \d+ rows as their events recorded them; head \(event \d+\) signed by key `+keyID, stdout)
	})

	tampered := func(t *testing.T, change func(r map[string]any)) string {
		t.Helper()
		data, err := os.ReadFile(report)
		require.NoError(t, err)
		var r map[string]any
		require.NoError(t, json.Unmarshal(data, &r))
		change(r)
		out, err := json.MarshalIndent(r, "", "  ")
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "tampered.json")
		require.NoError(t, os.WriteFile(path, out, 0o600))
		return path
	}
	field := func(r map[string]any, path ...any) map[string]any {
		var v any = r
		for _, p := range path {
			switch k := p.(type) {
			case string:
				v = v.(map[string]any)[k]
			case int:
				v = v.([]any)[k]
			}
		}
		return v.(map[string]any)
	}
	cases := []struct {
		name   string
		change func(r map[string]any)
		want   string
	}{
		{"row field", func(r map[string]any) {
			for _, a := range r["actions"].([]any) {
				for _, ap := range a.(map[string]any)["approvals"].([]any) {
					ap.(map[string]any)["decided_by"] = "mallory"
				}
			}
		}, `approval apr_\S+ was changed after event \d+ recorded it: decided_by is "mallory", but event \d+ records the decision by "bob"`},
		{"event", func(r map[string]any) { field(r, "timeline", 2)["actor"] = "mallory" },
			`event 3: event 3 was changed after it was written \(hash differs\)`},
		{"head", func(r map[string]any) { field(r, "signature")["seq"] = 2 },
			`the signature of run run_\S+'s head \(event 2, sha256:\S+\) does not verify with key ` + keyID},
		{"signature", func(r map[string]any) {
			sig := field(r, "signature")
			_, other, err := ed25519.GenerateKey(nil)
			require.NoError(t, err)
			sig["signature"] = base64Sig(ed25519.Sign(other, []byte("something else")))
		}, `does not verify with key ` + keyID},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stdout, _, err := runEvidence(t, "evidence", "verify", "--report", tampered(t, tc.change), "--public-key", pubFile)
			require.Error(t, err)
			require.Equal(t, 1, exitStatus(err))
			require.Regexp(t, `^BROKEN: report of run `+string(id)+`: .*`+tc.want+`.*\n$`, stdout)
		})
	}

	t.Run("chain and head rewritten in the database", func(t *testing.T) {
		db, id := evidenceRunSigned(t, key)
		rewriteChain(t, db, id)

		stdout, _, err := runEvidence(t, "evidence", "verify", string(id), "--db", db)
		require.NoError(t, err, "without the key a consistent forgery passes")
		require.True(t, strings.HasPrefix(stdout, "OK: "), stdout)

		stdout, _, err = runEvidence(t, "evidence", "verify", string(id), "--db", db, "--public-key", pubFile)
		require.Error(t, err)
		require.Equal(t, 1, exitStatus(err))
		require.Regexp(t, `^BROKEN: run `+string(id)+`: the signature of run \S+'s event \d+ is of hash sha256:\S+, but the chain's is sha256:\S+: the chain was rewritten\n$`, stdout)

		stdout, _, err = runEvidence(t, "evidence", "verify", "--report", exportJSON(t, db, id), "--public-key", pubFile)
		require.Error(t, err)
		require.Equal(t, 1, exitStatus(err))
		require.Contains(t, stdout, "the chain was rewritten")
	})

	t.Run("unsigned", func(t *testing.T) {
		db, id := evidenceRun(t)
		unsigned := exportJSON(t, db, id)
		stdout, _, err := runEvidence(t, "evidence", "verify", "--report", unsigned)
		require.NoError(t, err)
		require.Contains(t, stdout, "; not signed: anyone able to rewrite the database or the file could have made it consistent\n")
		stdout, _, err = runEvidence(t, "evidence", "verify", "--report", unsigned, "--public-key", pubFile)
		require.Equal(t, 1, exitStatus(err))
		require.Equal(t, "BROKEN: report of run "+string(id)+": the head of run "+string(id)+" is not signed\n", stdout)
	})

	t.Run("ErrUsage", func(t *testing.T) {
		dir := t.TempDir()
		notReport := filepath.Join(dir, "not.json")
		require.NoError(t, os.WriteFile(notReport, []byte(`{"schema_version": "1.1"}`), 0o600))
		for _, tc := range []struct {
			name string
			args []string
			exit int
			want string
		}{
			{"report and run", []string{"evidence", "verify", string(id), "--report", report}, 2, "give no RUN and no --db"},
			{"report and db", []string{"evidence", "verify", "--db", db, "--report", report}, 2, "give no RUN and no --db"},
			{"nothing", []string{"evidence", "verify"}, 2, "give RUN (with --db) or --report FILE"},
			{"missing report", []string{"evidence", "verify", "--report", filepath.Join(dir, "nope.json")}, 2, "no such file"},
			{"private key as public", []string{"evidence", "verify", "--report", report, "--public-key", keyFile}, 2, `not a PEM "PUBLIC KEY" block`},
			{"not a report", []string{"evidence", "verify", "--report", notReport}, 1, "not a valid report"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, _, err := runEvidence(t, tc.args...)
				require.Error(t, err)
				require.Equal(t, tc.exit, exitStatus(err), err.Error())
				require.Contains(t, err.Error(), tc.want)
			})
		}
	})
}

// rewriteChain forges run's history in the database as someone with write
// access to the file but not the signing key would, consistently: bob's
// approval becomes mallory's, in the row, in the event that recorded it
// (its actor and the row's digest), and every hash from there on, up to
// the run's recorded head.
func rewriteChain(t *testing.T, db string, id ledger.RunID) {
	t.Helper()
	ctx := context.Background()
	forge(t, db, `DROP TRIGGER events_no_update`, `UPDATE approvals SET decided_by = 'mallory'`)
	store, err := sqlite.OpenStore(ctx, sqlite.Config{Path: db})
	require.NoError(t, err)
	defer store.Close()
	approvals, err := store.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &id})
	require.NoError(t, err)
	require.Len(t, approvals, 1)
	content := ledger.ApprovalContentOf(approvals[0])
	events, err := store.FindEvents(ctx, id)
	require.NoError(t, err)

	raw, err := sql.Open("sqlite3", "file:"+db+"?_busy_timeout=5000")
	require.NoError(t, err)
	defer raw.Close()
	prev, rewritten := "", false
	for _, e := range events {
		if e.EntityID == string(approvals[0].ID) && e.ToState == string(ledger.ApprovalGranted) {
			e.Actor = "mallory"
			e.Rows, err = ledger.CanonicalJSON(map[ledger.RowKey]ledger.Digest{content.Key(): content.Digest()})
			require.NoError(t, err)
			rewritten = true
		}
		e.PrevHash = prev
		e.Hash, err = e.ComputeHash()
		require.NoError(t, err)
		_, err = raw.Exec(`UPDATE events SET actor = ?, row_digests = ?, prev_hash = ?, hash = ? WHERE id = ?`,
			e.Actor, string(e.Rows), e.PrevHash, e.Hash, e.ID)
		require.NoError(t, err)
		prev = e.Hash
	}
	require.True(t, rewritten)
	_, err = raw.Exec(`UPDATE runs SET event_hash = ? WHERE id = ?`, prev, id)
	require.NoError(t, err)
}

func base64Sig(sig []byte) string { return base64.StdEncoding.EncodeToString(sig) }

// TestSigningKeyWiring: demo takes the key from $LEDGER_SIGNING_KEY_FILE,
// worker from --signing-key, and the heads they move are signed by it;
// serve refuses a key file it cannot read before it opens anything.
func TestSigningKeyWiring(t *testing.T) {
	ctx := context.Background()
	keyFile, pubFile := signingKey(t)
	pub, err := readPublicKey(pubFile)
	require.NoError(t, err)
	signedHead := func(t *testing.T, db string) {
		t.Helper()
		store, err := sqlite.OpenStore(ctx, sqlite.Config{Path: db})
		require.NoError(t, err)
		defer store.Close()
		runs, err := store.FindRuns(ctx, ledger.RunFilter{})
		require.NoError(t, err)
		require.Len(t, runs, 1)
		chain, err := store.FindChain(ctx, runs[0].ID)
		require.NoError(t, err)
		require.NoError(t, ledger.VerifySignedHead(chain.Signature, pub, runs[0].ID, chain.Run.EventSeq, chain.Run.EventHash))
	}

	t.Run("demo from the environment", func(t *testing.T) {
		t.Setenv(envSigningKeyFile, keyFile)
		dir := t.TempDir()
		_, _, err := runEvidence(t, "demo", "--keep", dir)
		require.NoError(t, err)
		signedHead(t, filepath.Join(dir, "ledger.db"))
	})

	t.Run("worker from the flag", func(t *testing.T) {
		t.Setenv(envSigningKeyFile, "")
		db := filepath.Join(t.TempDir(), "ledger.db")
		svc, err := openService(ctx, serviceConfig{DBPath: db, Logger: discardLogger()})
		require.NoError(t, err)
		_, err = svc.store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k", Principal: "alice",
			Agent: "practice-cards", Input: json.RawMessage(`{"title":"t","markdown":"# t\n\nq: a"}`)})
		require.NoError(t, err)
		require.NoError(t, svc.Close())
		_, _, err = runEvidence(t, "worker", "--db", db, "--until-idle", "--signing-key", keyFile)
		require.NoError(t, err)
		signedHead(t, db)
	})

	t.Run("serve refuses a bad key", func(t *testing.T) {
		garbage := filepath.Join(t.TempDir(), "garbage.pem")
		require.NoError(t, os.WriteFile(garbage, []byte("not a key"), 0o600))
		db := filepath.Join(t.TempDir(), "ledger.db")
		_, _, err := runEvidence(t, "serve", "--db", db, "--addr", "127.0.0.1:0", "--signing-key", garbage)
		require.Error(t, err)
		require.Equal(t, 2, exitStatus(err))
		require.Contains(t, err.Error(), "not a PEM")
		_, err = os.Stat(db)
		require.ErrorIs(t, err, os.ErrNotExist, "nothing was opened")
	})
}
