package perf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The MCP workload: one read tool of an MCP server in this process,
// reached three ways in one run, one call after another, so that what the
// MCP gateway adds to a read shows beside the same call made without it.
// The upstream and its direct client, the relay and the driver are here;
// the gateway itself (mcpgw over the engine and a Store) is wired by the
// caller, which hands its client session to Drive like any other side.

// MCPReadTool is the upstream's read tool, and MCPReadAnswer its answer to
// every call.
const (
	MCPReadTool   = "bench_read"
	MCPReadAnswer = "ok"
)

// mcpReadSchema is the read tool's input schema: one integer, so that
// successive calls differ (the gateway records each as a new action).
const mcpReadSchema = `{"type":"object","properties":{"i":{"type":"integer"}},"required":["i"],"additionalProperties":false}`

// MCPUpstream is an MCP server in this process (the Go SDK) with one read
// tool, MCPReadTool, that answers MCPReadAnswer at once, served over
// streamable HTTP (stateful sessions, the SDK's defaults) on an httptest
// server on 127.0.0.1. The gateway reaches it as a url upstream; Connect
// reaches it the same way without the gateway.
type MCPUpstream struct {
	URL string
	// OnCall, if set before the first call, is called in the read tool's
	// handler (to see when a call reached the upstream).
	OnCall func()
	ts     *httptest.Server
	calls  atomic.Int64
}

// OpenMCPUpstream starts the upstream.
func OpenMCPUpstream() *MCPUpstream {
	u := &MCPUpstream{}
	s := mcp.NewServer(&mcp.Implementation{Name: "ledger-bench-upstream", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: MCPReadTool, Description: "Answers " + MCPReadAnswer + " at once; reads nothing, changes nothing.",
		InputSchema: json.RawMessage(mcpReadSchema), Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.calls.Add(1)
			if u.OnCall != nil {
				u.OnCall()
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: MCPReadAnswer}}}, nil
		})
	u.ts = httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	u.URL = u.ts.URL
	return u
}

// Calls is how many calls of the read tool the upstream has answered.
func (u *MCPUpstream) Calls() int64 { return u.calls.Load() }

// Close stops the upstream's HTTP server.
func (u *MCPUpstream) Close() { u.ts.Close() }

// Connect opens an SDK client session on the upstream the way the gateway
// opens its session on a url upstream (mcpgw/upstream.go): streamable HTTP
// over http.DefaultTransport, no retries.
func (u *MCPUpstream) Connect(ctx context.Context, client string) (*mcp.ClientSession, error) {
	return ConnectHTTP(ctx, client, u.URL)
}

// ConnectHTTP opens an SDK client session on the streamable-HTTP MCP server
// at url, as the gateway opens one on a url upstream.
func ConnectHTTP(ctx context.Context, client, url string) (*mcp.ClientSession, error) {
	t := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: http.DefaultTransport}, MaxRetries: -1}
	s, err := mcp.NewClient(&mcp.Implementation{Name: client, Version: "1"}, nil).Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("perf: connect to %s: %w", url, err)
	}
	return s, nil
}

// PipeSession runs serve (an MCP server over a stream: the gateway's
// ServeStdio, say) on two in-memory pipes (io.Pipe: newline-delimited
// JSON-RPC, as over a process's stdin and stdout) and connects an SDK
// client to it. close ends the client's session and waits for serve to
// return; its error is serve's, but for the end of its input.
func PipeSession(ctx context.Context, client string, serve func(ctx context.Context, in io.ReadCloser, out io.WriteCloser) error) (s *mcp.ClientSession, close func() error, err error) {
	toServer, fromClient := io.Pipe()
	toClient, fromServer := io.Pipe()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		err := serve(sctx, toServer, fromServer)
		// The client may still be reading: end its input too.
		_ = fromServer.Close()
		done <- err
	}()
	stop := func() error {
		cancel()
		_ = fromClient.Close()
		err := <-done
		if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || errors.Is(err, io.ErrClosedPipe) {
			return nil
		}
		return err
	}
	s, err = mcp.NewClient(&mcp.Implementation{Name: client, Version: "1"}, nil).Connect(ctx,
		&mcp.IOTransport{Reader: toClient, Writer: fromClient}, nil)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("perf: connect over pipes: %w", err), stop())
	}
	return s, func() error { return errors.Join(s.Close(), stop()) }, nil
}

// OpenMCPRelay is a proxy with no ledger, a baseline for the gateway: an
// MCP server served over in-memory pipes (PipeSession) with the upstream's
// read tool, whose handler passes each call to the upstream through its
// own streamable-HTTP session and answers the upstream's result as it is.
// It pays what any MCP proxy in front of the upstream pays (the pipe hop,
// a second SDK server and client, the same HTTP hop as the gateway's), so
// the gateway's time above it is the ledger's.
func OpenMCPRelay(ctx context.Context, upstreamURL string) (s *mcp.ClientSession, close func() error, err error) {
	up, err := ConnectHTTP(ctx, "ledger-bench-relay", upstreamURL)
	if err != nil {
		return nil, nil, err
	}
	var def *mcp.Tool
	for t, err := range up.Tools(ctx, nil) {
		if err != nil {
			return nil, nil, errors.Join(fmt.Errorf("perf: relay: list the upstream's tools: %w", err), up.Close())
		}
		if t.Name == MCPReadTool {
			def = t
		}
	}
	if def == nil {
		return nil, nil, errors.Join(fmt.Errorf("perf: relay: the upstream lists no %s", MCPReadTool), up.Close())
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "ledger-bench-relay", Version: "1"}, nil)
	srv.AddTool(def, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return up.CallTool(ctx, &mcp.CallToolParams{Name: def.Name, Arguments: req.Params.Arguments})
	})
	s, stop, err := PipeSession(ctx, "ledger-bench-client", func(ctx context.Context, in io.ReadCloser, out io.WriteCloser) error {
		return srv.Run(ctx, &mcp.IOTransport{Reader: in, Writer: out})
	})
	if err != nil {
		return nil, nil, errors.Join(err, up.Close())
	}
	return s, func() error { return errors.Join(stop(), up.Close()) }, nil
}

// MCPSide is one way to the upstream's read tool: a client session and
// the tool's name on it, and what else its answer must show.
type MCPSide struct {
	Name    string
	Session *mcp.ClientSession
	Tool    string
	// Check, if set, is called with every answer that carried
	// MCPReadAnswer; an error makes the call a failed one.
	Check func(*mcp.CallToolResult) error
}

// MCPSideLevel is what one side's calls took, in the order made: the
// latencies of the calls answered as they should be, and the calls that
// were answered otherwise (a tool error, another text, a failed Check).
type MCPSideLevel struct {
	Name      string
	Latencies []time.Duration
	Failed    int
	// FirstFailure says what the first failed call was answered.
	FirstFailure string
	// CPU is the process's CPU time (ProcessCPU: every goroutine, the
	// client's, the upstream's and the background work the calls caused)
	// over the side's turns, summed; 0 where it cannot be read.
	CPU time.Duration
}

// CPUPerCall is the process's CPU time per call of the side's turns.
func (l MCPSideLevel) CPUPerCall() time.Duration {
	n := len(l.Latencies) + l.Failed
	if n == 0 {
		return 0
	}
	return l.CPU / time.Duration(n)
}

// P is the p-th percentile of the side's calls (nearest rank).
func (l MCPSideLevel) P(p float64) time.Duration { return Percentile(slices.Clone(l.Latencies), p) }

// PerSecond is the side's calls per second of its own time: one over the
// mean latency (the sides take turns, so the run's wall time is shared).
func (l MCPSideLevel) PerSecond() float64 {
	var sum time.Duration
	for _, d := range l.Latencies {
		sum += d
	}
	if sum <= 0 {
		return 0
	}
	return float64(len(l.Latencies)) / sum.Seconds()
}

// Part is the side's level over the calls from the fraction from to the
// fraction to of its run (0.9, 1: the last tenth), to see a drift.
func (l MCPSideLevel) Part(from, to float64) MCPSideLevel {
	n := len(l.Latencies)
	i, j := int(float64(n)*from), int(float64(n)*to)
	return MCPSideLevel{Name: l.Name, Latencies: l.Latencies[i:max(i, j)]}
}

// MCPDrive makes read calls on its sides, one call at a time over all of
// them (concurrency 1). Call i on a side has the arguments {"i": i}, i
// counting on across Warm and Run, so that no call repeats an earlier one.
// A call the session fails (the transport, the protocol) ends the drive
// with its error; a call answered otherwise than MCPReadAnswer counts as
// failed, untimed, and the drive goes on.
type MCPDrive struct {
	Sides []MCPSide
	// Block is how many calls a side makes in a row before the next
	// side's turn; 0 means 1.
	Block int
	next  []int
}

// Warm makes n calls on each side, one side after the other, to be
// thrown away but for their failures.
func (d *MCPDrive) Warm(ctx context.Context, n int) ([]MCPSideLevel, error) { return d.run(ctx, n, n) }

// Run makes n calls on each side: Block calls on one side, then Block on
// the next, the order of the sides turning by one each round, so that a
// slow spell of the machine falls on every side alike.
func (d *MCPDrive) Run(ctx context.Context, n int) ([]MCPSideLevel, error) {
	return d.run(ctx, n, max(d.Block, 1))
}

func (d *MCPDrive) run(ctx context.Context, n, block int) ([]MCPSideLevel, error) {
	if len(d.Sides) == 0 || n < 1 {
		return nil, errors.New("perf: an MCP drive needs a side and n ≥ 1")
	}
	d.init()
	out := make([]MCPSideLevel, len(d.Sides))
	for k, s := range d.Sides {
		out[k] = MCPSideLevel{Name: s.Name, Latencies: make([]time.Duration, 0, n)}
	}
	made := func(l MCPSideLevel) int { return len(l.Latencies) + l.Failed }
	// Every side gets the same number of calls each round.
	for round := 0; made(out[0]) < n; round++ {
		for j := range d.Sides {
			k := (round + j) % len(d.Sides)
			cpu0, cpuOK := ProcessCPU()
			for b := 0; b < block && made(out[k]) < n; b++ {
				lat, failure, err := d.call(ctx, k)
				switch {
				case err != nil:
					return nil, err
				case failure != "":
					if out[k].Failed == 0 {
						out[k].FirstFailure = failure
					}
					out[k].Failed++
				default:
					out[k].Latencies = append(out[k].Latencies, lat)
				}
			}
			if cpu1, ok := ProcessCPU(); ok && cpuOK {
				out[k].CPU += cpu1 - cpu0
			}
		}
	}
	return out, ctx.Err()
}

func (d *MCPDrive) init() {
	if len(d.next) != len(d.Sides) {
		d.next = make([]int, len(d.Sides))
	}
}

// call makes side k's next call and times it; failure says how its answer
// was not the one expected.
func (d *MCPDrive) call(ctx context.Context, k int) (lat time.Duration, failure string, err error) {
	s, i := d.Sides[k], d.next[k]
	d.next[k]++
	t0 := time.Now()
	res, err := s.Session.CallTool(ctx, &mcp.CallToolParams{Name: s.Tool, Arguments: map[string]int{"i": i}})
	lat = time.Since(t0)
	if err != nil {
		return 0, "", fmt.Errorf("perf: %s: call %d: %w", s.Name, i, err)
	}
	if text := resultText(res); res.IsError || text != MCPReadAnswer {
		return 0, fmt.Sprintf("call %d answered %q (error: %t), not %q", i, text, res.IsError, MCPReadAnswer), nil
	}
	if s.Check != nil {
		if err := s.Check(res); err != nil {
			return 0, fmt.Sprintf("call %d: %v", i, err), nil
		}
	}
	return lat, "", nil
}

// resultText is the text content of a result, joined.
func resultText(res *mcp.CallToolResult) string {
	var b []byte
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b = append(b, tc.Text...)
		}
	}
	return string(b)
}
