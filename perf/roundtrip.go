package perf

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// RoundTrip drives approval round trips over the HTTP API of a server
// whose engine has the practice-cards agent: one round trip submits the
// simulator's sample document, waits until the run's write action awaits
// approval, approves that digest and waits until the run is completed.
type RoundTrip struct {
	// URL is the server's base URL, Client the client that calls it.
	URL    string
	Client *http.Client
	// SubmitToken is the bearer token of the submit and of the reads of
	// the run, ApproveToken that of the approve; "" sends none (dev mode).
	SubmitToken, ApproveToken string
	// Advance, when set, moves the run each time the round trip waits for
	// it, and the run must then be in the state waited for. When nil, the
	// server's engine workers move it and the round trip reads the run
	// every millisecond until it is, for 30 seconds at most.
	Advance func(ctx context.Context, run ledger.RunID) error
}

// RoundTripTimes are one round trip's latencies.
type RoundTripTimes struct {
	Total   time.Duration // submit → approve → completed
	Approve time.Duration // the approve request alone
}

// RoundTripLatencies are the latencies of round trips one after another.
type RoundTripLatencies struct {
	Total, Approve []time.Duration
}

// pollEvery is how long a round trip waits between two reads of a run.
const pollEvery = time.Millisecond

// waitFor is how long a round trip waits for a run to reach a state.
const waitFor = 30 * time.Second

// Repeat makes round trips one after another, with idempotency keys
// bench-0, bench-1…, for d and at least minN of them, and reports every
// 25th.
func (rt RoundTrip) Repeat(ctx context.Context, d time.Duration, minN int, progress Progress) (RoundTripLatencies, error) {
	var out RoundTripLatencies
	start := time.Now()
	for i := 0; i < minN || time.Since(start) < d; i++ {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		t, err := rt.Once(ctx, "bench-"+strconv.Itoa(i))
		if err != nil {
			return out, err
		}
		out.Total, out.Approve = append(out.Total, t.Total), append(out.Approve, t.Approve)
		if (i+1)%25 == 0 {
			progress.printf("approval round trip: %d done", i+1)
		}
	}
	return out, nil
}

// Once makes one round trip, submitting with idempotency key key.
func (rt RoundTrip) Once(ctx context.Context, key string) (RoundTripTimes, error) {
	var out RoundTripTimes
	title, markdown := simulator.SampleDocument()
	body, err := json.Marshal(map[string]any{"agent": simulator.AgentName, "input": map[string]string{"title": title, "markdown": markdown}})
	if err != nil {
		return out, err
	}
	t0 := time.Now()
	var sub server.SubmitResponse
	if err := rt.do(ctx, http.MethodPost, "/v1/runs", rt.SubmitToken, key, body, http.StatusCreated, &sub); err != nil {
		return out, fmt.Errorf("submit: %w", err)
	}
	run, err := rt.wait(ctx, sub.ID, ledger.RunAwaitingApproval)
	if err != nil {
		return out, err
	}
	var pending *server.Action
	for j := range run.Actions {
		if run.Actions[j].State == ledger.ActionAwaitingApproval {
			pending = &run.Actions[j]
		}
	}
	if pending == nil {
		return out, fmt.Errorf("run %s awaits approval but no action does", run.ID)
	}
	decision, err := json.Marshal(server.DecisionRequest{ActionDigest: pending.ActionDigest, Reason: "bench"})
	if err != nil {
		return out, err
	}
	t1 := time.Now()
	if err := rt.do(ctx, http.MethodPost, "/v1/actions/"+string(pending.ID)+"/approve", rt.ApproveToken, "", decision, http.StatusOK, nil); err != nil {
		return out, fmt.Errorf("approve: %w", err)
	}
	out.Approve = time.Since(t1)
	if _, err := rt.wait(ctx, sub.ID, ledger.RunCompleted); err != nil {
		return out, err
	}
	out.Total = time.Since(t0)
	return out, nil
}

// do calls the API and decodes the answer into out, if not nil; an answer
// with another status than want is an error.
func (rt RoundTrip) do(ctx context.Context, method, path, token, key string, body []byte, want int, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, rt.URL+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := rt.Client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// wait reads the run until it is in state want; a terminal state that is
// not want is an error. With Advance set it advances the run and reads it
// once.
func (rt RoundTrip) wait(ctx context.Context, id ledger.RunID, want ledger.RunState) (*server.Run, error) {
	if rt.Advance != nil {
		if err := rt.Advance(ctx, id); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(waitFor)
	for {
		var run server.Run
		if err := rt.do(ctx, http.MethodGet, "/v1/runs/"+string(id), rt.SubmitToken, "", nil, http.StatusOK, &run); err != nil {
			return nil, err
		}
		switch {
		case run.State == want:
			return &run, nil
		case run.State.Terminal():
			return nil, fmt.Errorf("run %s ended %s (%s), waiting for %s", id, run.State, run.StopReason, want)
		case rt.Advance != nil:
			return nil, fmt.Errorf("run %s is %s once advanced, waiting for %s", id, run.State, want)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("run %s still %s after %s, waiting for %s", id, run.State, waitFor, want)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}
