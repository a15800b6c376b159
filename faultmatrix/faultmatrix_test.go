package faultmatrix_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/faultmatrix"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
	"github.com/stretchr/testify/require"
)

// TestMain removes the binaries the package's tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	binMu  sync.Mutex
	binDir string                 // holds every binary built, removed by TestMain
	bins   = map[string]*binary{} // by the build's extra flags
)

// binary is one build of the ledger binary, made once for the package.
type binary struct {
	once sync.Once
	path string
	err  error
}

// build returns the ledger binary built with args (extra go build flags,
// such as -tags faultmatrix_broken), compiling it the first time a test of
// the package asks for that build. The runner itself builds nothing; its
// tests do, as a user does before `ledger faultmatrix run`.
func build(t *testing.T, args ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	binMu.Lock()
	if binDir == "" {
		dir, err := os.MkdirTemp("", "ledger-faultmatrix-bin-")
		if err != nil {
			binMu.Unlock()
			t.Fatal(err)
		}
		binDir = dir
	}
	key := strings.Join(args, " ")
	b, ok := bins[key]
	if !ok {
		b = &binary{path: filepath.Join(binDir, fmt.Sprintf("ledger-%d", len(bins)))}
		bins[key] = b
	}
	binMu.Unlock()
	b.once.Do(func() {
		cmd := exec.Command("go", append(append([]string{"build", "-o", b.path}, args...), "../cmd/ledger")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %w\n%s", key, err, out)
		}
	})
	require.NoError(t, b.err)
	return b.path
}

func TestCatalogue(t *testing.T) {
	all := faultmatrix.Catalogue()
	names := map[string]bool{}
	for _, sc := range all {
		require.False(t, names[sc.Name], "duplicate scenario %s", sc.Name)
		names[sc.Name] = true
	}
	require.GreaterOrEqual(t, len(all), 32+10)
	for _, want := range []string{"crash/awaiting_approval", "crash/during_cancellation", "store_write_error", "tool_timeout",
		"tool_error_then_retry", "duplicate_concurrent_submit", "conflicting_key_reuse", "stale_digest_approval",
		"budget_exhausted_across_restarts", "event_edited_in_database"} {
		require.True(t, names[want], "catalogue lacks %s", want)
	}
	require.Len(t, faultmatrix.Select("crash/after_tool_call", 1), 8, "a prefix selects a family")
	require.Len(t, faultmatrix.Select("budget", 1), 6, "time budgets: two budgets, three crashes each")
	require.Len(t, faultmatrix.Select("client", 1), 32, "client-driven: four attempt points, eight guarantee combinations")
	require.GreaterOrEqual(t, len(faultmatrix.Select("client-server-kill", 1)), 2, "the server killed under a client")
	gone := faultmatrix.Select("client-gone/agent", 1)
	require.Len(t, gone, 4, "an agent that never comes back: one cell per decision told to a client, and none")
	var told []contracts.Guarantees
	for _, sc := range gone {
		told = append(told, sc.Guarantees)
	}
	require.ElementsMatch(t, []contracts.Guarantees{{Query: true}, {Dedup: true}, {Cancel: true}, {}}, told,
		"query, resend and cancel unanswered, and a tool with no guarantee")
	require.Len(t, faultmatrix.Select("client-gone/server-kill", 1), 1, "the server killed and restarted once, no agent")
	require.Len(t, faultmatrix.Select("client-read", 1), 2, "a client read interrupted: the agent killed, the server killed")
	require.Len(t, faultmatrix.Select("replica/kill", 1), 12, "replicas killed: 2 and 3 replicas, four points, and two without guarantees")
	require.Len(t, faultmatrix.Select("replica/stop", 1), 5, "a replica frozen at each attempt point, and between its lease check and its call")
	a, b := faultmatrix.Select("", 7), faultmatrix.Select("", 7)
	for i := range a {
		require.Equal(t, a[i].Name, b[i].Name, "the same seed gives the same order")
	}
}

// TestMatrixCatchesABrokenEngine proves the matrix can fail: a test build
// of the engine that calls the tool before recording the attempt, or that
// resends effects it cannot know, or of the simulator that writes whatever
// fencing token a call carries, makes the named scenarios fail.
func TestMatrixCatchesABrokenEngine(t *testing.T) {
	t.Parallel()
	bin := build(t, "-tags", "faultmatrix_broken")
	for mode, scenario := range map[string]string{
		"call_before_record": "crash/after_tool_call/noquery-nodedup-nocancel",
		"retry_unknown":      "crash/after_tool_call/noquery-nodedup-cancel",
		"no_fencing":         "replica/stop/2/before_tool_call/query-nodedup-cancel",
	} {
		t.Run(mode, func(t *testing.T) {
			rep, err := faultmatrix.Run(context.Background(), faultmatrix.Options{Binary: bin, Filter: scenario,
				Env: []string{"LEDGER_BROKEN=" + mode}})
			require.NoError(t, err)
			if rep.Skipped == 1 {
				t.Skip(rep.Scenarios[0].Skipped)
			}
			require.Equal(t, 1, rep.Failed, "the broken engine passed %s", scenario)
			failures := strings.Join(rep.Scenarios[0].Failures, "; ")
			t.Logf("%s failed, as it must: %s", scenario, failures)
			dropKept(t, rep.Scenarios[0].Failures)
			require.Contains(t, failures, "effects", "the failure is about effects: %s", failures)
		})
	}
}

// dropKept drops the database a replica cell that failed kept (its last
// failure names it), once the test no longer needs it: the failure was
// expected.
func dropKept(t *testing.T, failures []string) {
	t.Helper()
	const kept = "database kept: "
	for _, f := range failures {
		if shown, ok := strings.CutPrefix(f, kept); ok {
			u, err := url.Parse(shown)
			require.NoError(t, err)
			require.NoError(t, postgres.DropDatabase(context.Background(), faultmatrix.PostgresServer(""), strings.TrimPrefix(u.Path, "/")))
		}
	}
}

// TestClientMatrixSkipsWithoutPython: without an interpreter the client
// cells are skipped with the reason, neither passed nor failed.
func TestClientMatrixSkipsWithoutPython(t *testing.T) {
	rep, err := faultmatrix.Run(context.Background(), faultmatrix.Options{Binary: "faultmatrix_test.go",
		Filter: "client/after_tool_call", Python: "no-such-python3"})
	require.NoError(t, err)
	require.Equal(t, 8, rep.Total)
	require.Equal(t, 8, rep.Skipped)
	require.Zero(t, rep.Passed+rep.Failed)
	require.Contains(t, rep.Scenarios[0].Skipped, "no-such-python3 not found")
	var buf bytes.Buffer
	require.NoError(t, rep.WriteTable(&buf))
	require.Contains(t, buf.String(), "0 passed, 0 failed, 8 skipped")
	doc, err := json.Marshal(rep)
	require.NoError(t, err)
	require.NoError(t, faultmatrix.ValidateReport(doc))
}

// TestReplicaMatrixSkipsWithoutPostgres: where no PostgreSQL server
// answers, the replica cells are skipped with the reason, neither passed
// nor failed.
func TestReplicaMatrixSkipsWithoutPostgres(t *testing.T) {
	rep, err := faultmatrix.Run(context.Background(), faultmatrix.Options{Binary: "faultmatrix_test.go",
		Filter: "replica/kill/2", Postgres: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"})
	require.NoError(t, err)
	require.Equal(t, 6, rep.Total)
	require.Equal(t, 6, rep.Skipped)
	require.Zero(t, rep.Passed+rep.Failed)
	require.Contains(t, rep.Scenarios[0].Skipped, "no PostgreSQL server at postgres://postgres@127.0.0.1:1/postgres")
	doc, err := json.Marshal(rep)
	require.NoError(t, err)
	require.NoError(t, faultmatrix.ValidateReport(doc))
}

// envReport names a file TestMatrix writes its report to, as
// `ledger faultmatrix run --report` does: CI reads it to check which cells
// ran.
const envReport = "LEDGER_FAULTMATRIX_REPORT"

// TestMatrix runs the whole fault matrix against the real binary: every
// cell of the catalogue, once, and this is the one full run of CI (`make
// test`). No cell may fail. The engine cells never skip; the client cells
// skip only without python3, and the replica cells only without the test
// PostgreSQL server, when they fail instead if
// LEDGER_TEST_POSTGRES_REQUIRED is set (as pgtest's tests do).
func TestMatrix(t *testing.T) {
	t.Parallel()
	bin := build(t)
	rep, err := faultmatrix.Run(context.Background(), faultmatrix.Options{Binary: bin, Progress: t.Output()})
	require.NoError(t, err)
	doc, err := json.MarshalIndent(rep, "", "  ")
	require.NoError(t, err)
	require.NoError(t, faultmatrix.ValidateReport(doc))
	if path := os.Getenv(envReport); path != "" {
		require.NoError(t, os.WriteFile(path, doc, 0o644))
	}
	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	require.Equal(t, len(faultmatrix.Catalogue()), rep.Total, "every cell of the catalogue")
	require.Zero(t, rep.Failed, "%s", table.String())
	require.Contains(t, table.String(), fmt.Sprintf("%d passed, 0 failed", rep.Passed))

	pgRequired := os.Getenv(pgtest.EnvRequired) != "" && os.Getenv(pgtest.EnvRequired) != "0"
	cells := map[string]faultmatrix.Result{}
	for _, r := range rep.Scenarios {
		cells[r.Name] = r
		if r.Skipped == "" {
			continue
		}
		t.Logf("skipped %s: %s", r.Name, r.Skipped)
		switch {
		case strings.HasPrefix(r.Name, "replica/"):
			require.False(t, pgRequired, "%s is set and %s skipped: %s", pgtest.EnvRequired, r.Name, r.Skipped)
		case strings.HasPrefix(r.Name, "client"):
			require.Contains(t, r.Skipped, "python", "a client cell skips only without Python")
		default:
			require.Fail(t, "an engine cell skipped", "%s: %s", r.Name, r.Skipped)
		}
	}

	// A replica killed mid-call and one frozen after its tool acted: a
	// survivor recovered the struck attempt of a burst of runs.
	for _, name := range []string{"replica/kill/2/after_tool_call/noquery-nodedup-nocancel",
		"replica/stop/2/after_tool_call/query-nodedup-cancel"} {
		r, ok := cells[name]
		require.True(t, ok, "the catalogue lacks %s", name)
		if r.Skipped != "" {
			continue
		}
		require.Equal(t, 2, r.Observed.Replicas, name)
		require.GreaterOrEqual(t, r.Observed.Runs, 3, "%s: a burst's runs at least, as the cell's own check asks", name)
		require.Positive(t, r.Observed.Interrupted, "%s: a survivor recovered the struck attempt", name)
	}
}
