package perf_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/perf"
)

// TestMCPDrive: the upstream answers the direct client and the relay alike,
// every call made once with its own arguments, the sides taking turns; an
// answer a side's check refuses counts as a failed call, untimed, and the
// drive goes on.
func TestMCPDrive(t *testing.T) {
	ctx := t.Context()
	up := perf.OpenMCPUpstream()
	defer up.Close()
	direct, err := up.Connect(ctx, "test-direct")
	require.NoError(t, err)
	defer direct.Close()
	relay, closeRelay, err := perf.OpenMCPRelay(ctx, up.URL)
	require.NoError(t, err)

	var order []string
	check := func(name string) func(*mcp.CallToolResult) error {
		return func(*mcp.CallToolResult) error { order = append(order, name); return nil }
	}
	checked := 0
	picky := func(*mcp.CallToolResult) error {
		checked++
		if checked%3 == 0 {
			return errors.New("every third answer refused")
		}
		return nil
	}
	d := &perf.MCPDrive{Block: 2, Sides: []perf.MCPSide{
		{Name: "direct", Session: direct, Tool: perf.MCPReadTool, Check: check("direct")},
		{Name: "relay", Session: relay, Tool: perf.MCPReadTool, Check: picky},
	}}
	warm, err := d.Warm(ctx, 1)
	require.NoError(t, err)
	require.Len(t, warm, 2)
	require.Len(t, warm[0].Latencies, 1)
	require.Equal(t, []string{"direct"}, order)

	order = nil
	levels, err := d.Run(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, "direct", levels[0].Name)
	require.Len(t, levels[0].Latencies, 5)
	require.Zero(t, levels[0].Failed)
	// The relay's third and sixth answers (the warm-up's first) were
	// refused.
	require.Equal(t, 2, levels[1].Failed)
	require.Len(t, levels[1].Latencies, 3)
	require.Contains(t, levels[1].FirstFailure, "every third answer refused")
	require.Equal(t, []string{"direct", "direct", "direct", "direct", "direct"}, order)
	require.Equal(t, int64(12), up.Calls(), "every call reached the upstream once")

	for _, l := range levels {
		require.Positive(t, l.P(0.5))
		require.GreaterOrEqual(t, l.P(0.99), l.P(0.5))
		require.Positive(t, l.PerSecond())
		if _, ok := perf.ProcessCPU(); ok {
			require.Positive(t, l.CPU, "the process's CPU over the side's turns")
			require.Equal(t, l.CPU/5, l.CPUPerCall(), "five calls each, failed ones too")
		}
	}
	lat := levels[0].Latencies
	require.Equal(t, lat[:1], levels[0].Part(0, 0.2).Latencies)
	require.Equal(t, lat[4:], levels[0].Part(0.8, 1).Latencies)
	require.Equal(t, lat, levels[0].Latencies, "percentiles leave the calls in their order")

	_, err = d.Run(ctx, 0)
	require.Error(t, err)
	require.NoError(t, closeRelay())
	_, err = relay.CallTool(ctx, &mcp.CallToolParams{Name: perf.MCPReadTool, Arguments: map[string]int{"i": 1}})
	require.Error(t, err, "the relay's session is closed")
}

// TestMCPDriveTurns: the sides take turns in blocks, the order of the
// sides turning by one each round.
func TestMCPDriveTurns(t *testing.T) {
	ctx := t.Context()
	up := perf.OpenMCPUpstream()
	defer up.Close()
	var order []string
	var sides []perf.MCPSide
	for _, name := range []string{"a", "b", "c"} {
		s, err := up.Connect(ctx, name)
		require.NoError(t, err)
		defer s.Close()
		sides = append(sides, perf.MCPSide{Name: name, Session: s, Tool: perf.MCPReadTool,
			Check: func(*mcp.CallToolResult) error { order = append(order, name); return nil }})
	}
	_, err := (&perf.MCPDrive{Sides: sides, Block: 2}).Run(ctx, 4)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "a", "b", "b", "c", "c", "b", "b", "c", "c", "a", "a"}, order)
}

// TestPipeSession: a server over the pipes answers the client; closing
// ends the server's Run, and a server that fails says so.
func TestPipeSession(t *testing.T) {
	ctx := t.Context()
	srv := mcp.NewServer(&mcp.Implementation{Name: "pipe-test", Version: "1"}, nil)
	s, stop, err := perf.PipeSession(ctx, "test", func(ctx context.Context, in io.ReadCloser, out io.WriteCloser) error {
		return srv.Run(ctx, &mcp.IOTransport{Reader: in, Writer: out})
	})
	require.NoError(t, err)
	require.NoError(t, s.Ping(ctx, nil))
	done := make(chan error, 1)
	go func() { done <- stop() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second): // not a sleep: the test waits on done; this bound turns a stop that hangs into a failure instead of a stuck run
		t.Fatal("stop did not return")
	}

	_, _, err = perf.PipeSession(ctx, "test", func(context.Context, io.ReadCloser, io.WriteCloser) error {
		return errors.New("no server here")
	})
	require.ErrorContains(t, err, "no server here")
}
