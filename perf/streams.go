package perf

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// Streams is the idle event streams' workload: a server in this process
// (dev mode, no caps on streams) behind an httptest server on loopback,
// over a Store that holds one running run with many events, the streamed
// run, and one small run, the target of an unrelated request. Measure
// opens event streams on the streamed run that have nothing left to read,
// and measures what they cost the server while they wait: its CPU time and
// the latency of the unrelated request.
type Streams struct {
	Store *ledger.DB
	URL   string
	// Run is the streamed run, Events its number of events; Other is the
	// unrelated request's run.
	Run, Other ledger.RunID
	Events     int
	ts         *httptest.Server
	client     *http.Client
}

// OpenStreams writes, to a new Store on db (a SQLite file path or a
// postgres:// URL) with synchronous=OFF (PostgreSQL: synchronous_commit
// off; the workload only reads), a running run of at least events events
// and a second run, and serves them.
func OpenStreams(ctx context.Context, db string, events int) (*Streams, error) {
	store, err := openUnsynced(ctx, db)
	if err != nil {
		return nil, err
	}
	s, err := openStreams(ctx, store, events)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	return s, nil
}

func openStreams(ctx context.Context, store *ledger.DB, events int) (*Streams, error) {
	dev := server.DevIdentity()
	submit := func(key string) (*ledger.Run, error) {
		res, err := store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: dev.Tenant, IdempotencyKey: key, Principal: dev.Principal,
			Agent: "bench", Input: json.RawMessage(`{}`)})
		return res.Run, err
	}
	run, err := submit("streamed")
	if err != nil {
		return nil, err
	}
	if _, err := store.TransitionRun(ctx, ledger.RunTransition{ID: run.ID, From: ledger.RunQueued, To: ledger.RunRunning}); err != nil {
		return nil, err
	}
	n, err := FillEvents(ctx, store, run.ID, events)
	if err != nil {
		return nil, err
	}
	other, err := submit("other")
	if err != nil {
		return nil, err
	}
	_, ts, err := serve(store)
	if err != nil {
		return nil, err
	}
	return &Streams{Store: store, URL: ts.URL, Run: run.ID, Other: other.ID, Events: n, ts: ts,
		client: &http.Client{Transport: &http.Transport{}, Timeout: 60 * time.Second}}, nil
}

// Close stops the server and closes the Store.
func (s *Streams) Close() error {
	s.client.CloseIdleConnections()
	s.ts.Close()
	return s.Store.Close()
}

// StreamsLevel is what one Measure saw.
type StreamsLevel struct {
	// Streams is how many idle event streams were open.
	Streams int
	// CPU is the process's CPU time over Window, while nothing but the
	// open streams asked anything of the server.
	CPU, Window time.Duration
	// Latencies are those of the unrelated requests, GET /v1/runs/{Other}
	// one after another, made with the streams still open.
	Latencies []time.Duration
}

// Cores is the process's CPU time per second of the window: 1 is one core
// busy all the time.
func (l StreamsLevel) Cores() float64 { return l.CPU.Seconds() / l.Window.Seconds() }

// P returns the p-th percentile latency of the unrelated requests.
func (l StreamsLevel) P(p float64) time.Duration { return Percentile(l.Latencies, p) }

// streamReady is how long a stream may take to deliver its first event.
const streamReady = 30 * time.Second

// Measure opens n event streams on Run, each resuming at the event before
// its last (Last-Event-ID), so that each receives that one event and then
// has nothing to read; once every stream has its event, it measures the
// process's CPU time for idle, then makes unrelated requests one after
// another for probe and at least minProbes of them, then closes the
// streams and waits until each has ended. n may be 0: the same without
// streams. The process's CPU is this whole process's (server and the
// idle clients, which only wait on their sockets).
func (s *Streams) Measure(ctx context.Context, n int, idle, probe time.Duration, minProbes int) (StreamsLevel, error) {
	if n < 0 || idle <= 0 || minProbes < 1 {
		return StreamsLevel{}, errors.New("perf: streams measure needs n ≥ 0, a positive idle window and at least one probe")
	}
	out := StreamsLevel{Streams: n}
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	ready := make(chan error, n)
	var ended atomic.Int64 // streams that ended before the measure did
	// One connection per stream, never reused.
	streams := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	last := strconv.Itoa(s.Events - 1)
	for range n {
		wg.Go(func() {
			if s.stream(sctx, streams, last, ready) && sctx.Err() == nil {
				ended.Add(1)
			}
		})
	}
	timeout := time.NewTimer(streamReady)
	defer timeout.Stop()
	for range n {
		select {
		case err := <-ready:
			if err != nil {
				return out, err
			}
		case <-timeout.C:
			return out, fmt.Errorf("perf: streams not open after %s", streamReady)
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}

	cpu0, ok := ProcessCPU()
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return out, ctx.Err()
	case <-time.After(idle):
	}
	cpu1, ok1 := ProcessCPU()
	out.Window = time.Since(t0)
	if !ok || !ok1 {
		return out, errors.New("perf: this platform does not report the process's CPU time")
	}
	out.CPU = cpu1 - cpu0

	start := time.Now()
	for i := 0; i < minProbes || time.Since(start) < probe; i++ {
		t := time.Now()
		if err := (RoundTrip{URL: s.URL, Client: s.client}).do(ctx, http.MethodGet, "/v1/runs/"+string(s.Other), "", "", nil,
			http.StatusOK, nil); err != nil {
			return out, fmt.Errorf("unrelated request: %w", err)
		}
		out.Latencies = append(out.Latencies, time.Since(t))
	}
	if k := ended.Load(); k > 0 {
		return out, fmt.Errorf("perf: %d of %d streams ended during the measure", k, n)
	}
	return out, nil
}

// stream opens one event stream resuming after seq last, sends nil on
// ready once its first event has arrived (or why it could not, and
// returns), then reads and drops the rest until the stream or ctx ends. It
// reports whether the stream was open.
func (s *Streams) stream(ctx context.Context, client *http.Client, last string, ready chan<- error) bool {
	res, err := s.openStream(ctx, client, last)
	if err != nil {
		ready <- err
		return false
	}
	defer res.Body.Close()
	r := bufio.NewReader(res.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			ready <- fmt.Errorf("stream ended before its first event: %w", err)
			return false
		}
		if line == "\n" {
			break // the end of the first event
		}
	}
	ready <- nil
	_, _ = io.Copy(io.Discard, r)
	return true
}

// openStream sends the request of one event stream.
func (s *Streams) openStream(ctx context.Context, client *http.Client, last string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/v1/runs/"+string(s.Run)+"/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Last-Event-ID", last)
	res, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("open stream: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		return nil, fmt.Errorf("open stream: %d %s", res.StatusCode, strings.TrimSpace(string(body)))
	}
	return res, nil
}
