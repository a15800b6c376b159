package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/perf"
)

// BenchmarkMCPGatewayRead times b.N read calls through the MCP gateway,
// wired as `ledger bench` wires it (openMCPGateway: the engine on a SQLite
// file with synchronous=FULL, its pool started, ServeStdio on in-memory
// pipes, the upstream an MCP server in this process on loopback streamable
// HTTP), after a warm-up that opens the session's run; `ledger bench
// --only mcp` puts the direct call and a proxy without ledger beside it.
// It logs where a call's time goes: for each step of the call's path, in
// order, the mean time from the step before to its end (a Store operation
// on the path ending, the upstream answering, the client getting the
// answer, the delivery recorded after it), from 10 calls up. For a CPU
// profile:
//
//	go test -run '^$' -bench MCPGatewayRead -benchtime 2000x -cpuprofile cpu.out ./cmd/ledger
func BenchmarkMCPGatewayRead(b *testing.B) {
	ctx := b.Context()
	up := perf.OpenMCPUpstream()
	defer up.Close()
	dir := b.TempDir()
	gw, err := openMCPGateway(ctx, filepath.Join(dir, "ledger.db"), dir, up.URL)
	require.NoError(b, err)
	defer gw.Close()
	up.OnCall = func() { gw.counter.mark(stepUpstream) }
	tool := benchMCPUpstream + "__" + perf.MCPReadTool
	call := func(i int) {
		gw.counter.mark(stepSend)
		res, err := gw.session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]int{"i": i}})
		gw.counter.mark(stepAnswer)
		require.NoError(b, err)
		require.False(b, res.IsError, "%v", res.Content)
	}
	const warm = 3
	for i := range warm {
		call(i)
	}
	before := gw.counter.settled()
	gw.counter.tracing.Store(true)
	gw.counter.trace = nil
	lat := make([]time.Duration, 0, b.N)
	cpu0, _ := perf.ProcessCPU()
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		call(warm + i)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	cpu1, cpuOK := perf.ProcessCPU()
	c := gw.counter.settled().minus(before)
	b.ReportMetric(ms(perf.Percentile(lat, 0.50)), "p50-ms")
	b.ReportMetric(ms(perf.Percentile(lat, 0.99)), "p99-ms")
	if cpuOK {
		b.ReportMetric(ms(cpu1-cpu0)/float64(b.N), "cpu-ms/op")
	}
	b.ReportMetric(float64(c.path.writesAll)/float64(b.N), "writes/op")
	b.ReportMetric(float64(c.other.writesAll)/float64(b.N), "pool-writes/op")
	b.ReportMetric(float64(c.commits)/float64(b.N), "commits/op")
	b.ReportMetric(float64(c.path.readsAll)/float64(b.N), "reads/op")
	require.Equal(b, int64(warm+b.N), up.Calls())
	if b.N < 10 {
		return // the smoke run's (-benchtime 1x) and the first probe's: too few calls to say anything
	}
	gw.counter.mu.Lock()
	steps := callSteps(gw.counter.trace)
	gw.counter.mu.Unlock()
	b.Logf("where a gateway read call's time goes, mean of %d calls (each step: from the step before to its end)", b.N)
	for _, s := range steps {
		b.Logf("  %-36s %7.3f ms  (%d calls)", s.name, ms(s.total)/float64(s.n), s.n)
	}
}

// The client's and the upstream's points of a call's trace.
const (
	stepSend     = "client sends the call"
	stepUpstream = "upstream answers"
	stepAnswer   = "client gets the answer"
	stepDelivery = "delivery recorded"
)

// callStep is one step of a call's path: how many times it was seen and
// the time from the step before to its end, summed.
type callStep struct {
	name  string
	n     int
	total time.Duration
}

// callSteps reads a trace (opCounter.trace) call by call: each step is
// timed from the point before it, in the order the steps first came; the
// delivery, recorded after the client got the answer (sometimes once the
// next call has begun), from the answer.
func callSteps(trace []opMark) []callStep {
	var steps []*callStep
	byName := map[string]*callStep{}
	add := func(name string, d time.Duration) {
		s := byName[name]
		if s == nil {
			s = &callStep{name: name}
			byName[name] = s
			steps = append(steps, s)
		}
		s.n++
		s.total += d
	}
	var prev, answered time.Time
	seen := map[string]int{} // the current call's operations, to name a repeated one apart
	for _, m := range trace {
		switch {
		case m.name == stepSend:
			prev = m.at
			clear(seen)
			continue
		case m.name == "record_observation":
			if !answered.IsZero() { // else the warm-up's last delivery
				add(stepDelivery+" (after the answer)", m.at.Sub(answered))
			}
			continue
		case m.name == stepAnswer:
			answered = m.at
		}
		seen[m.name]++
		name := m.name
		if k := seen[m.name]; k > 1 {
			name = fmt.Sprintf("%s #%d", m.name, k)
		}
		if !prev.IsZero() {
			add(name, m.at.Sub(prev))
		}
		prev = m.at
	}
	out := make([]callStep, 0, len(steps))
	for _, s := range steps {
		out = append(out, *s)
	}
	return out
}

// TestBenchMCP runs the MCP workload briefly: every call reaches the
// upstream once, through the gateway as a recorded action, and the
// Store's operations per call are counted.
func TestBenchMCP(t *testing.T) {
	dir := t.TempDir()
	target := benchTarget{driver: driverSQLite, dir: dir,
		newDB: func(_ context.Context, name string) (string, error) { return filepath.Join(dir, name+".db"), nil }}
	r, err := benchMCP(t.Context(), target, 12, func(string, ...any) {})
	require.NoError(t, err)
	for _, l := range []perf.MCPSideLevel{r.direct, r.relay, r.gateway} {
		require.Len(t, l.Latencies, 12, l.Name)
		require.Positive(t, l.P(0.5), l.Name)
	}
	require.Equal(t, 12, r.calls)
	// Each read call is an action with an attempt started and finished;
	// a read's delivery is not recorded, and its run is not submitted again.
	for _, op := range []string{"create_action", "start_attempt", "finish_attempt"} {
		require.Equal(t, 12, r.ops.path.writes[op], op)
	}
	require.Zero(t, r.ops.path.writes["record_observation"])
	require.Zero(t, r.ops.path.writes["submit_run"])
	require.Positive(t, r.ops.commits)
	figs := mcpFigures(r, func(float64) *float64 { return nil })
	var keys []string
	got := map[string]benchFigure{}
	for _, f := range figs {
		keys = append(keys, f.Key)
		if !benchMayBeZero[f.Key] {
			require.Positive(t, f.Value, f.Key)
		}
		got[f.Key] = f
	}
	require.Equal(t, benchMCPKeys, keys)
	requireMCPDifferences(t, got)
}
