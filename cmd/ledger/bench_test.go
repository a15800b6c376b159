package main

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"testing"

	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// TestBench runs `ledger bench` in its smoke mode. It checks that every
// figure is there and positive, never how fast anything is: benchmarks are
// not timed tests.
func TestBench(t *testing.T) {
	t.Run("OK quick JSON", func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := Run(context.Background(), []string{"bench", "--quick", "--json", "--dir", t.TempDir()}, &out, &errOut)
		require.NoError(t, err, errOut.String())

		var rep benchReport
		dec := json.NewDecoder(&out)
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&rep))

		want := []string{"floor_commits_per_s", "floor_commit_ms", "action_c1_per_s", "action_c8_per_s", "action_c32_per_s",
			"action_scaling_c32_c1", "approval_round_trip_p50_ms", "approval_round_trip_p99_ms", "approve_request_p50_ms",
			"approve_request_p99_ms",
			"protocol_call_c1_p50_ms", "protocol_call_c1_p99_ms", "protocol_call_c1_per_s",
			"protocol_call_c32_p50_ms", "protocol_call_c32_p99_ms", "protocol_call_c32_per_s", "recovery_scan_s", "recovery_per_run_ms", "evidence_export_ms"}
		if _, ok := peakRSSKiB(); ok {
			want = append(want, "peak_rss_mib")
		}
		got := map[string]benchFigure{}
		for _, f := range rep.Figures {
			got[f.Key] = f
		}
		require.Len(t, got, len(want), "figures: %v", rep.Figures)
		for _, k := range want {
			f, ok := got[k]
			require.True(t, ok, "figure %s missing", k)
			require.Positive(t, f.Value, k)
			require.NotEmpty(t, f.Unit, k)
			if f.RatioToFloor != nil {
				require.Positive(t, *f.RatioToFloor, k)
			}
		}
		require.NotNil(t, got["action_c1_per_s"].RatioToFloor)
		require.Nil(t, got["recovery_scan_s"].Met, "--quick scans fewer runs than the target names")

		require.Equal(t, runtime.NumCPU(), rep.Machine.NumCPU)
		require.Equal(t, runtime.GOOS, rep.Machine.GOOS)
		require.NotEmpty(t, rep.Machine.GoVersion)
		require.True(t, rep.Settings.Quick)
		require.Equal(t, "FULL", rep.Settings.Synchronous)
		require.Positive(t, rep.Settings.RoundTrips)
		require.Positive(t, rep.WallS)
		require.Contains(t, errOut.String(), "bench: floor", "progress goes to stderr")
	})

	t.Run("ErrInvalid bad flag", func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := Run(context.Background(), []string{"bench", "--recovery-runs", "0"}, &out, &errOut)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		require.Equal(t, 2, exitCode(err))
		err = Run(context.Background(), []string{"bench", "--nope"}, &out, &errOut)
		require.Equal(t, 2, exitCode(err))
		require.Empty(t, out.String())
	})
}
