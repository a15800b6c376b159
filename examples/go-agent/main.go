// Command go-agent is an agent that embeds the ledger as a Go library: its
// own model and its own write tool, with the ledger's store, approval
// gate, engine and recovery wired in a few lines, without the ledger's
// command or HTTP server.
//
// The tool appends a note to its own SQLite file, once per dedup key, so
// its effects can be counted apart from the ledger; it refuses a call whose
// fencing token is older than one it has seen for the run (a process that
// lost the run to another). Writes need a
// person's approval; here an "operator" principal approves the exact
// digest the ledger shows (in a real deployment a person does, through the
// HTTP API or `ledger approve`).
//
//	go run ./examples/go-agent --db agent.db --effects notes.db --key note-1 --text "hello"
//
// Run it again with the same key: the ledger resolves it to the same run,
// and the note is not written twice.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"time"

	_ "github.com/mattn/go-sqlite3" // the notes tool's own store

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
)

func main() {
	var o options
	flag.StringVar(&o.DB, "db", "agent.db", "the ledger's SQLite file")
	flag.StringVar(&o.Effects, "effects", "notes.db", "the notes tool's own SQLite file")
	flag.StringVar(&o.Key, "key", "note-1", "the run's idempotency key")
	flag.StringVar(&o.Text, "text", "hello", "the note to append")
	flag.Parse()
	run, err := runAgent(context.Background(), o)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s %s\n", run.ID, run.State, run.StopReason)
}

// options say where the agent keeps things and what it writes.
type options struct {
	DB, Effects, Key, Text string
	// Timeout bounds the whole run; 0 means 30s.
	Timeout time.Duration
}

// runAgent submits one run of the notes agent (or finds the run its key
// already made), approves its write as the operator, and waits for it to
// end.
func runAgent(ctx context.Context, o options) (*ledger.Run, error) {
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	notes, err := openNotes(o.Effects)
	if err != nil {
		return nil, err
	}
	defer notes.db.Close()
	store, err := sqlite.OpenStore(ctx, sqlite.Config{Path: o.DB})
	if err != nil {
		return nil, err
	}
	defer store.Close()

	// Writes of notes.append wait for a person; nothing else is declared.
	policy, err := approval.NewPolicy(&contracts.Rules{SchemaVersion: "1.0", Rules: []contracts.Rule{
		{Tool: "notes.append", Decision: contracts.RuleDecisionRequireApproval}}}, approval.Defaults{})
	if err != nil {
		return nil, err
	}
	tools := func(name string) (contracts.ToolDescriptor, bool) {
		d := notes.Descriptor()
		return d, name == d.Name
	}
	approvals := approval.NewService(store, policy, tools, approval.Options{})
	eng, err := engine.New(engine.Config{Store: store, Approvals: approvals, Agents: []engine.Agent{{
		Name:     "notes",
		NewModel: func(json.RawMessage) (engine.Model, error) { return notesModel{}, nil },
		Tools:    []engine.Tool{notes},
	}}})
	if err != nil {
		return nil, err
	}
	// After a crash, recovery decides what to do with what was in flight
	// before any new work starts.
	if _, err := eng.Recover(ctx); err != nil {
		return nil, err
	}
	eng.Start(ctx)
	defer eng.Stop()

	input, err := json.Marshal(map[string]string{"text": o.Text})
	if err != nil {
		return nil, err
	}
	sub, err := store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "default", Principal: "go-agent", IdempotencyKey: o.Key,
		Agent: "notes", Input: input})
	if err != nil {
		return nil, err
	}
	eng.Notify()
	for {
		run, err := store.FindRunByID(ctx, sub.Run.ID)
		if err != nil {
			return nil, err
		}
		switch {
		case run.State.Terminal():
			return run, nil
		case run.State == ledger.RunAwaitingApproval:
			if err := approveAll(ctx, store, approvals, run.ID); err != nil {
				return nil, err
			}
			eng.Notify()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("run %s is still %s: %w", run.ID, run.State, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// approveAll grants the run's pending approvals as the operator, each
// bound to the digest of the action it was opened for.
func approveAll(ctx context.Context, store ledger.Store, approvals *approval.Service, run ledger.RunID) error {
	pending := ledger.ApprovalPending
	list, err := store.FindApprovals(ctx, ledger.ApprovalFilter{RunID: &run, State: &pending})
	if err != nil {
		return err
	}
	for _, a := range list {
		_, err := approvals.Decide(ctx, approval.DecideParams{Tenant: "default", Principal: "operator", ActionID: a.ActionID,
			ActionDigest: a.ActionDigest, Decision: ledger.DecisionGrant, Reason: "the example approves its own note"})
		if err != nil && !errors.Is(err, ledger.ErrConflict) { // decided meanwhile
			return err
		}
	}
	return nil
}

// notesModel proposes one note, then ends the run.
type notesModel struct{}

// Next implements engine.Model: it decides from the history alone.
func (notesModel) Next(_ context.Context, h engine.History) (engine.Step, error) {
	if len(h.Entries) == 0 {
		var in struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(h.Input, &in); err != nil {
			return engine.Step{}, err
		}
		args, err := json.Marshal(map[string]string{"text": in.Text})
		if err != nil {
			return engine.Step{}, err
		}
		return engine.Step{Kind: engine.StepToolCall, Tool: "notes.append", Arguments: args}, nil
	}
	return engine.Step{Kind: engine.StepFinal, Final: json.RawMessage(`{"noted":true}`)}, nil
}

// notesTool appends notes to its own SQLite file, at most once per dedup
// key, and can say whether a key's note was written. It keeps the highest
// fencing token each run's calls carried, and writes nothing for a call
// that carries a lower one.
type notesTool struct{ db *sql.DB }

func openNotes(path string) (*notesTool, error) {
	// IMMEDIATE transactions: the fence check and the write hold the
	// file's write lock together.
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=5000&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS notes (dedup_key TEXT PRIMARY KEY, text TEXT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS fences (run_id TEXT PRIMARY KEY, token INTEGER NOT NULL)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			return nil, errors.Join(err, db.Close())
		}
	}
	return &notesTool{db: db}, nil
}

// Descriptor implements engine.Tool.
func (t *notesTool) Descriptor() contracts.ToolDescriptor {
	return contracts.ToolDescriptor{SchemaVersion: "1.0", Name: "notes.append", Version: "1", Effect: contracts.EffectWrite,
		ArgumentsSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","maxLength":1000}},"required":["text"],"additionalProperties":false}`),
		Guarantees:      contracts.Guarantees{Query: true, Dedup: true}, TimeoutMS: 5000}
}

// Execute implements engine.Tool: the note is written once per dedup key,
// and not at all for a call whose fencing token is older than one a call
// of the same run carried: in one transaction, the fence is checked and
// raised, and the note written.
func (t *notesTool) Execute(ctx context.Context, c engine.Call) (engine.Result, error) {
	var args struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c.Arguments, &args); err != nil {
		return engine.Result{}, &engine.ToolError{Code: "bad_arguments", Message: err.Error(), Effect: ledger.EffectNotHappened}
	}
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return engine.Result{}, err
	}
	defer func() { _ = tx.Rollback() }() // a no-op once committed
	// Token 0: a call made under no lease, which cannot be fenced.
	if c.FencingToken > 0 {
		var seen int64
		err := tx.QueryRowContext(ctx, `SELECT token FROM fences WHERE run_id = ?`, c.RunID).Scan(&seen)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return engine.Result{}, err
		}
		if seen > c.FencingToken {
			return engine.Result{}, &engine.ToolError{Code: "fenced", Effect: ledger.EffectNotHappened,
				Message: fmt.Sprintf("stale fencing token %d: run %s is held under token %d now", c.FencingToken, c.RunID, seen)}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO fences (run_id, token) VALUES (?, ?)
			ON CONFLICT (run_id) DO UPDATE SET token = excluded.token`, c.RunID, c.FencingToken); err != nil {
			return engine.Result{}, err
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO notes (dedup_key, text) VALUES (?, ?)`, c.DedupKey, args.Text); err != nil {
		return engine.Result{}, err
	}
	if err := tx.Commit(); err != nil {
		return engine.Result{}, err
	}
	return engine.Result{Output: json.RawMessage(`{"written":true}`), Effect: ledger.EffectHappened}, nil
}

// Query implements engine.Querier: did the note of a dedup key get written?
func (t *notesTool) Query(ctx context.Context, key string) (engine.QueryResult, error) {
	var n int
	if err := t.db.QueryRowContext(ctx, `SELECT count(*) FROM notes WHERE dedup_key = ?`, key).Scan(&n); err != nil {
		return engine.QueryResult{}, err
	}
	if n > 0 {
		return engine.QueryResult{Effect: ledger.EffectHappened}, nil
	}
	return engine.QueryResult{Effect: ledger.EffectNotHappened}, nil
}

// count is how many notes the tool's own file holds.
func (t *notesTool) count(ctx context.Context) (int, error) {
	var n int
	err := t.db.QueryRowContext(ctx, `SELECT count(*) FROM notes`).Scan(&n)
	return n, err
}
