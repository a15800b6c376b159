package postgres_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for raw checks
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

// t0 is the fixtures' time: microseconds, UTC.
var t0 = time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC)

// fixture is a driver on a fresh schema and a raw connection pool on the
// same schema, to check what the driver stored.
type fixture struct {
	dsn string
	d   *postgres.Driver
	raw *sql.DB
}

// open opens a driver on a fresh schema (pgtest.NewSchema); cfg's DSN is
// filled in.
func open(t *testing.T, cfg ...postgres.Config) *fixture {
	t.Helper()
	dsn := pgtest.NewSchema(t)
	return openOn(t, dsn, cfg...)
}

func openOn(t *testing.T, dsn string, cfg ...postgres.Config) *fixture {
	t.Helper()
	var c postgres.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.DSN = dsn
	d, err := postgres.Open(context.Background(), c)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	return &fixture{dsn: dsn, d: d, raw: raw}
}

// write runs fn in one write transaction, which must commit.
func (f *fixture) write(t *testing.T, fn func(ledger.Tx) error) {
	t.Helper()
	require.NoError(t, f.d.Write(context.Background(), fn))
}

// count is SELECT COUNT(*) FROM table, raw.
func (f *fixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, f.raw.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

func digest(s string) ledger.Digest {
	sum := sha256.Sum256([]byte(s))
	return ledger.Digest("sha256:" + hex.EncodeToString(sum[:]))
}

func hexHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// newRun is a queued run with a budget whose every field is set.
func newRun(id string) *ledger.Run {
	deadline := t0.Add(time.Hour)
	return &ledger.Run{
		ID: ledger.RunID(id), Tenant: "acme", IdempotencyKey: "key-" + id, RequestDigest: digest(id),
		SubmittedBy: "alice", Agent: "support", Input: json.RawMessage(`{"ticket":7}`), State: ledger.RunQueued,
		Version: 1, CreatedAt: t0, UpdatedAt: t0,
		Budget: ledger.Budget{
			Limits: ledger.BudgetLimits{MaxAttemptsPerAction: 3, MaxAttemptsPerRun: 10, MaxExecution: 90 * time.Second,
				MaxSteps: 20, MaxTokens: 5000, DeadlineAfter: time.Hour},
			Deadline: &deadline,
			Used: ledger.BudgetUsage{Attempts: 1, Execution: 1500 * time.Microsecond, Steps: 2, Tokens: 300,
				TokensUnavailable: true},
		},
	}
}

// newAction is a proposed action of run with a gate audit.
func newAction(id, run string, seq int64) *ledger.Action {
	return &ledger.Action{
		ID: ledger.ActionID(id), RunID: ledger.RunID(run), Tenant: "acme", Seq: seq, IdempotencyKey: "step-" + id,
		Tool: "cards.write", ToolVersion: "1.0", Effect: ledger.EffectWrite, Arguments: json.RawMessage(`{"card":1}`),
		ActionDigest: digest(id), DedupKey: ledger.DedupKeyFor(ledger.RunID(run), ledger.ActionID(id)),
		State: ledger.ActionProposed, Version: 1, CreatedAt: t0, UpdatedAt: t0,
		Gate: &ledger.ActionGate{Decision: ledger.ActionApproved, Rule: 2, Reason: "rule 2: auto", RulesDigest: digest("rules")},
	}
}

// newAttempt is a started attempt.
func newAttempt(id, action, run string, no int64) *ledger.Attempt {
	return &ledger.Attempt{
		ID: ledger.AttemptID(id), ActionID: ledger.ActionID(action), RunID: ledger.RunID(run), No: no,
		Status: ledger.AttemptStarted, Effect: ledger.EffectUnknown, Version: 1, StartedAt: t0,
	}
}

// seed writes a run, an action of it and a started attempt of that action:
// run_1, act_1, att_1.
func (f *fixture) seed(t *testing.T) {
	t.Helper()
	f.write(t, func(tx ledger.Tx) error {
		ctx := context.Background()
		if err := tx.InsertRun(ctx, newRun("run_1")); err != nil {
			return err
		}
		if err := tx.InsertAction(ctx, newAction("act_1", "run_1", 1)); err != nil {
			return err
		}
		return tx.InsertAttempt(ctx, newAttempt("att_1", "act_1", "run_1", 1))
	})
}

// requireCode fails unless err is a *ledger.Error with code.
func requireCode(t *testing.T, code ledger.ErrorCode, err error) {
	t.Helper()
	require.Error(t, err)
	var e *ledger.Error
	require.ErrorAs(t, err, &e, "every error the driver returns is a *ledger.Error: %v", err)
	require.Equal(t, code, e.Code, "%v", err)
}
