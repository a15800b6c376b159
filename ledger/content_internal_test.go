package ledger

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// generalDigest is the general path a content's Digest must agree with:
// encoding/json of the content (its JSON tags name the keys), the given
// keys' "" as null, then RFC 8785 and sha256.
func generalDigest(t *rapid.T, c any, nullable ...string) Digest {
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	for _, k := range nullable {
		if m[k] == "" {
			m[k] = nil
		}
	}
	out, err := DigestOf(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestContentDigestIsJCS holds each content's hand-written canonical
// encoding to the general path, for any strings (quotes, control
// characters, non-ASCII), times with and without fractions, integers past
// 2^53, and absent values.
func TestContentDigestIsJCS(t *testing.T) {
	str := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.RuneFrom([]rune{'"', '\\', '\n', 0x01, 0x7f, 0x2028, 'é', '😀', '<', '&'})),
		rapid.Just(""))
	when := rapid.Custom(func(t *rapid.T) time.Time {
		return time.UnixMicro(rapid.Int64Range(0, 1<<52).Draw(t, "us")).UTC()
	})
	maybeWhen := rapid.Custom(func(t *rapid.T) *time.Time {
		if rapid.Bool().Draw(t, "absent") {
			return nil
		}
		w := when.Draw(t, "when")
		return &w
	})
	maybeInt := rapid.Custom(func(t *rapid.T) *int64 {
		if rapid.Bool().Draw(t, "absent") {
			return nil
		}
		v := rapid.Int64().Draw(t, "v")
		return &v
	})
	digest := rapid.Custom(func(t *rapid.T) Digest {
		if rapid.Bool().Draw(t, "absent") {
			return ""
		}
		return digestBytes([]byte(str.Draw(t, "doc")))
	})
	check := func(t *rapid.T, c Content, general Digest) {
		if got := c.Digest(); got != general {
			t.Fatalf("%T digest %s, general path %s: %+v", c, got, general, c)
		}
	}
	t.Run("run", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			c := RunContent{ID: RunID(str.Draw(t, "id")), Tenant: str.Draw(t, "tenant"), Agent: str.Draw(t, "agent"),
				State: RunState(str.Draw(t, "state")), StopReason: StopReason(str.Draw(t, "stop")), SubmittedBy: str.Draw(t, "by"),
				CreatedAt: when.Draw(t, "created"), UpdatedAt: when.Draw(t, "updated")}
			check(t, c, generalDigest(t, c, "stop_reason"))
		})
	})
	t.Run("budget", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			c := BudgetContent{RunID: RunID(str.Draw(t, "run")), MaxAttemptsPerAction: maybeInt.Draw(t, "a"),
				MaxAttemptsPerRun: maybeInt.Draw(t, "r"), MaxExecutionMS: maybeInt.Draw(t, "e"), MaxSteps: maybeInt.Draw(t, "s"),
				MaxTokens: maybeInt.Draw(t, "t"), Deadline: maybeWhen.Draw(t, "deadline"), Attempts: rapid.Int64().Draw(t, "attempts"),
				ExecutionMS: rapid.Int64().Draw(t, "exec"), Steps: rapid.Int64().Draw(t, "steps"), Tokens: rapid.Int64().Draw(t, "tokens"),
				TokensUnavailable: rapid.Bool().Draw(t, "unavailable")}
			check(t, c, generalDigest(t, c))
		})
	})
	maybeGate := rapid.Custom(func(t *rapid.T) *GateContent {
		if rapid.Bool().Draw(t, "ungated") {
			return nil
		}
		return &GateContent{Decision: ActionState(str.Draw(t, "decision")), Rule: maybeInt.Draw(t, "rule"),
			Reason: str.Draw(t, "reason"), RulesDigest: Digest(str.Draw(t, "rules"))}
	})
	t.Run("action", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			c := ActionContent{ID: ActionID(str.Draw(t, "id")), RunID: RunID(str.Draw(t, "run")), Seq: rapid.Int64().Draw(t, "seq"),
				Tool: str.Draw(t, "tool"), ToolVersion: str.Draw(t, "version"), Effect: Effect(str.Draw(t, "effect")),
				State: ActionState(str.Draw(t, "state")), ActionDigest: Digest(str.Draw(t, "digest")), DedupKey: str.Draw(t, "dedup"),
				Supersedes: ActionID(str.Draw(t, "supersedes")), ArgumentsDigest: digest.Draw(t, "args"),
				CreatedAt: when.Draw(t, "created"), UpdatedAt: when.Draw(t, "updated"), Gate: maybeGate.Draw(t, "gate")}
			check(t, c, generalDigest(t, c, "supersedes", "arguments"))
		})
	})
	t.Run("attempt", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			c := AttemptContent{ID: AttemptID(str.Draw(t, "id")), ActionID: ActionID(str.Draw(t, "action")), No: rapid.Int64().Draw(t, "no"),
				Status: AttemptStatus(str.Draw(t, "status")), Effect: EffectFact(str.Draw(t, "effect")),
				EffectObservation: ObservationID(str.Draw(t, "obs")), ResultDigest: digest.Draw(t, "result"),
				ErrorDigest: digest.Draw(t, "error"), StartedAt: when.Draw(t, "started"), FinishedAt: maybeWhen.Draw(t, "finished")}
			check(t, c, generalDigest(t, c, "effect_observation_id", "result", "error"))
		})
	})
	t.Run("approval", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			c := ApprovalContent{ID: ApprovalID(str.Draw(t, "id")), ActionID: ActionID(str.Draw(t, "action")),
				State: ApprovalState(str.Draw(t, "state")), ActionDigest: Digest(str.Draw(t, "digest")), DecidedBy: str.Draw(t, "by"),
				ReasonDigest: digest.Draw(t, "reason"), RequestedAt: when.Draw(t, "requested"), ExpiresAt: maybeWhen.Draw(t, "expires"),
				DecidedAt: maybeWhen.Draw(t, "decided"), ExecuteBy: maybeWhen.Draw(t, "execute_by"),
				StaleAt: maybeWhen.Draw(t, "stale_at"), StaleReasonDigest: digest.Draw(t, "stale_reason")}
			check(t, c, generalDigest(t, c, "decided_by", "reason"))
		})
	})
	t.Run("cancellation", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			c := CancellationContent{ID: CancellationID(str.Draw(t, "id")), RunID: RunID(str.Draw(t, "run")),
				State: CancellationState(str.Draw(t, "state")), RequestedBy: str.Draw(t, "by"), ReasonDigest: digest.Draw(t, "reason"),
				RequestedAt: when.Draw(t, "requested"), AcceptedAt: maybeWhen.Draw(t, "accepted"), StoppingAt: maybeWhen.Draw(t, "stopping"),
				StoppedAt: maybeWhen.Draw(t, "stopped")}
			check(t, c, generalDigest(t, c, "reason"))
		})
	})
	t.Run("observation", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			c := ObservationContent{ID: ObservationID(str.Draw(t, "id")), ActionID: ActionID(str.Draw(t, "action")),
				AttemptID: AttemptID(str.Draw(t, "attempt")), Source: ObservationSource(str.Draw(t, "source")),
				Effect: EffectFact(str.Draw(t, "effect")), DetailDigest: digest.Draw(t, "detail"), ObservedAt: when.Draw(t, "observed")}
			check(t, c, generalDigest(t, c, "attempt_id", "detail"))
		})
	})
	t.Run("texts", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			s := str.Draw(t, "text")
			want := Digest("")
			if s != "" {
				var err error
				if want, err = DigestOf(s); err != nil {
					t.Fatal(err)
				}
			}
			if got := TextDigest(s); got != want {
				t.Fatalf("TextDigest(%q) = %s, want %s", s, got, want)
			}
			e := &AttemptError{Code: str.Draw(t, "code"), Message: s}
			if want := treeDigestGeneral(t, map[string]any{"code": e.Code, "message": e.Message}); ErrorDigest(e) != want {
				t.Fatalf("ErrorDigest(%+v) = %s, want %s", e, ErrorDigest(e), want)
			}
		})
	})
}

// TestActionContentWithoutGateKeepsItsDigest: an action without a gate
// (recorded before the gate was audited) has the content digest it had
// then, which events written by older builds bound: the digest below was
// taken before actions had a gate.
func TestActionContentWithoutGateKeepsItsDigest(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	c := ActionContent{ID: "act_1", RunID: "run_1", Seq: 1, Tool: "cards.write", ToolVersion: "1", Effect: EffectWrite,
		State: ActionSucceeded, ActionDigest: "sha256:aa", DedupKey: "run_1/act_1", ArgumentsDigest: docDigest([]byte(`{"a":1}`)),
		CreatedAt: at, UpdatedAt: at.Add(time.Second)}
	const before = Digest("sha256:9d7fe0d486947b625154e0b5b90051ca1b3d3e6f341ab0b828b7d8526f06606d")
	require.Equal(t, before, c.Digest())
	rule := int64(0)
	c.Gate = &GateContent{Decision: ActionApproved, Rule: &rule, Reason: "rule 0: cards.write is auto-approved", RulesDigest: "sha256:bb"}
	require.NotEqual(t, before, c.Digest(), "the gate enters the digest")
}

// TestHeadSignatureMessageIsJCS: what a head signature signs is the
// canonical JSON of the head and its purpose.
func TestHeadSignatureMessageIsJCS(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := &HeadSignature{RunID: RunID(rapid.String().Draw(t, "run")), Seq: rapid.Int64().Draw(t, "seq"),
			Hash: rapid.String().Draw(t, "hash"), SignedAt: time.UnixMicro(rapid.Int64Range(0, 1<<52).Draw(t, "us")).UTC()}
		want, err := CanonicalJSON(map[string]any{"hash": h.Hash, "purpose": headSignaturePurpose, "run_id": h.RunID,
			"seq": h.Seq, "signed_at": h.SignedAt})
		if err != nil {
			t.Fatal(err)
		}
		if got := h.Message(); string(got) != string(want) {
			t.Fatalf("message %s, want %s", got, want)
		}
	})
}
