package evidence_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/stretchr/testify/require"
)

// signedReport is the golden run recorded by a store with a signing key,
// exported as JSON, and the key's public half.
func signedReport(t *testing.T) ([]byte, ed25519.PublicKey) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	f := openFixtureWith(t, sqlite.Config{SigningKey: key})
	id := goldenRun(t, f)
	rep, err := evidence.Build(context.Background(), f.store, id, f.options(t))
	require.NoError(t, err)
	require.NotNil(t, rep.Signature)
	return render(t, rep, "json"), pub
}

// edit decodes a report, lets change edit it as plain JSON, and encodes
// it again.
func edit(t *testing.T, report []byte, change func(r map[string]any)) []byte {
	t.Helper()
	var r map[string]any
	require.NoError(t, json.Unmarshal(report, &r))
	change(r)
	out, err := json.MarshalIndent(r, "", "  ")
	require.NoError(t, err)
	return out
}

// at walks a decoded report: keys of objects, indexes of arrays.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			v = v.(map[string]any)[k]
		case int:
			v = v.([]any)[k]
		}
	}
	return v
}

func obj(v any, path ...any) map[string]any { return at(v, path...).(map[string]any) }

// TestVerifyReport: a report verifies offline, with and without the
// public key, and every kind of edit of the file is caught and named.
func TestVerifyReport(t *testing.T) {
	report, pub := signedReport(t)

	t.Run("OK", func(t *testing.T) {
		rep, err := evidence.ReadReport(report)
		require.NoError(t, err)
		v, err := rep.Verify(pub)
		require.NoError(t, err)
		require.Equal(t, 33, v.Events)
		require.Equal(t, 10, v.Rows)
		require.Zero(t, v.Unbound)
		require.Equal(t, 8, v.Hidden, "five argument nodes (four and one), a reason, a detail node, an event's data")
		require.NotNil(t, v.Signature)
		require.Equal(t, int64(33), v.Signature.Seq)
		require.Equal(t, ledger.SigningKeyID(pub), v.Signature.KeyID)

		v, err = rep.Verify(nil)
		require.NoError(t, err)
		require.Nil(t, v.Signature, "no key: the signature is not checked")
	})

	other, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	approval := []any{"actions", 0, "approvals", 0}
	cases := []struct {
		name   string
		change func(r map[string]any)
		key    ed25519.PublicKey
		want   string
	}{
		{"approval decided_by", func(r map[string]any) { obj(r, approval...)["decided_by"] = "mallory" }, pub,
			`approval apr_00000000000000000000000008 was changed after event 8 recorded it: decided_by is "mallory", but event 8 records the decision by "bob"`},
		{"approval execute_by", func(r map[string]any) { obj(r, approval...)["execute_by"] = "2030-01-01T00:00:00Z" }, pub,
			"approval apr_00000000000000000000000008 was changed after event 8 recorded it"},
		{"visible argument", func(r map[string]any) { obj(r, "actions", 0, "arguments")["title"] = "Rust channels" }, pub,
			"action act_00000000000000000000000005 was changed after event 16 recorded it"},
		{"hidden argument shown", func(r map[string]any) { obj(r, "actions", 0, "arguments")["api_key"] = "sk-not-the-real-one" }, pub,
			`action act_00000000000000000000000005: arguments: the report says it hid the node at "/api_key", but shows no redaction marker there`},
		{"hidden argument digest", func(r map[string]any) {
			obj(r, "actions", 0, "redacted_fields", "arguments")["/api_key"] = "sha256:" + strings.Repeat("0", 64)
		}, pub, "action act_00000000000000000000000005 was changed after event 16 recorded it"},
		{"action gate rule", func(r map[string]any) { obj(r, "actions", 1, "gate")["rule"] = 3 }, pub,
			"action act_00000000000000000000000023 was changed after event 31 recorded it"},
		{"action gate decision", func(r map[string]any) { obj(r, "actions", 0, "gate")["decision"] = "approved" }, pub,
			"action act_00000000000000000000000005 was changed after event 16 recorded it"},
		{"action gate removed", func(r map[string]any) { obj(r, "actions", 1)["gate"] = nil }, pub,
			"action act_00000000000000000000000023 was changed after event 31 recorded it"},
		{"gate event data", func(r map[string]any) { obj(r, "timeline", 18, "data", "gate")["rule"] = 3 }, pub,
			"event 19: event 19 was changed after it was written (hash differs)"},
		{"attempt status", func(r map[string]any) { obj(r, "actions", 0, "attempts", 0)["status"] = "failed" }, pub,
			"attempt att_00000000000000000000000015 was changed after event 15 recorded it"},
		{"budget usage", func(r map[string]any) { obj(r, "budget", "used")["attempts"] = 1 }, pub,
			"budget run_00000000000000000000000001 was changed after event 30 recorded it"},
		{"deadline after", func(r map[string]any) { obj(r, "budget", "limits")["deadline_after_ms"] = 1 }, pub,
			"budget: deadline_after_ms is not the deadline less the run's created_at"},
		{"run state", func(r map[string]any) {
			obj(r, "run")["state"] = "completed"
			obj(r, "run")["stop_reason"] = "completed"
		}, pub,
			`run run_00000000000000000000000001 was changed after event 33 recorded it: state is "completed", but event 33 moved it to "stopped"`},
		{"row removed", func(r map[string]any) { obj(r, "actions", 0)["approvals"] = []any{} }, pub,
			"approval apr_00000000000000000000000008, which event 8 recorded, is missing"},
		{"row digest", func(r map[string]any) { obj(r, "cancellation")["digest"] = "sha256:" + strings.Repeat("1", 64) }, pub,
			"cancellation/cnc_00000000000000000000000029: the report gives it the digest sha256:1111"},
		{"event actor", func(r map[string]any) { obj(r, "timeline", 4)["actor"] = "mallory" }, pub,
			"event 5: event 5 was changed after it was written (hash differs)"},
		{"event data", func(r map[string]any) { obj(r, "timeline", 0, "data")["agent"] = "other" }, pub,
			"event 1: event 1 was changed after it was written (hash differs)"},
		{"event rows", func(r map[string]any) { delete(obj(r, "timeline", 11), "rows") }, pub,
			"event 12: event 12 was changed after it was written (hash differs)"},
		{"redacted event data shown", func(r map[string]any) {
			obj(r, "timeline", 7, "data")["reason"] = "cards look right"
		}, pub, `event 8: data: the report says it hid the node at "/reason", but shows no redaction marker there`},
		{"events removed from the end", func(r map[string]any) {
			r["timeline"] = r["timeline"].([]any)[:32]
			obj(r, "chain")["events"] = 32
		}, pub, `run run_00000000000000000000000001 was changed after event 24 recorded it: state is "stopped", but event 24 moved it to "stopping"`},
		{"events counted", func(r map[string]any) { obj(r, "chain")["events"] = 36 }, pub,
			"the report says the chain holds 36 events, but its timeline shows 33"},
		{"recovery decision", func(r map[string]any) { obj(r, "recovery_decisions", 0)["rationale"] = "because" }, pub,
			"recovery decision 26 differs from the data of its event"},
		{"signed head seq", func(r map[string]any) { obj(r, "signature")["seq"] = 32 }, pub,
			"does not verify with key"},
		{"signed head hash", func(r map[string]any) { obj(r, "signature")["hash"] = obj(r, "timeline", 31)["hash"] }, pub,
			"does not verify with key"},
		{"signature", func(r map[string]any) {
			s := []byte(obj(r, "signature")["signature"].(string))
			if s[10] == 'A' { // another base64 digit: still a signature, not this one
				s[10] = 'B'
			} else {
				s[10] = 'A'
			}
			obj(r, "signature")["signature"] = string(s)
		}, pub, "does not verify with key"},
		{"signature removed", func(r map[string]any) { r["signature"] = nil }, pub,
			"the head of run run_00000000000000000000000001 is not signed"},
		{"another key", func(r map[string]any) {}, other,
			"was signed by key " + ledger.SigningKeyID(pub) + ", not by the given key " + ledger.SigningKeyID(other)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := evidence.ReadReport(edit(t, report, tc.change))
			require.NoError(t, err)
			_, err = rep.Verify(tc.key)
			require.ErrorIs(t, err, evidence.ErrUnverified)
			require.Contains(t, err.Error(), tc.want)
		})
	}

	t.Run("not a report", func(t *testing.T) {
		_, err := evidence.ReadReport([]byte(`{"schema_version": "1.1"}`))
		require.ErrorIs(t, err, evidence.ErrUnverified)
		require.Contains(t, err.Error(), "not a valid report")
		_, err = evidence.ReadReport(edit(t, report, func(r map[string]any) { obj(r, "signature")["signature"] = "short" }))
		require.ErrorIs(t, err, evidence.ErrUnverified)
		require.Contains(t, err.Error(), "/signature")
	})
}

// TestVerifyUnsignedReport: a report of a ledger without a signing key
// verifies as consistent, and fails as soon as a key is asked for.
func TestVerifyUnsignedReport(t *testing.T) {
	f := openFixture(t)
	id := goldenRun(t, f)
	built, err := evidence.Build(context.Background(), f.store, id, f.options(t))
	require.NoError(t, err)
	require.Nil(t, built.Signature)
	rep, err := evidence.ReadReport(render(t, built, "json"))
	require.NoError(t, err)
	v, err := rep.Verify(nil)
	require.NoError(t, err)
	require.Equal(t, 10, v.Rows)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, err = rep.Verify(pub)
	require.ErrorIs(t, err, evidence.ErrUnverified)
	require.Contains(t, err.Error(), "is not signed")
}
