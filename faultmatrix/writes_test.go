package faultmatrix_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/faultmatrix"
	"github.com/actionledger/ledger/ledger"
)

// TestCrashAtEveryWrite kills the real binary at its i-th store write for
// every i a representative run reaches (approval path and auto-approved
// path, before and after each commit), restarts it without a plan and
// checks all or nothing, the invariants and the tool's effect count. All
// four loops take about 10 s, so every write is tested on every run.
func TestCrashAtEveryWrite(t *testing.T) {
	t.Parallel()
	bin := build(t)
	var progress strings.Builder
	rep, err := faultmatrix.RunWrites(context.Background(), faultmatrix.WriteOptions{Binary: bin, Progress: &progress})
	require.NoError(t, err, progress.String())
	require.Len(t, rep.Loops, 4)
	for _, l := range rep.Loops {
		t.Logf("%s/%s: %d writes", l.Path, l.At, l.Writes)
		require.GreaterOrEqual(t, l.Writes, int64(5), "a run writes at least submit, action, attempt, outcome and end")
		require.Len(t, l.Results, int(l.Writes)+1, "every write was struck, then one the run did not reach")
		for _, r := range l.Results {
			require.Equal(t, r.Write <= l.Writes, r.Killed, "write %d", r.Write)
			require.Empty(t, r.Failures, "%s/%s write %d (%s)", r.Path, r.At, r.Write, r.Dir)
		}
	}
	t.Logf("%d crashes in %.1fs\n%s", rep.Crashes, rep.Seconds, progress.String())
}

// TestCrashAtEveryWriteCatchesABrokenEngine proves the loop can fail: a
// test build of the engine that calls the tool before recording the
// attempt, with a tool that has no guarantees, acts twice once a crash
// loses the attempt's write. The loop stops at that first failure.
func TestCrashAtEveryWriteCatchesABrokenEngine(t *testing.T) {
	t.Parallel()
	bin := build(t, "-tags", "faultmatrix_broken")
	rep, err := faultmatrix.RunWrites(context.Background(), faultmatrix.WriteOptions{Binary: bin,
		Paths: []faultmatrix.WritePath{faultmatrix.WritePathApproval}, Points: []ledger.WritePoint{ledger.WriteBeforeCommit},
		StopAtFailure: true, Env: []string{"LEDGER_BROKEN=call_before_record",
			`LEDGER_SIMULATOR_CONFIG={"tools":{"cards.write":{"guarantees":{"query":false,"dedup":false,"cancel":false}}}}`}})
	require.NoError(t, err)
	require.Positive(t, rep.Failed, "the broken engine passed every crash")
	var failures []string
	for _, r := range rep.Loops[0].Results {
		failures = append(failures, r.Failures...)
	}
	require.Contains(t, strings.Join(failures, "; "), "two effects for dedup key")
	results := rep.Loops[0].Results
	require.NotEmpty(t, results[len(results)-1].Failures, "the loop stopped at its first failure")
}
