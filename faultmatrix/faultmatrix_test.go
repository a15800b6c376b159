package faultmatrix_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/faultmatrix"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/stretchr/testify/require"
)

// build compiles the ledger binary (with extra flags) into a temp dir. The
// runner itself builds nothing; its tests do, like CI does before
// `ledger faultmatrix run`.
func build(t *testing.T, args ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	bin := filepath.Join(t.TempDir(), "ledger")
	cmd := exec.Command("go", append(append([]string{"build", "-o", bin}, args...), "../cmd/ledger")...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
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

// TestMatrixSmoke runs a few scenarios of each kind against the real
// binary; CI runs the whole matrix with `ledger faultmatrix run`.
func TestMatrixSmoke(t *testing.T) {
	bin := build(t)
	for _, name := range []string{"crash/after_tool_call/noquery-nodedup-nocancel", "crash/after_tool_call/query-nodedup-nocancel",
		"stale_digest_approval", "event_edited_in_database", "budget/max_execution/after_tool_call/noquery-dedup-nocancel"} {
		rep, err := faultmatrix.Run(context.Background(), faultmatrix.Options{Binary: bin, Filter: name})
		require.NoError(t, err)
		require.Equal(t, 1, rep.Total)
		require.Equal(t, 1, rep.Passed, "%s: %v", name, rep.Scenarios[0].Failures)
		var buf bytes.Buffer
		require.NoError(t, rep.WriteTable(&buf))
		require.Contains(t, buf.String(), "1 passed, 0 failed")
	}
}

// TestMatrixCatchesABrokenEngine proves the matrix can fail: a test build
// of the engine that calls the tool before recording the attempt, or that
// resends effects it cannot know, or of the simulator that writes whatever
// fencing token a call carries, makes the named scenarios fail.
func TestMatrixCatchesABrokenEngine(t *testing.T) {
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

// TestClientMatrixSmoke runs two client-driven cells against the real
// binary and a real Python agent: one the agent SIGKILLs itself in, one
// whose server is SIGKILLed; CI runs all of them with `ledger faultmatrix run`.
func TestClientMatrixSmoke(t *testing.T) {
	bin := build(t)
	for _, name := range []string{"client/after_tool_call/noquery-nodedup-nocancel",
		"client-server-kill/after_attempt_recorded/query-dedup-cancel"} {
		rep, err := faultmatrix.Run(context.Background(), faultmatrix.Options{Binary: bin, Filter: name})
		require.NoError(t, err)
		require.Equal(t, 1, rep.Total)
		if rep.Skipped == 1 {
			t.Skip(rep.Scenarios[0].Skipped)
		}
		require.Equal(t, 1, rep.Passed, "%s: %v", name, rep.Scenarios[0].Failures)
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

// TestReplicaMatrixSmoke runs two replica cells against the real binary
// and the test PostgreSQL server: a replica killed mid-call and one frozen
// after its tool acted; CI runs all of them with `ledger faultmatrix run`.
func TestReplicaMatrixSmoke(t *testing.T) {
	bin := build(t)
	for _, name := range []string{"replica/kill/2/after_tool_call/noquery-nodedup-nocancel",
		"replica/stop/2/after_tool_call/query-nodedup-cancel"} {
		rep, err := faultmatrix.Run(context.Background(), faultmatrix.Options{Binary: bin, Filter: name})
		require.NoError(t, err)
		require.Equal(t, 1, rep.Total)
		if rep.Skipped == 1 {
			t.Skip(rep.Scenarios[0].Skipped)
		}
		require.Equal(t, 1, rep.Passed, "%s: %v", name, rep.Scenarios[0].Failures)
		obs := rep.Scenarios[0].Observed
		require.Equal(t, 2, obs.Replicas)
		require.GreaterOrEqual(t, obs.Runs, 3, "a burst's runs at least, as the cell's own check asks")
		require.Positive(t, obs.Interrupted, "a survivor recovered the struck attempt")
		doc, err := json.Marshal(rep)
		require.NoError(t, err)
		require.NoError(t, faultmatrix.ValidateReport(doc))
	}
}
