package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

// TestBench runs `ledger bench` in its smoke mode. It checks that every
// figure is there and positive, never how fast anything is: benchmarks are
// not timed tests.
func TestBench(t *testing.T) {
	t.Run("OK quick JSON", func(t *testing.T) {
		t.Setenv(envBenchPostgres, "") // SQLite alone
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
			"protocol_call_c32_p50_ms", "protocol_call_c32_p99_ms", "protocol_call_c32_per_s"}
		want = append(want, benchMCPKeys...)
		want = append(want, "recovery_scan_s", "recovery_per_run_ms", "evidence_export_ms",
			"streams_none_cpu_cores", "streams_open_cpu_cores", "streams_cpu_ratio", "streams_none_other_p50_ms",
			"streams_none_other_p99_ms", "streams_open_other_p50_ms", "streams_open_other_p99_ms", "streams_other_p50_ratio",
			"streams_other_p99_ratio")
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
			require.Equal(t, "sqlite", f.Driver, k)
			require.Empty(t, f.Error, k)
			if !benchMayBeZero[k] {
				require.Positive(t, f.Value, k)
			}
			require.NotEmpty(t, f.Unit, k)
			if f.RatioToFloor != nil {
				require.Positive(t, *f.RatioToFloor, k)
			}
		}
		require.NotNil(t, got["action_c1_per_s"].RatioToFloor)
		require.Nil(t, got["recovery_scan_s"].Met, "--quick scans fewer runs than the target names")
		require.NotNil(t, got["mcp_added_p50_ms"].Met, "the gateway's targets are judged at any N")
		require.NotNil(t, got["mcp_added_p99_ms"].Met)
		requireMCPDifferences(t, got)

		require.Equal(t, runtime.NumCPU(), rep.Machine.NumCPU)
		require.Equal(t, runtime.GOOS, rep.Machine.GOOS)
		require.NotEmpty(t, rep.Machine.GoVersion)
		require.True(t, rep.Settings.Quick)
		require.Equal(t, "FULL", rep.Settings.Synchronous)
		require.Equal(t, []string{"sqlite"}, rep.Settings.Drivers)
		require.Nil(t, rep.Settings.Postgres, "no PostgreSQL pass without --postgres")
		require.Positive(t, rep.Settings.RoundTrips)
		require.Equal(t, 50, rep.Settings.MCPCalls, "--quick makes 50 MCP calls each way")
		require.Empty(t, rep.Settings.Only)
		require.Positive(t, rep.WallS)
		require.Contains(t, errOut.String(), "bench: floor", "progress goes to stderr")
		if _, err := os.Stat("/proc/loadavg"); err == nil {
			require.Regexp(t, `^[0-9.]+ [0-9.]+ [0-9.]+$`, rep.Machine.LoadStart)
			require.Regexp(t, `^[0-9.]+ [0-9.]+ [0-9.]+$`, rep.Machine.LoadEnd)
		}
	})

	t.Run("OK quick postgres", func(t *testing.T) {
		pgtest.NewDatabase(t) // skips when no server is reachable
		t.Setenv(envBenchPostgres, pgtest.Server())
		var out, errOut bytes.Buffer
		err := Run(context.Background(), []string{"bench", "--quick", "--json", "--dir", t.TempDir()}, &out, &errOut)

		var rep benchReport
		dec := json.NewDecoder(&out)
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&rep), "the report is printed even when figures failed: %v", err)
		require.Equal(t, []string{"sqlite", "postgres"}, rep.Settings.Drivers, "$%s names the server", envBenchPostgres)
		require.NotNil(t, rep.Settings.Postgres)
		require.Equal(t, "on", rep.Settings.Postgres.SynchronousCommit)
		require.NotEmpty(t, rep.Settings.Postgres.ServerVersion)
		require.Positive(t, rep.Settings.Postgres.FloorBeforeCPS)

		keys := map[string][]benchFigure{}
		var failed []string
		for _, f := range rep.Figures {
			keys[f.Key] = append(keys[f.Key], f)
			if f.Error != "" {
				failed = append(failed, f.Driver+" "+f.Key)
				require.Zero(t, f.Value, f.Key)
				require.Nil(t, f.RatioToFloor, f.Key)
				require.Nil(t, f.Met, f.Key)
				continue
			}
			if !benchMayBeZero[f.Key] {
				require.Positive(t, f.Value, "%s %s", f.Driver, f.Key)
			}
		}
		for k, fs := range keys {
			if k == "peak_rss_mib" {
				require.Len(t, fs, 1, "the process's peak, measured once")
				continue
			}
			require.Len(t, fs, 2, k)
			require.Equal(t, "sqlite", fs[0].Driver, k)
			require.Equal(t, "postgres", fs[1].Driver, k)
			require.Empty(t, fs[0].Error, "SQLite measures every figure: %s", k)
		}
		pgFloor := keys["floor_commits_per_s"][1]
		require.Empty(t, pgFloor.Error)
		require.NotEqual(t, keys["floor_commits_per_s"][0].Value, pgFloor.Value, "each driver has its own floor")
		// A figure that could not be measured fails the command, naming it.
		if len(failed) > 0 {
			require.Error(t, err)
			for _, f := range failed {
				require.Contains(t, err.Error(), f)
			}
		} else {
			require.NoError(t, err, errOut.String())
		}

		// Every database the run made on the server is dropped (a bench
		// run elsewhere on the same server has a prefix of its own).
		prefix := rep.Settings.Postgres.DatabasePrefix
		require.Regexp(t, `^ledger_bench_[a-z0-9]+_$`, prefix)
		conn, cerr := pgx.Connect(t.Context(), pgtest.Server())
		require.NoError(t, cerr)
		defer conn.Close(context.Background())
		var left int
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)`, prefix).Scan(&left))
		require.Zero(t, left, "databases left on the server")
	})

	t.Run("OK only mcp", func(t *testing.T) {
		t.Setenv(envBenchPostgres, "")
		var out, errOut bytes.Buffer
		err := Run(context.Background(), []string{"bench", "--only", "mcp", "--mcp-calls", "20", "--duration", "200ms", "--dir", t.TempDir()},
			&out, &errOut)
		require.NoError(t, err, errOut.String())
		text := out.String()
		for _, name := range []string{"floor: one commit", "mcp read call, direct, p50", "mcp gateway: added per read call, p50",
			"mcp gateway: Store writes per read call"} {
			require.Contains(t, text, name)
		}
		require.Contains(t, text, "< 2 ms", "the target is shown")
		require.NotContains(t, text, "durable action", "--only mcp runs the MCP workload alone")
		require.NotContains(t, errOut.String(), "recovery:")
		require.Contains(t, errOut.String(), "bench: mcp gateway: 20 read calls each way")
	})

	t.Run("ErrInvalid bad flag", func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := Run(context.Background(), []string{"bench", "--recovery-runs", "0"}, &out, &errOut)
		require.ErrorIs(t, err, ledger.ErrInvalid)
		require.Equal(t, 2, exitCode(err))
		err = Run(context.Background(), []string{"bench", "--nope"}, &out, &errOut)
		require.Equal(t, 2, exitCode(err))
		require.Empty(t, out.String())
		err = Run(context.Background(), []string{"bench", "--postgres", "/tmp/ledger.db"}, &out, &errOut)
		require.ErrorIs(t, err, ledger.ErrInvalid, "--postgres takes a postgres:// URL")
		err = Run(context.Background(), []string{"bench", "--only", "mcp,nope"}, &out, &errOut)
		require.ErrorIs(t, err, ledger.ErrInvalid, "--only takes the families")
		err = Run(context.Background(), []string{"bench", "--mcp-calls", "0"}, &out, &errOut)
		require.ErrorIs(t, err, ledger.ErrInvalid)
	})
}

// benchMCPKeys are the MCP gateway workload's figures.
var benchMCPKeys = []string{"mcp_direct_p50_ms", "mcp_direct_p99_ms", "mcp_relay_p50_ms", "mcp_relay_p99_ms", "mcp_gateway_p50_ms",
	"mcp_gateway_p99_ms", "mcp_gateway_first_tenth_p50_ms", "mcp_gateway_last_tenth_p50_ms", "mcp_added_p50_ms", "mcp_added_p99_ms",
	"mcp_ledger_p50_ms", "mcp_direct_per_s", "mcp_gateway_per_s",
	"mcp_direct_cpu_ms_per_call", "mcp_gateway_cpu_ms_per_call", "mcp_added_cpu_ms_per_call", "mcp_store_writes_per_call", "mcp_pool_writes_per_call", "mcp_commits_per_call",
	"mcp_commit_ms_per_call", "mcp_store_reads_per_call", "mcp_gateway_failed_calls"}

// benchMayBeZero are the figures that may be zero or below: the
// differences of two others (on a loaded machine a few calls may leave
// them at or below zero), and a count of failures.
var benchMayBeZero = map[string]bool{"mcp_added_p50_ms": true, "mcp_added_p99_ms": true, "mcp_ledger_p50_ms": true,
	"mcp_added_cpu_ms_per_call": true,
	"mcp_gateway_failed_calls":  true, // a count that should be 0
	"mcp_pool_writes_per_call":  true} // a gateway proposal no longer wakes the pool

// requireMCPDifferences checks the MCP workload's differences against the
// figures they are taken from.
func requireMCPDifferences(t *testing.T, got map[string]benchFigure) {
	t.Helper()
	diff := func(a, b string) float64 { return got[a].Value - got[b].Value }
	require.InDelta(t, diff("mcp_gateway_p50_ms", "mcp_direct_p50_ms"), got["mcp_added_p50_ms"].Value, 1e-9)
	require.InDelta(t, diff("mcp_gateway_p99_ms", "mcp_direct_p99_ms"), got["mcp_added_p99_ms"].Value, 1e-9)
	require.InDelta(t, diff("mcp_gateway_p50_ms", "mcp_relay_p50_ms"), got["mcp_ledger_p50_ms"].Value, 1e-9)
}
