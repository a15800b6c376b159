package postgres_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
)

// Round trips: every row type written by the Tx comes back from the
// Reader with every field as written, NULLs included, times in UTC.

func TestRunRoundTrip(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	full := newRun("run_1")
	full.EventSeq, full.EventHash = 4, "sha256:head"
	bare := newRun("run_2")
	bare.Budget = ledger.Budget{} // no limits, no deadline, nothing used
	bare.SubmittedBy = "bob"
	stopped := newRun("run_3")
	stopped.State, stopped.StopReason = ledger.RunStopped, ledger.StopReason("user_cancelled")
	f.write(t, func(tx ledger.Tx) error {
		for _, r := range []*ledger.Run{full, bare, stopped} {
			if err := tx.InsertRun(ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	for _, want := range []*ledger.Run{full, bare, stopped} {
		got, err := f.d.Reader().GetRun(ctx, want.ID)
		require.NoError(t, err)
		require.Equal(t, want, got)
		got, err = f.d.Reader().GetRunByRequest(ctx, want.Tenant, want.SubmittedBy, want.IdempotencyKey)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	var deadline *int64
	require.NoError(t, f.raw.QueryRow(`SELECT deadline_at FROM budgets WHERE run_id = 'run_2'`).Scan(&deadline))
	require.Nil(t, deadline, "no deadline is NULL")

	list, err := f.d.Reader().ListRuns(ctx, ledger.RunFilter{})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Run{full, bare, stopped}, list)

	tenant, alice, state := "acme", "alice", ledger.RunQueued
	after := ledger.RunID("run_1")
	for _, c := range []struct {
		f    ledger.RunFilter
		want []*ledger.Run
	}{
		{ledger.RunFilter{SubmittedBy: &alice}, []*ledger.Run{full, stopped}},
		{ledger.RunFilter{State: &state}, []*ledger.Run{full, bare}},
		{ledger.RunFilter{Tenant: &tenant, AfterID: &after}, []*ledger.Run{bare, stopped}},
		{ledger.RunFilter{Limit: 2}, []*ledger.Run{full, bare}},
		{ledger.RunFilter{NotAgents: []string{"support"}}, []*ledger.Run{}},
		{ledger.RunFilter{NotAgents: []string{"other"}}, []*ledger.Run{full, bare, stopped}},
	} {
		got, err := f.d.Reader().ListRuns(ctx, c.f)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%+v", c.f)
	}

	seq, hash, err := f.d.Reader().ChainHead(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, int64(4), seq)
	require.Equal(t, "sha256:head", hash)
}

func TestTimesComeBackInUTCMicroseconds(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	local := time.FixedZone("UTC+5", 5*3600)
	at := time.Date(2025, 6, 7, 8, 9, 10, 123456789, local) // nanoseconds, another zone
	r := newRun("run_1")
	r.CreatedAt, r.UpdatedAt, r.Budget.Deadline = at, at, nil
	f.write(t, func(tx ledger.Tx) error { return tx.InsertRun(ctx, r) })
	got, err := f.d.Reader().GetRun(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, time.UTC, got.CreatedAt.Location())
	require.Equal(t, at.UTC().Truncate(time.Microsecond), got.CreatedAt)
	var us int64
	require.NoError(t, f.raw.QueryRow(`SELECT created_at FROM runs`).Scan(&us))
	require.Equal(t, at.UnixMicro(), us, "stored as unix microseconds")
}

func TestActionRoundTrip(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	gated, _ := f.d.Reader().GetAction(ctx, "act_1")
	require.Equal(t, newAction("act_1", "run_1", 1), gated)

	bare := newAction("act_2", "run_1", 2)
	bare.Gate = nil
	bare.Supersedes = "act_1"
	defaultRule := newAction("act_3", "run_1", 3)
	defaultRule.Gate.Rule = -1
	defaultRule.Effect = ledger.EffectRead
	f.write(t, func(tx ledger.Tx) error {
		if err := tx.InsertAction(ctx, bare); err != nil {
			return err
		}
		return tx.InsertAction(ctx, defaultRule)
	})
	for _, want := range []*ledger.Action{bare, defaultRule} {
		got, err := f.d.Reader().GetAction(ctx, want.ID)
		require.NoError(t, err)
		require.Equal(t, want, got)
		got, err = f.d.Reader().GetActionByKey(ctx, want.RunID, want.IdempotencyKey)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	var gate, rules *string
	require.NoError(t, f.raw.QueryRow(`SELECT gate_decision, rules_digest FROM actions WHERE id = 'act_2'`).Scan(&gate, &rules))
	require.Nil(t, gate)
	require.Nil(t, rules)

	all, err := f.d.Reader().ListActions(ctx, ledger.ActionFilter{})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Action{gated, bare, defaultRule}, all)
	run, proposed := ledger.RunID("run_1"), ledger.ActionProposed
	limited, err := f.d.Reader().ListActions(ctx, ledger.ActionFilter{RunID: &run, State: &proposed, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Action{gated, bare}, limited)

	n, err := f.d.Reader().MaxActionSeq(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	n, err = f.d.Reader().MaxActionSeq(ctx, "run_none")
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = f.d.Reader().CountActions(ctx, "run_1", ledger.ActionProposed)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
}

func TestAttemptAndObservationRoundTrip(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	started, err := f.d.Reader().GetAttempt(ctx, "att_1")
	require.NoError(t, err)
	require.Equal(t, newAttempt("att_1", "act_1", "run_1", 1), started)

	obs := &ledger.Observation{ID: "obs_1", RunID: "run_1", ActionID: "act_1", AttemptID: "att_1",
		Source: ledger.ObservedQuery, Effect: ledger.EffectHappened, Detail: json.RawMessage(`{"seen":true}`), ObservedAt: t0}
	loose := &ledger.Observation{ID: "obs_0", RunID: "run_1", ActionID: "act_1", Source: ledger.ObservedPerson,
		Effect: ledger.EffectUnknown, ObservedAt: t0.Add(-time.Second)}
	finished := newAttempt("att_2", "act_1", "run_1", 2)
	end := t0.Add(time.Minute)
	finished.Status, finished.Effect, finished.EffectObservation = ledger.AttemptFailed, ledger.EffectHappened, "obs_1"
	finished.Result = json.RawMessage(`{"ok":false}`)
	finished.Error = &ledger.AttemptError{Code: "tool_error", Message: "it broke"}
	finished.FinishedAt = &end
	finished.Version = 3
	f.write(t, func(tx ledger.Tx) error {
		if err := tx.InsertObservation(ctx, obs); err != nil {
			return err
		}
		if err := tx.InsertObservation(ctx, loose); err != nil {
			return err
		}
		return tx.InsertAttempt(ctx, finished)
	})
	got, err := f.d.Reader().GetAttempt(ctx, "att_2")
	require.NoError(t, err)
	require.Equal(t, finished, got)
	var errText string
	require.NoError(t, f.raw.QueryRow(`SELECT error FROM attempts WHERE id = 'att_2'`).Scan(&errText))
	require.JSONEq(t, `{"code":"tool_error","message":"it broke"}`, errText)

	last, err := f.d.Reader().LastAttempt(ctx, "act_1")
	require.NoError(t, err)
	require.Equal(t, finished, last)
	list, err := f.d.Reader().ListAttempts(ctx, ledger.AttemptFilter{})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Attempt{started, finished}, list)
	status := ledger.AttemptStarted
	list, err = f.d.Reader().ListAttempts(ctx, ledger.AttemptFilter{Status: &status})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Attempt{started}, list)

	all, err := f.d.Reader().ListObservations(ctx, ledger.ObservationFilter{})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Observation{loose, obs}, all, "in time order")
	run, att := ledger.RunID("run_1"), ledger.AttemptID("att_1")
	byAttempt, err := f.d.Reader().ListObservations(ctx, ledger.ObservationFilter{RunID: &run, AttemptID: &att})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Observation{obs}, byAttempt)
}

func TestApprovalRoundTrip(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	exp := t0.Add(time.Hour)
	pending := &ledger.Approval{ID: "apr_1", ActionID: "act_1", RunID: "run_1", Tenant: "acme", ActionDigest: digest("act_1"),
		State: ledger.ApprovalPending, Version: 1, RequestedAt: t0, ExpiresAt: &exp}
	decided := &ledger.Approval{ID: "apr_0", ActionID: "act_1", RunID: "run_1", Tenant: "acme", ActionDigest: digest("act_1"),
		State: ledger.ApprovalDenied, DecidedBy: "carol", Reason: "no", Version: 2, RequestedAt: t0, DecidedAt: &t0}
	f.write(t, func(tx ledger.Tx) error {
		if err := tx.InsertApproval(ctx, pending); err != nil {
			return err
		}
		return tx.InsertApproval(ctx, decided)
	})
	got, err := f.d.Reader().GetApproval(ctx, "apr_1")
	require.NoError(t, err)
	require.Equal(t, pending, got)
	got, err = f.d.Reader().PendingApproval(ctx, "act_1")
	require.NoError(t, err)
	require.Equal(t, pending, got)
	got, err = f.d.Reader().GetApproval(ctx, "apr_0")
	require.NoError(t, err)
	require.Equal(t, decided, got)

	list, err := f.d.Reader().ListApprovals(ctx, ledger.ApprovalFilter{})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Approval{decided, pending}, list, "in id order")
	after, state := ledger.ApprovalID("apr_0"), ledger.ApprovalPending
	list, err = f.d.Reader().ListApprovals(ctx, ledger.ApprovalFilter{AfterID: &after})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Approval{pending}, list)
	list, err = f.d.Reader().ListApprovals(ctx, ledger.ApprovalFilter{State: &state, Limit: 5})
	require.NoError(t, err)
	require.Equal(t, []*ledger.Approval{pending}, list)

	n, err := f.d.Reader().CountPendingApprovals(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	due, err := f.d.Reader().ListDueApprovals(ctx, exp.Add(-time.Microsecond))
	require.NoError(t, err)
	require.Empty(t, due)
	due, err = f.d.Reader().ListDueApprovals(ctx, exp)
	require.NoError(t, err)
	require.Equal(t, []*ledger.Approval{pending}, due, "due at its expiry")
}

func TestCancellationRoundTrip(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	r2 := newRun("run_2")
	r2.IdempotencyKey = "other"
	t1, t2, t3 := t0.Add(time.Second), t0.Add(2*time.Second), t0.Add(3*time.Second)
	requested := &ledger.Cancellation{ID: "cnc_1", RunID: "run_1", Tenant: "acme", State: ledger.CancelRequested,
		RequestedBy: "alice", Version: 1, RequestedAt: t0}
	stopped := &ledger.Cancellation{ID: "cnc_2", RunID: "run_2", Tenant: "acme", State: ledger.CancelStopped,
		RequestedBy: "bob", Reason: "enough", Version: 4, RequestedAt: t0, AcceptedAt: &t1, StoppingAt: &t2, StoppedAt: &t3}
	f.write(t, func(tx ledger.Tx) error {
		if err := tx.InsertRun(ctx, r2); err != nil {
			return err
		}
		if err := tx.InsertCancellation(ctx, requested); err != nil {
			return err
		}
		return tx.InsertCancellation(ctx, stopped)
	})
	for _, want := range []*ledger.Cancellation{requested, stopped} {
		got, err := f.d.Reader().GetCancellation(ctx, want.RunID)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	unsettled, err := f.d.Reader().ListUnsettledCancellations(ctx)
	require.NoError(t, err)
	require.Equal(t, []*ledger.Cancellation{requested}, unsettled)
}

func TestLeaseAndDecisionRoundTrip(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	l := &ledger.AttemptLease{AttemptID: "att_1", ActionID: "act_1", RunID: "run_1", BeginKey: "begin-1",
		TokenSHA256: hexHash("token"), Lease: 30 * time.Second, Until: t0.Add(30 * time.Second), MaxUntil: t0.Add(time.Hour)}
	f.write(t, func(tx ledger.Tx) error { return tx.InsertAttemptLease(ctx, l) })
	got, err := f.d.Reader().GetAttemptLease(ctx, "att_1")
	require.NoError(t, err)
	require.Equal(t, l, got)
	var progress, outcome *string
	require.NoError(t, f.raw.QueryRow(`SELECT progress, outcome FROM attempt_leases`).Scan(&progress, &outcome))
	require.Nil(t, progress)
	require.Nil(t, outcome)

	l.Until, l.Heartbeats, l.Progress = t0.Add(time.Minute), 2, json.RawMessage(`{"pct":50}`)
	l.OutcomeDigest, l.Outcome = digest("outcome"), json.RawMessage(`{"status":"succeeded"}`)
	f.write(t, func(tx ledger.Tx) error { return tx.UpdateAttemptLease(ctx, l) })
	got, err = f.d.Reader().GetAttemptLeaseByKey(ctx, "act_1", "begin-1")
	require.NoError(t, err)
	require.Equal(t, l, got)

	d := &ledger.AgentDecision{ActionID: "act_1", DecisionID: "dec_1", Kind: "query", DecidedAt: t0}
	f.write(t, func(tx ledger.Tx) error { return tx.PutAgentDecision(ctx, d) })
	gotD, err := f.d.Reader().GetAgentDecision(ctx, "act_1")
	require.NoError(t, err)
	require.Equal(t, d, gotD)
	// Put replaces.
	d2 := &ledger.AgentDecision{ActionID: "act_1", DecisionID: "dec_2", Kind: "resend", Answered: true, DecidedAt: t0.Add(time.Second)}
	f.write(t, func(tx ledger.Tx) error { return tx.PutAgentDecision(ctx, d2) })
	gotD, err = f.d.Reader().GetAgentDecision(ctx, "act_1")
	require.NoError(t, err)
	require.Equal(t, d2, gotD)
	require.Equal(t, 1, f.count(t, "agent_decisions"))
}

func TestListLapsedLeases(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	lease := func(att string, until time.Time) *ledger.AttemptLease {
		return &ledger.AttemptLease{AttemptID: ledger.AttemptID(att), ActionID: "act_1", RunID: "run_1", BeginKey: "b-" + att,
			TokenSHA256: hexHash(att), Lease: time.Second, Until: until, MaxUntil: until.Add(time.Hour)}
	}
	a1 := lease("att_1", t0.Add(2*time.Second))
	a2 := lease("att_2", t0.Add(time.Second))
	a3 := lease("att_3", t0.Add(time.Second)) // its attempt is finished
	a4 := lease("att_4", t0)                  // completed through its lease
	a4.OutcomeDigest, a4.Outcome = digest("o"), json.RawMessage(`{}`)
	f.write(t, func(tx ledger.Tx) error {
		for i, id := range []string{"att_2", "att_3", "att_4"} {
			a := newAttempt(id, "act_1", "run_1", int64(i+2))
			if id == "att_3" {
				a.Status, a.FinishedAt = ledger.AttemptSucceeded, &t0
			}
			if err := tx.InsertAttempt(ctx, a); err != nil {
				return err
			}
		}
		for _, l := range []*ledger.AttemptLease{a1, a2, a3, a4} {
			if err := tx.InsertAttemptLease(ctx, l); err != nil {
				return err
			}
		}
		return nil
	})
	got, err := f.d.Reader().ListLapsedLeases(ctx, t0.Add(time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, []*ledger.AttemptLease{a2, a1}, got, "by until")
	got, err = f.d.Reader().ListLapsedLeases(ctx, t0.Add(time.Hour), 1)
	require.NoError(t, err)
	require.Equal(t, []*ledger.AttemptLease{a2}, got)
	got, err = f.d.Reader().ListLapsedLeases(ctx, t0.Add(2*time.Second), 0)
	require.NoError(t, err)
	require.Equal(t, []*ledger.AttemptLease{a2}, got, "lapsed strictly before")
}

func TestEventAndSignatureRoundTrip(t *testing.T) {
	f := open(t)
	ctx := context.Background()
	f.seed(t)
	e1 := &ledger.Event{ID: "evt_1", RunID: "run_1", Seq: 1, Type: "run.queued", EntityType: "run", EntityID: "run_1",
		ToState: "queued", Actor: "alice", Data: json.RawMessage(`{"agent":"support"}`), CreatedAt: t0,
		PrevHash: "", Hash: "sha256:1", Format: 2, Rows: json.RawMessage(`{"run/run_1":"` + string(digest("r")) + `"}`)}
	e2 := &ledger.Event{ID: "evt_2", RunID: "run_1", Seq: 2, Type: "budget.usage", EntityType: "budget", EntityID: "run_1",
		CreatedAt: t0.Add(time.Second), PrevHash: "sha256:1", Hash: "sha256:2", Format: 1}
	sig := &ledger.HeadSignature{RunID: "run_1", Seq: 2, Hash: string(digest("head")), SignedAt: t0, KeyID: "0123456789abcdef",
		Signature: []byte{0, 1, 2, 255}}
	f.write(t, func(tx ledger.Tx) error {
		if err := tx.InsertEvent(ctx, e2); err != nil {
			return err
		}
		if err := tx.InsertEvent(ctx, e1); err != nil {
			return err
		}
		return tx.PutSignature(ctx, sig)
	})
	events, err := f.d.Reader().ListEvents(ctx, "run_1", 2)
	require.NoError(t, err)
	require.Equal(t, []*ledger.Event{e1, e2}, events, "in sequence order")
	var data *string
	require.NoError(t, f.raw.QueryRow(`SELECT data FROM events WHERE id = 'evt_2'`).Scan(&data))
	require.Nil(t, data)
	events, err = f.d.Reader().ListEvents(ctx, "run_none", 0)
	require.NoError(t, err)
	require.Empty(t, events)

	got, err := f.d.Reader().GetSignature(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, sig, got)
	sig2 := &ledger.HeadSignature{RunID: "run_1", Seq: 3, Hash: string(digest("head3")), SignedAt: t0.Add(time.Second),
		KeyID: "fedcba9876543210", Signature: []byte("another")}
	f.write(t, func(tx ledger.Tx) error { return tx.PutSignature(ctx, sig2) })
	got, err = f.d.Reader().GetSignature(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, sig2, got, "put replaces")
	require.Equal(t, 1, f.count(t, "chain_signatures"))
}

func TestJSONAndCanonicalBytesAreKeptExactly(t *testing.T) {
	// The chain hashes exact bytes: key order, spacing and number forms
	// come back as written (no jsonb normalisation).
	f := open(t)
	ctx := context.Background()
	r := newRun("run_1")
	r.Input = json.RawMessage(`{"z":1,"a":[1.0,2e3],  "s":"\u00e9"}`)
	f.write(t, func(tx ledger.Tx) error { return tx.InsertRun(ctx, r) })
	got, err := f.d.Reader().GetRun(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, string(r.Input), string(got.Input))
}
