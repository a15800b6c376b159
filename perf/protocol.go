package perf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/stores"
	"github.com/actionledger/ledger/server"
)

// ProtocolAgent and ProtocolTool are the agent and the read tool of the
// protocol workload.
const (
	ProtocolAgent = "bench-client"
	ProtocolTool  = "bench.read"
)

// Protocol is the agent protocol's workload: a server in this process, on
// a real file (synchronous=FULL) or PostgreSQL database behind an httptest server on loopback,
// whose engine has one client-driven agent with one read tool that the
// default rules approve. One tool call is what an outside agent pays per
// call: propose it, begin its attempt, complete it — three requests, each
// durable before its answer.
type Protocol struct {
	Store  *ledger.DB
	Engine *engine.Engine
	URL    string
	Client *http.Client
	ts     *httptest.Server
	seq    atomic.Int64
}

// OpenProtocol opens the workload on db, a new SQLite file or PostgreSQL
// database (stores.Open).
func OpenProtocol(ctx context.Context, db string) (*Protocol, error) {
	store, err := stores.Open(ctx, stores.Config{DB: db})
	if err != nil {
		return nil, err
	}
	desc := contracts.ToolDescriptor{SchemaVersion: "1.0", Name: ProtocolTool, Version: "1", Effect: contracts.EffectRead,
		ArgumentsSchema: json.RawMessage(`{"type":"object","properties":{"i":{"type":"integer"}},"required":["i"]}`),
		TimeoutMS:       30000}
	agent := engine.Agent{Name: ProtocolAgent, Driver: engine.DriverClient,
		Tools: []engine.Tool{engine.ClientTool(desc, engine.Lease{})}}
	eng, ts, err := serve(store, agent)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	return &Protocol{Store: store, Engine: eng, URL: ts.URL, ts: ts,
		Client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}}, nil
}

// Close stops the server and closes the Store.
func (p *Protocol) Close() error {
	p.Client.CloseIdleConnections()
	p.ts.Close()
	return p.Store.Close()
}

// ProtocolLevel is what one Drive did: the calls made, their latencies
// (propose to complete answered) and the wall time.
type ProtocolLevel struct {
	Calls     int
	Elapsed   time.Duration
	Latencies []time.Duration
}

// PerSecond is tool calls per second.
func (l ProtocolLevel) PerSecond() float64 { return float64(l.Calls) / l.Elapsed.Seconds() }

// P returns the p-th percentile latency of the calls.
func (l ProtocolLevel) P(p float64) time.Duration { return Percentile(l.Latencies, p) }

// Drive makes tool calls from c agents at once, each with its own run,
// until calls have started (calls > 0) or d has passed (d > 0), each agent
// at least one; every call started is finished and timed.
func (p *Protocol) Drive(ctx context.Context, c, calls int, d time.Duration) (ProtocolLevel, error) {
	if c < 1 || (calls <= 0 && d <= 0) {
		return ProtocolLevel{}, fmt.Errorf("perf: protocol drive needs a concurrency of at least 1 and a number of calls or a duration")
	}
	var (
		started atomic.Int64
		mu      sync.Mutex
		all     []time.Duration
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	fail := func(err error) { errOnce.Do(func() { first = err }) }
	start := time.Now()
	deadline := start.Add(d)
	for range c {
		wg.Go(func() {
			run, err := p.submit(ctx)
			if err != nil {
				fail(err)
				return
			}
			var mine []time.Duration
			// Each agent makes at least one call: on a loaded machine its
			// run's submit may outlast d, and a level with no call has no
			// figure.
			for i := 0; ctx.Err() == nil && (d <= 0 || i == 0 || time.Now().Before(deadline)); i++ {
				if calls > 0 && started.Add(1) > int64(calls) {
					break
				}
				t0 := time.Now()
				if err := p.Call(ctx, run, i); err != nil {
					fail(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return ProtocolLevel{}, first
	}
	slices.Sort(all)
	return ProtocolLevel{Calls: len(all), Elapsed: elapsed, Latencies: all}, ctx.Err()
}

// submit starts a run of the workload's agent.
func (p *Protocol) submit(ctx context.Context) (ledger.RunID, error) {
	var sub server.SubmitResponse
	key := "bench-" + strconv.FormatInt(p.seq.Add(1), 10)
	err := p.do(ctx, "/v1/runs", key, []byte(`{"agent":"`+ProtocolAgent+`","input":{}}`), http.StatusCreated, &sub)
	return sub.ID, err
}

// Call makes tool call i of run: propose, begin, complete.
func (p *Protocol) Call(ctx context.Context, run ledger.RunID, i int) error {
	var action struct {
		ID    ledger.ActionID    `json:"id"`
		State ledger.ActionState `json:"state"`
	}
	step := "step-" + strconv.Itoa(i)
	body := []byte(`{"tool":"` + ProtocolTool + `","arguments":{"i":` + strconv.Itoa(i) + `}}`)
	if err := p.do(ctx, "/v1/runs/"+string(run)+"/actions", step, body, http.StatusCreated, &action); err != nil {
		return fmt.Errorf("propose: %w", err)
	}
	if action.State != ledger.ActionApproved {
		return fmt.Errorf("propose: action %s is %s, not approved", action.ID, action.State)
	}
	var begun struct {
		Attempt struct {
			ID ledger.AttemptID `json:"id"`
		} `json:"attempt"`
		Token string `json:"attempt_token"`
	}
	if err := p.do(ctx, "/v1/actions/"+string(action.ID)+"/attempts", step, []byte(`{}`), http.StatusCreated, &begun); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	done, err := json.Marshal(map[string]any{"attempt_token": begun.Token, "status": "succeeded", "output": map[string]int{"i": i}})
	if err != nil {
		return err
	}
	if err := p.do(ctx, "/v1/attempts/"+string(begun.Attempt.ID)+"/complete", "", done, http.StatusOK, nil); err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	return nil
}

// do POSTs body to path, as RoundTrip does its requests (dev mode: no
// token), and decodes the answer into out, if not nil.
func (p *Protocol) do(ctx context.Context, path, key string, body []byte, want int, out any) error {
	return RoundTrip{URL: p.URL, Client: p.Client}.do(ctx, http.MethodPost, path, "", key, body, want, out)
}
