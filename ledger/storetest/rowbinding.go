package storetest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/stretchr/testify/require"
)

// rowsFixture is a run with one row of every kind a report shows: the run
// and its budget, an action the default gate sent to a person (audited,
// rowsGate) and approved by bob, its attempt and the
// observation that established its effect, and an accepted cancellation
// (a second after the rest, so the run's updated_at is not its
// created_at).
type rowsFixture struct {
	b      *bundle
	run    *ledger.Run
	action *ledger.Action
	att    *ledger.Attempt
	apr    *ledger.Approval
	obs    *ledger.Observation
	cancel *ledger.Cancellation
	db     DB
}

// rowsGate is the gate's audit of the fixture's action: the default
// decided, under some rule set.
var rowsGate = ledger.GateAudit{Rule: -1, Reason: "default: write actions require approval",
	RulesDigest: ledger.Digest("sha256:" + strings.Repeat("ab", 32))}

func openRowsFixture(t *testing.T, h Harness, opts Options) *rowsFixture {
	t.Helper()
	ctx := context.Background()
	opts.NewID = ledgertest.SequentialIDs()
	f := &rowsFixture{b: openWith(t, h, opts, ledgertest.NewClock())}
	s := f.b.Store
	f.run = f.b.RunningRun(t, "k", ledger.BudgetLimits{MaxAttemptsPerRun: 3})
	created, err := s.CreateAction(ctx, ledger.CreateActionParams{RunID: f.run.ID, IdempotencyKey: "step-1", Tool: "cards.write",
		ToolVersion: "1", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"cards":[{"front":"q","back":"a"}]}`),
		Gate: ledger.ActionAwaitingApproval, ApprovalTTL: time.Hour, GateAudit: rowsGate, Actor: "engine"})
	require.NoError(t, err)
	f.action = created.Action
	decided, err := s.DecideApproval(ctx, ledger.DecideApprovalParams{ActionID: f.action.ID, ActionDigest: f.action.ActionDigest,
		Decision: ledger.DecisionGrant, Principal: "bob", Reason: "looks right"})
	require.NoError(t, err)
	f.apr = decided.Approval
	_, err = s.AddUsage(ctx, ledger.AddUsageParams{RunID: f.run.ID, Steps: 1, Tokens: 10})
	require.NoError(t, err)
	f.att, err = s.StartAttempt(ctx, ledger.StartAttemptParams{ActionID: f.action.ID})
	require.NoError(t, err)
	finished, err := s.FinishAttempt(ctx, ledger.FinishAttemptParams{AttemptID: f.att.ID, Status: ledger.AttemptSucceeded,
		Result: json.RawMessage(`{"written":1}`), Observation: &ledger.ObservationInput{Source: ledger.ObservedResult, Effect: ledger.EffectHappened, Detail: json.RawMessage(`{"n":1}`)}})
	require.NoError(t, err)
	f.obs = finished.Observation
	f.b.Clock.Advance(time.Second)
	cancelled, err := s.RequestCancel(ctx, ledger.RequestCancelParams{RunID: f.run.ID, Principal: "alice", Reason: "enough"})
	require.NoError(t, err)
	f.cancel = cancelled.Cancellation

	rep, err := s.VerifyChain(ctx, f.run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.Equal(t, 7, rep.Rows, "run, budget, action, attempt, approval, cancellation, observation")
	require.Zero(t, rep.Unbound)
	f.db = f.b.DB
	return f
}

// lastBinding is the sequence number of the newest event of run that binds
// key, read from the events with encoding/json.
func lastBinding(t *testing.T, s ledger.Store, run ledger.RunID, key string) int64 {
	t.Helper()
	events, err := s.FindEvents(context.Background(), run)
	require.NoError(t, err)
	var seq int64
	for _, e := range events {
		if len(e.Rows) == 0 {
			continue
		}
		var rows map[string]string
		require.NoError(t, json.Unmarshal(e.Rows, &rows))
		if _, ok := rows[key]; ok {
			seq = e.Seq
		}
	}
	require.Positive(t, seq, "no event binds %s", key)
	return seq
}

// testVerifyChainDetectsRowEdits: a row edited behind the ledger's back
// (SQL on the database, events untouched) no longer matches the newest event
// that bound it, and the verdict names the row, the field where it can
// tell cheaply, and that event.
func testVerifyChainDetectsRowEdits(t *testing.T, h Harness) {
	ctx := context.Background()
	cases := []struct {
		name   string
		sql    func(f *rowsFixture) (string, []any)
		entity string
		id     func(f *rowsFixture) string
		reason string // besides "<entity> <id> was changed after event N recorded it"
	}{
		{"approval decided_by", func(f *rowsFixture) (string, []any) {
			return `UPDATE approvals SET decided_by = 'mallory' WHERE id = ?`, []any{f.apr.ID}
		}, "approval", func(f *rowsFixture) string { return string(f.apr.ID) }, `decided_by is "mallory", but event %d records the decision by "bob"`},
		{"approval reason", func(f *rowsFixture) (string, []any) {
			return `UPDATE approvals SET reason = 'rubber stamp' WHERE id = ?`, []any{f.apr.ID}
		}, "approval", func(f *rowsFixture) string { return string(f.apr.ID) }, "its content no longer has the digest that event recorded"},
		{"action arguments", func(f *rowsFixture) (string, []any) {
			return `UPDATE actions SET arguments = '{"cards":[{"back":"b","front":"evil"}]}' WHERE id = ?`, []any{f.action.ID}
		}, "action", func(f *rowsFixture) string { return string(f.action.ID) }, "its tool, version, effect or arguments no longer match its action digest"},
		{"action gate_rule", func(f *rowsFixture) (string, []any) {
			return `UPDATE actions SET gate_rule = 0 WHERE id = ?`, []any{f.action.ID}
		}, "action", func(f *rowsFixture) string { return string(f.action.ID) }, "its content no longer has the digest"},
		{"action gate_decision", func(f *rowsFixture) (string, []any) {
			return `UPDATE actions SET gate_decision = 'approved' WHERE id = ?`, []any{f.action.ID}
		}, "action", func(f *rowsFixture) string { return string(f.action.ID) }, "its content no longer has the digest"},
		{"action rules_digest", func(f *rowsFixture) (string, []any) {
			return `UPDATE actions SET rules_digest = 'sha256:' || substr(rules_digest, 9, 63) || '0' WHERE id = ?`, []any{f.action.ID}
		}, "action", func(f *rowsFixture) string { return string(f.action.ID) }, "its content no longer has the digest"},
		{"action gate erased", func(f *rowsFixture) (string, []any) {
			return `UPDATE actions SET gate_decision = NULL, gate_rule = NULL, gate_reason = NULL, rules_digest = NULL WHERE id = ?`, []any{f.action.ID}
		}, "action", func(f *rowsFixture) string { return string(f.action.ID) }, "its content no longer has the digest"},
		{"action state", func(f *rowsFixture) (string, []any) {
			return `UPDATE actions SET state = 'failed' WHERE id = ?`, []any{f.action.ID}
		}, "action", func(f *rowsFixture) string { return string(f.action.ID) }, `state is "failed", but event %d moved it to "succeeded"`},
		{"run state", func(f *rowsFixture) (string, []any) {
			return `UPDATE runs SET state = 'completed', stop_reason = 'completed' WHERE id = ?`, []any{f.run.ID}
		}, "run", func(f *rowsFixture) string { return string(f.run.ID) }, `state is "completed", but event %d moved it to "stopping"`},
		{"run updated_at", func(f *rowsFixture) (string, []any) {
			return `UPDATE runs SET updated_at = created_at WHERE id = ?`, []any{f.run.ID}
		}, "run", func(f *rowsFixture) string { return string(f.run.ID) }, "its content no longer has the digest"},
		{"budget usage", func(f *rowsFixture) (string, []any) {
			return `UPDATE budgets SET attempts_used = 0 WHERE run_id = ?`, []any{f.run.ID}
		}, "budget", func(f *rowsFixture) string { return string(f.run.ID) }, "its content no longer has the digest"},
		{"budget limit", func(f *rowsFixture) (string, []any) {
			return `UPDATE budgets SET max_attempts_per_run = 0 WHERE run_id = ?`, []any{f.run.ID}
		}, "budget", func(f *rowsFixture) string { return string(f.run.ID) }, "its content no longer has the digest"},
		{"attempt result", func(f *rowsFixture) (string, []any) {
			return `UPDATE attempts SET result = '{"written":2}' WHERE id = ?`, []any{f.att.ID}
		}, "attempt", func(f *rowsFixture) string { return string(f.att.ID) }, "its content no longer has the digest"},
		{"attempt effect", func(f *rowsFixture) (string, []any) {
			return `UPDATE attempts SET effect = 'not_happened' WHERE id = ?`, []any{f.att.ID}
		}, "attempt", func(f *rowsFixture) string { return string(f.att.ID) }, `effect is "not_happened", but event %d established "happened"`},
		{"cancellation requested_by", func(f *rowsFixture) (string, []any) {
			return `UPDATE cancellations SET requested_by = 'mallory' WHERE id = ?`, []any{f.cancel.ID}
		}, "cancellation", func(f *rowsFixture) string { return string(f.cancel.ID) }, "its content no longer has the digest"},
		{"observation effect", func(f *rowsFixture) (string, []any) {
			return `UPDATE observations SET effect = 'unknown' WHERE id = ?`, []any{f.obs.ID}
		}, "observation", func(f *rowsFixture) string { return string(f.obs.ID) }, "its content no longer has the digest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := openRowsFixture(t, h, Options{})
			dropAppendOnly(t, f.db)
			q, args := tc.sql(f)
			exec(t, f.db, q, args...)

			rep, err := f.b.Store.VerifyChain(ctx, f.run.ID)
			require.NoError(t, err)
			require.False(t, rep.OK)
			id := tc.id(f)
			seq := lastBinding(t, f.b.Store, f.run.ID, tc.entity+"/"+id)
			require.Equal(t, seq, rep.BrokenSeq, rep.Reason)
			require.Equal(t, tc.entity, rep.Entity)
			require.Equal(t, id, rep.EntityID)
			require.Contains(t, rep.Reason, tc.entity+" "+id+" was changed after event ")
			reason := tc.reason
			if strings.Contains(reason, "%d") {
				reason = fmt.Sprintf(reason, seq)
			}
			require.Contains(t, rep.Reason, reason)

			// The timeline's verdict is the same one.
			chain, err := f.b.Store.FindChain(ctx, f.run.ID)
			require.NoError(t, err)
			require.Equal(t, rep, chain.Report)
		})
	}
}

// testVerifyChainDetectsMissingAndExtraRows: a row deleted, or one
// inserted that no write of the ledger made, breaks the verdict too.
func testVerifyChainDetectsMissingAndExtraRows(t *testing.T, h Harness) {
	ctx := context.Background()
	t.Run("deleted approval", func(t *testing.T) {
		f := openRowsFixture(t, h, Options{})
		exec(t, f.db, `DELETE FROM approvals WHERE id = ?`, f.apr.ID)
		rep, err := f.b.Store.VerifyChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.False(t, rep.OK)
		require.Equal(t, lastBinding(t, f.b.Store, f.run.ID, "approval/"+string(f.apr.ID)), rep.BrokenSeq)
		require.Contains(t, rep.Reason, "approval "+string(f.apr.ID)+", which event")
		require.Contains(t, rep.Reason, "is missing")
	})
	t.Run("inserted approval", func(t *testing.T) {
		f := openRowsFixture(t, h, Options{})
		exec(t, f.db, `INSERT INTO approvals (id, action_id, run_id, tenant, action_digest, state, decided_by, version, requested_at, decided_at)
			SELECT 'apr_forged', action_id, run_id, tenant, action_digest, 'granted', 'mallory', 2, requested_at, decided_at
			FROM approvals WHERE id = ?`, f.apr.ID)
		rep, err := f.b.Store.VerifyChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.False(t, rep.OK)
		require.Equal(t, "approval apr_forged is recorded, but no event of the run binds it", rep.Reason)
		require.Equal(t, "apr_forged", rep.EntityID)
	})
}

// testVerifyChainLegacyRows: a run written before rows were bound (events
// of format 1, as the previous schema wrote them) still verifies; its rows
// are counted as unbound, and each write after the upgrade binds the rows
// it changes.
func testVerifyChainLegacyRows(t *testing.T, h Harness) {
	ctx := context.Background()
	f := openRowsFixture(t, h, Options{})
	dropAppendOnly(t, f.db)
	events, err := f.b.Store.FindEvents(ctx, f.run.ID)
	require.NoError(t, err)
	prev := ""
	for _, e := range events {
		e.Format, e.Rows, e.PrevHash = 1, nil, prev
		h, err := e.ComputeHash()
		require.NoError(t, err)
		exec(t, f.db, `UPDATE events SET format = 1, row_digests = NULL, prev_hash = ?, hash = ? WHERE id = ?`, prev, h, e.ID)
		prev = h
	}
	exec(t, f.db, `UPDATE runs SET event_hash = ? WHERE id = ?`, prev, f.run.ID)

	rep, err := f.b.Store.VerifyChain(ctx, f.run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.Equal(t, 7, rep.Rows)
	require.Equal(t, 7, rep.Unbound)

	_, err = f.b.Store.TransitionRun(ctx, ledger.RunTransition{ID: f.run.ID, From: ledger.RunStopping, To: ledger.RunStopped,
		StopReason: ledger.StopUserCancelled})
	require.NoError(t, err)
	rep, err = f.b.Store.VerifyChain(ctx, f.run.ID)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.Equal(t, 6, rep.Unbound, "the run's row is bound now")

	t.Run("a later event of format 1 breaks the chain", func(t *testing.T) {
		_, err = f.b.Store.AddUsage(ctx, ledger.AddUsageParams{RunID: f.run.ID, Steps: 1})
		require.NoError(t, err)
		rep, err := f.b.Store.VerifyChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
		last := readEvent(t, f.b.Store, f.run.ID, int64(rep.Events))
		require.Equal(t, ledger.EventFormat, last.Format)
		last.Format, last.Rows = 1, nil
		h, err := last.ComputeHash()
		require.NoError(t, err)
		exec(t, f.db, `UPDATE events SET format = 1, row_digests = NULL, hash = ? WHERE id = ?`, h, last.ID)
		exec(t, f.db, `UPDATE runs SET event_hash = ? WHERE id = ?`, h, f.run.ID)
		rep, err = f.b.Store.VerifyChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.False(t, rep.OK)
		require.Contains(t, rep.Reason, "has hash format 1 after events of format 2")
	})
}

// testEventBindsRowsInItsHash: the rows an event binds are covered by its
// hash, so editing an event's digests is an edited event.
func testEventBindsRowsInItsHash(t *testing.T, h Harness) {
	ctx := context.Background()
	f := openRowsFixture(t, h, Options{})
	dropAppendOnly(t, f.db)
	seq := lastBinding(t, f.b.Store, f.run.ID, "approval/"+string(f.apr.ID))
	exec(t, f.db, `UPDATE events SET row_digests = replace(row_digests, 'sha256:', 'sha256:0') WHERE run_id = ? AND seq = ?`, f.run.ID, seq)
	rep, err := f.b.Store.VerifyChain(ctx, f.run.ID)
	require.NoError(t, err)
	require.False(t, rep.OK)
	require.Equal(t, seq, rep.BrokenSeq)
	require.Contains(t, rep.Reason, "changed after it was written")
}

// testSignedHeads: a store with a signing key signs every head it moves;
// the newest signature verifies against the public key and the chain's
// head, and stops doing so once a process without the key writes, or once
// the chain and head are rewritten together.
func testSignedHeads(t *testing.T, h Harness) {
	ctx := context.Background()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)

	t.Run("OK", func(t *testing.T) {
		f := openRowsFixture(t, h, Options{SigningKey: key})
		chain, err := f.b.Store.FindChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.True(t, chain.Report.OK, chain.Report.Reason)
		sig := chain.Signature
		require.NotNil(t, sig)
		require.Equal(t, ledger.SigningKeyID(pub), sig.KeyID)
		require.Equal(t, int64(len(chain.Events)), sig.Seq)
		require.Equal(t, chain.Run.EventHash, sig.Hash)
		require.Equal(t, f.b.Clock.Now(), sig.SignedAt)
		require.NoError(t, ledger.VerifySignedHead(sig, pub, f.run.ID, chain.Run.EventSeq, chain.Run.EventHash))
	})
	t.Run("another key", func(t *testing.T) {
		f := openRowsFixture(t, h, Options{SigningKey: key})
		other, _, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		chain, err := f.b.Store.FindChain(ctx, f.run.ID)
		require.NoError(t, err)
		err = ledger.VerifySignedHead(chain.Signature, other, f.run.ID, chain.Run.EventSeq, chain.Run.EventHash)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		require.Contains(t, err.Error(), "was signed by key "+chain.Signature.KeyID+", not by the given key "+ledger.SigningKeyID(other))
	})
	t.Run("written without the key", func(t *testing.T) {
		f := openRowsFixture(t, h, Options{SigningKey: key})
		signed, err := f.b.Store.FindChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.NoError(t, f.b.Store.Close())
		unsigned := f.b.reopen(t, Options{})
		_, err = unsigned.TransitionRun(ctx, ledger.RunTransition{ID: f.run.ID, From: ledger.RunStopping, To: ledger.RunStopped,
			StopReason: ledger.StopUserCancelled})
		require.NoError(t, err)
		chain, err := unsigned.FindChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.True(t, chain.Report.OK, chain.Report.Reason)
		require.Equal(t, signed.Signature, chain.Signature, "the older signature stays")
		err = ledger.VerifySignedHead(chain.Signature, pub, f.run.ID, chain.Run.EventSeq, chain.Run.EventHash)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		require.Contains(t, err.Error(), "were written without the signing key")
	})
	t.Run("chain and head rewritten", func(t *testing.T) {
		f := openRowsFixture(t, h, Options{SigningKey: key})
		dropAppendOnly(t, f.db)
		events, err := f.b.Store.FindEvents(ctx, f.run.ID)
		require.NoError(t, err)
		prev := ""
		for _, e := range events {
			e.PrevHash = prev
			if e.Seq == 2 {
				e.Actor = "mallory"
			}
			h, err := e.ComputeHash()
			require.NoError(t, err)
			exec(t, f.db, `UPDATE events SET actor = ?, prev_hash = ?, hash = ? WHERE id = ?`, e.Actor, prev, h, e.ID)
			prev = h
		}
		exec(t, f.db, `UPDATE runs SET event_hash = ? WHERE id = ?`, prev, f.run.ID)
		chain, err := f.b.Store.FindChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.True(t, chain.Report.OK, "a consistent forgery passes the chain alone: %s", chain.Report.Reason)
		err = ledger.VerifySignedHead(chain.Signature, pub, f.run.ID, chain.Run.EventSeq, chain.Run.EventHash)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		require.Contains(t, err.Error(), "the chain was rewritten")
	})
	t.Run("ErrInvalid key", func(t *testing.T) {
		_, _, err := h.Open(t, Options{Now: ledgertest.NewClock().Now, SigningKey: key[:10]})
		require.ErrorIs(t, err, ledger.ErrInvalid)
		require.NotContains(t, err.Error(), string(key[:10]))
	})
	t.Run("no signature", func(t *testing.T) {
		f := openRowsFixture(t, h, Options{})
		chain, err := f.b.Store.FindChain(ctx, f.run.ID)
		require.NoError(t, err)
		require.Nil(t, chain.Signature)
		err = ledger.VerifySignedHead(chain.Signature, pub, f.run.ID, chain.Run.EventSeq, chain.Run.EventHash)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		require.Contains(t, err.Error(), "is not signed")
	})
}

// testSigningKeyNotStored: the signing key stays in the process. Once a
// store with a key has signed heads, no column of the database holds the
// key, or its seed, in any encoding it could plausibly be written in;
// its id, the check's control, is stored with the signatures.
func testSigningKeyNotStored(t *testing.T, h Harness) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	f := openRowsFixture(t, h, Options{SigningKey: key})
	require.NotEmpty(t, columnsHolding(t, f.db, ledger.SigningKeyID(pub)), "the key's id is stored with its signatures")
	encodings := map[string]func([]byte) string{
		"raw":       func(b []byte) string { return string(b) },
		"hex":       hex.EncodeToString,
		"base64":    base64.RawStdEncoding.EncodeToString,
		"base64url": base64.RawURLEncoding.EncodeToString,
	}
	for name, encode := range encodings {
		for part, secret := range map[string][]byte{"seed": key.Seed(), "key": key} {
			require.Empty(t, columnsHolding(t, f.db, encode(secret)), "the %s %s is stored", name, part)
		}
	}
}
