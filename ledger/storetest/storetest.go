package storetest

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
)

// Harness is what a driver supplies to run the suite.
type Harness struct {
	// Name names the driver in messages ("sqlite", "postgres").
	Name string
	// Open makes a new, empty database, opens a Store on it with opts and
	// returns the Store and a handle on the same database; both are closed,
	// and the database removed, when tb ends. An error opening the Store is
	// returned as the Store returned it (a *ledger.Error): the suite checks
	// some of them. The suite may Close the Store itself before tb ends;
	// the cleanup's second Close must not panic (its error is ignored).
	Open func(tb testing.TB, opts Options) (ledger.Store, DB, error)
	// PropertySteps bounds the operations of one iteration of the property
	// test (TestConformance/InvariantsProperty); 0 means 50. A driver
	// whose round trips make the default too slow under -race may lower
	// it. The number of iterations is rapid's (-rapid.checks, 100 by
	// default), the same for every driver.
	PropertySteps int
}

// Options are what the suite asks of a Store it opens. Zero fields mean
// the driver's defaults.
type Options struct {
	// Now is the Store's clock; the suite passes a fake one it moves.
	Now func() time.Time
	// NewID makes identifiers; nil means the driver's default (prefixed
	// ULIDs), which several Stores on one database must not collide on.
	NewID ledger.NewIDFunc
	// SigningKey, if set, signs each run's chain head (ledger's
	// signing.go); a malformed one must be refused with CodeInvalid.
	SigningKey ed25519.PrivateKey
	// Observe is the Store's observation hook (ledger.Options.Observe):
	// the driver's OpenStore must pass it on. The suite sets it on every
	// Store it opens, and checks, once every test has passed, that each
	// operation of the Store was observed (observe.go).
	Observe ledger.ObserveFunc
}

// DB is the database a Store of the suite runs on, for what the Store's
// methods cannot do: another Store on the same database, and SQL beside
// the Store, as someone with database access could run it. Exec, Query,
// Tables and DropAppendOnly run on a connection of their own, not one of
// the Store's, closed when the test ends.
type DB struct {
	// Open opens another Store on the same database with opts, as a
	// restarted or second process would, and closes it when tb ends.
	Open func(tb testing.TB, opts Options) (ledger.Store, error)
	// Exec runs one statement written with ? placeholders.
	Exec func(ctx context.Context, query string, args ...any) error
	// Query runs a query written with ? placeholders; the caller closes
	// the rows.
	Query func(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	// Tables lists every table of the database (GORM:
	// Migrator().GetTables()).
	Tables func(ctx context.Context) ([]string, error)
	// DropAppendOnly removes whatever makes the database refuse UPDATE and
	// DELETE on events and observations (SQLite: the triggers
	// events_no_update, events_no_delete, observations_no_update and
	// observations_no_delete), as someone with write access to the
	// database could. The tamper tests call it, edit rows through Exec and
	// expect the hash chain to catch the edit. Until it is called, such an
	// UPDATE or DELETE must fail with an error that says "append-only".
	DropAppendOnly func(ctx context.Context) error
}

// test is one conformance test.
type test struct {
	name string
	run  func(t *testing.T, h Harness)
}

// tests are the suite, in the order Run runs them.
var tests = []test{
	{"SubmitRun", testSubmitRun},
	{"SubmitRunRace", testSubmitRunRace},
	{"SubmitRequestIdentity", testSubmitRequestIdentity},
	{"SubmitPendingApprovalsCap", testSubmitPendingApprovalsCap},
	{"CreateAction", testCreateAction},
	{"CreateActionAndStart", testCreateActionAndStart},
	{"CreateActionGateAudit", testCreateActionGateAudit},
	{"WriteResultsAreRows", testWriteResultsAreRows},
	{"DecideApproval", testDecideApproval},
	{"Attempts", testAttempts},
	{"StoreRunTransitions", testStoreRunTransitions},
	{"StoreActionTransitions", testStoreActionTransitions},
	{"StoreAttemptTransitions", testStoreAttemptTransitions},
	{"StoreApprovalTransitions", testStoreApprovalTransitions},
	{"StoreCancellationTransitions", testStoreCancellationTransitions},
	{"RequestCancel", testRequestCancel},
	{"SettleCancellations", testSettleCancellations},
	{"RecordRecovery", testRecordRecovery},
	{"RecordRecoveryFromFacts", testRecordRecoveryFromFacts},
	{"FindRecoveryFacts", testFindRecoveryFacts},
	{"EventsAppendOnly", testEventsAppendOnly},
	{"VerifyChainDetectsTampering", testVerifyChainDetectsTampering},
	{"FindChainEvents", testFindChainEvents},
	{"FindEventsAfter", testFindEventsAfter},
	{"VerifyChainDetectsRowEdits", testVerifyChainDetectsRowEdits},
	{"VerifyChainDetectsMissingAndExtraRows", testVerifyChainDetectsMissingAndExtraRows},
	{"VerifyChainLegacyRows", testVerifyChainLegacyRows},
	{"EventBindsRowsInItsHash", testEventBindsRowsInItsHash},
	{"SignedHeads", testSignedHeads},
	{"SigningKeyNotStored", testSigningKeyNotStored},
	{"CountByState", testCountByState},
	{"Regressions", testRegressions},
	{"SettleReviewIsOneTransaction", testSettleReviewIsOneTransaction},
	{"RunLeases", testRunLeases},
	{"ProbeWrite", testProbeWrite},
	{"RuleSets", testRuleSets},
	{"StaleApproval", testStaleApproval},
	{"AttemptLeases", testAttemptLeases},
	{"ObservedWrites", testObservedWrites},
	{"InvariantsProperty", testInvariantsProperty},
}

// Run runs every conformance test against the driver h as a subtest of t.
// The driver conforms if all of them pass.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		t.Fatalf("storetest: harness %q has no Open", h.Name)
	}
	seen := observeAll(&h)
	var passed atomic.Int64
	t.Cleanup(func() {
		if int(passed.Load()) == len(tests) {
			checkEveryOpObserved(t, seen)
		}
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, h)
			if !t.Failed() {
				passed.Add(1) // not reached when it skipped or stopped
			}
		})
	}
}

// bundle is a Store opened by the harness, with its clock and database.
type bundle struct {
	Store ledger.Store
	Clock *ledgertest.Clock
	DB    DB
}

// openStore opens a Store on a new database with a fake clock and the
// driver's ids.
func openStore(t testing.TB, h Harness) *bundle {
	t.Helper()
	return openWith(t, h, Options{}, ledgertest.NewClock())
}

// openWith opens a Store on a new database with opts, whose clock is set
// to clock's.
func openWith(t testing.TB, h Harness, opts Options, clock *ledgertest.Clock) *bundle {
	t.Helper()
	opts.Now = clock.Now
	s, db, err := h.Open(t, opts)
	if err != nil {
		t.Fatalf("%s: open store: %v", h.Name, err)
	}
	return &bundle{Store: s, Clock: clock, DB: db}
}

// reopen opens another Store on b's database, on b's clock, with the
// driver's ids (so the two never collide).
func (b *bundle) reopen(t testing.TB, opts Options) ledger.Store {
	t.Helper()
	opts.Now = b.Clock.Now
	s, err := b.DB.Open(t, opts)
	if err != nil {
		t.Fatalf("reopen store: %v", err)
	}
	return s
}

// SubmitRun submits a run with a fresh key and default content.
func (b *bundle) SubmitRun(t testing.TB, key string, budgets ledger.BudgetLimits) *ledger.Run {
	t.Helper()
	return ledgertest.SubmitRun(t, b.Store, key, budgets)
}

// RunningRun submits a run and moves it to running.
func (b *bundle) RunningRun(t testing.TB, key string, budgets ledger.BudgetLimits) *ledger.Run {
	t.Helper()
	return ledgertest.RunningRun(t, b.Store, key, budgets)
}

// Action records a cards.write action on run with the given gate.
func (b *bundle) Action(t testing.TB, run ledger.RunID, key string, gate ledger.ActionState) ledger.CreateActionResult {
	t.Helper()
	return ledgertest.Action(t, b.Store, run, key, gate)
}

// exec runs q on db, failing the test if it fails. Arguments of a string
// kind (the ledger's typed ids) are passed as plain strings, so that no
// driver's parameter encoding has to know the ledger's types.
func exec(t testing.TB, db DB, q string, args ...any) {
	t.Helper()
	plain := make([]any, len(args))
	for i, a := range args {
		plain[i] = a
		if v := reflect.ValueOf(a); v.Kind() == reflect.String {
			plain[i] = v.String()
		}
	}
	if err := db.Exec(context.Background(), q, plain...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// LegacyCancellation writes, with SQL beside the Store, the row an older
// build could leave behind (ledgertest.InsertLegacyCancellation) and
// returns its id.
func (b *bundle) LegacyCancellation(t testing.TB, run ledger.RunID, state ledger.CancellationState) ledger.CancellationID {
	t.Helper()
	return ledgertest.InsertLegacyCancellation(t, b.DB.sql(), b.Clock.Now, run, state)
}

// columnsHolding returns every table.column of db (sorted) that holds s
// in some row, whatever wrote it.
func columnsHolding(t testing.TB, db DB, s string) []string {
	t.Helper()
	return ledgertest.ColumnsIn(t, db.sql(), s)
}

// sql is db's raw access in the form ledgertest's helpers take.
func (db DB) sql() ledgertest.SQL {
	return ledgertest.SQL{Exec: db.Exec, Query: db.Query, Tables: db.Tables}
}
