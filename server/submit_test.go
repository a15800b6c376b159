package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

func TestSubmit(t *testing.T) {
	t.Parallel()
	t.Run("OK", func(t *testing.T) {
		e := newEnv(t, options{})
		res := e.submitRaw(t, "alice", "k1", submitBody(t))
		require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
		require.Empty(t, res.Header.Get(server.HeaderIdempotentReplayed))
		var sr server.SubmitResponse
		decode(t, res, &sr)
		require.Equal(t, "/v1/runs/"+string(sr.ID), res.Header.Get("Location"))
		require.Equal(t, map[string]string{"self": "/v1/runs/" + string(sr.ID)}, sr.Links)
		require.Equal(t, "acme", sr.Tenant)
		require.Equal(t, "practice-cards", sr.Agent)
		require.Equal(t, ledger.RunQueued, sr.State)
		require.True(t, sr.RequestDigest.Valid())
		run := e.run(t, sr.ID)
		require.Equal(t, "alice", run.SubmittedBy)
		require.Equal(t, run.RequestDigest, sr.RequestDigest)
		require.True(t, run.CreatedAt.Equal(sr.CreatedAt))
	})

	t.Run("ReplayIsByteIdentical", func(t *testing.T) {
		e := newEnv(t, options{})
		first := e.submitRaw(t, "alice", "k1", submitBody(t))
		require.Equal(t, http.StatusCreated, first.Status)
		// The run moves on; the replay still answers as the first did.
		var sr server.SubmitResponse
		decode(t, first, &sr)
		require.Equal(t, ledger.RunAwaitingApproval, e.advance(t, sr.ID).State)
		e.Clock.Advance(time.Hour)

		// Whitespace and key order do not change the request digest.
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(submitBody(t)), &m))
		reordered, err := json.MarshalIndent(m, "", "   ")
		require.NoError(t, err)
		for _, body := range []string{submitBody(t), string(reordered)} {
			again := e.submitRaw(t, "alice", "k1", body)
			require.Equal(t, http.StatusCreated, again.Status, string(again.Body))
			require.Equal(t, "true", again.Header.Get(server.HeaderIdempotentReplayed))
			require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
			require.Equal(t, string(first.Body), string(again.Body), "byte for byte")
		}
		require.Equal(t, 1, e.runCount(t))
	})

	t.Run("ErrKeyReusedWithOtherBody", func(t *testing.T) {
		e := newEnv(t, options{})
		id := e.submit(t, "alice", "k1")
		before := e.run(t, id)
		other := strings.Replace(submitBody(t), `"agent"`, `"budgets":{"max_steps":3},"agent"`, 1)
		res := e.submitRaw(t, "alice", "k1", other)
		requireProblem(t, res, http.StatusUnprocessableEntity, server.CodeIdempotencyKeyReused)
		require.Equal(t, 1, e.runCount(t), "nothing changed")
		require.Equal(t, before, e.run(t, id))
		events, err := e.Store.FindEvents(context.Background(), id)
		require.NoError(t, err)
		require.Len(t, events, 1)
	})

	t.Run("KeysArePerTenant", func(t *testing.T) {
		e := newEnv(t, options{})
		a := e.submit(t, "alice", "shared")
		b := e.submit(t, "eve", "shared")
		require.NotEqual(t, a, b)
		require.Equal(t, "globex", e.run(t, b).Tenant)
	})

	t.Run("Budgets", func(t *testing.T) {
		e := newEnv(t, options{})
		body := strings.Replace(submitBody(t), `"agent"`, `"budgets":{"max_attempts_per_action":2,"max_attempts_per_run":5,`+
			`"max_execution_ms":60000,"deadline_ms":600000,"max_steps":20,"max_tokens":5000},"agent"`, 1)
		first := e.submitRaw(t, "alice", "b1", body)
		require.Equal(t, http.StatusCreated, first.Status, string(first.Body))
		var sr server.SubmitResponse
		decode(t, first, &sr)
		run := e.run(t, sr.ID)
		require.Equal(t, ledger.BudgetLimits{MaxAttemptsPerAction: 2, MaxAttemptsPerRun: 5, MaxExecution: time.Minute,
			MaxSteps: 20, MaxTokens: 5000, DeadlineAfter: 10 * time.Minute}, run.Budget.Limits)
		require.NotNil(t, run.Budget.Deadline)
		require.True(t, run.Budget.Deadline.Equal(run.CreatedAt.Add(10*time.Minute)))

		// On the wire, durations are milliseconds as submitted: the same
		// numbers come back, and the deadline is the time it fixed.
		got := e.get(t, "alice", "/v1/runs/"+string(sr.ID))
		require.Equal(t, http.StatusOK, got.Status, string(got.Body))
		var raw struct {
			Budget struct {
				Limits map[string]json.RawMessage `json:"limits"`
				Used   map[string]json.RawMessage `json:"used"`
			} `json:"budget"`
		}
		require.NoError(t, json.Unmarshal(got.Body, &raw))
		require.JSONEq(t, `60000`, string(raw.Budget.Limits["max_execution_ms"]))
		require.JSONEq(t, `2`, string(raw.Budget.Limits["max_attempts_per_action"]))
		require.JSONEq(t, `20`, string(raw.Budget.Limits["max_steps"]))
		require.JSONEq(t, `0`, string(raw.Budget.Used["execution_ms"]))
		var wire server.Run
		decode(t, got, &wire)
		require.Equal(t, server.BudgetLimits{MaxAttemptsPerAction: 2, MaxAttemptsPerRun: 5, MaxExecutionMS: 60000,
			Deadline: wire.Budget.Limits.Deadline, MaxSteps: 20, MaxTokens: 5000}, wire.Budget.Limits)
		require.NotNil(t, wire.Budget.Limits.Deadline)
		require.True(t, wire.Budget.Limits.Deadline.Equal(run.CreatedAt.Add(10*time.Minute)))

		// The deadline is relative in the request, so a replay later is
		// still the same request.
		e.Clock.Advance(time.Minute)
		again := e.submitRaw(t, "alice", "b1", body)
		require.Equal(t, http.StatusCreated, again.Status, string(again.Body))
		require.Equal(t, "true", again.Header.Get(server.HeaderIdempotentReplayed))
		require.Equal(t, string(first.Body), string(again.Body))
	})

	t.Run("AdminMaySubmit", func(t *testing.T) {
		e := newEnv(t, options{})
		require.Equal(t, "root", e.run(t, e.submit(t, "root", "k1")).SubmittedBy)
	})

	t.Run("ErrUnknownAgent", func(t *testing.T) {
		e := newEnv(t, options{})
		res := e.submitRaw(t, "alice", "k1", `{"agent":"no-such-agent","input":{}}`)
		p := requireProblem(t, res, http.StatusBadRequest, "invalid")
		require.Equal(t, "unknown agent", p.Detail)
		requireLocation(t, p, "/agent", "no-such-agent")
		require.Zero(t, e.runCount(t))
	})
}

func TestSubmitIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	for name, values := range map[string][]string{
		"missing":       nil,
		"empty":         {""},
		"repeated":      {"k1", "k1"},
		"repeated/diff": {"k1", "k2"},
		"too long":      {strings.Repeat("k", 256)},
		"non-printable": {"k\x01ey"},
		"non-ascii":     {"clé"},
		"tab":           {"k\tey"},
	} {
		t.Run("Err/"+name, func(t *testing.T) {
			// Straight to the handler: net/http's client and server refuse
			// control characters in header values before any handler runs.
			req := httptest.NewRequest(http.MethodPost, "/v1/runs", strings.NewReader(submitBody(t)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+e.tokens["alice"])
			req.Header["Idempotency-Key"] = values
			requireProblem(t, e.direct(t, req), http.StatusBadRequest, server.CodeIdempotencyKeyInvalid)
		})
	}
	require.Zero(t, e.runCount(t))
	t.Run("Longest", func(t *testing.T) {
		e.submit(t, "alice", strings.Repeat("k", 255))
	})
	t.Run("PrintableASCII", func(t *testing.T) {
		e.submit(t, "alice", ` !"#$%&'()*+,-./0123456789:;<=>?@AZ[\]^_`+"`az{|}~")
	})
}

func TestSubmitBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{config: func(c *server.Config) { c.MaxBodyBytes = 4096 }})
	send := func(t *testing.T, body string, header map[string][]string) response {
		t.Helper()
		if header == nil {
			header = map[string][]string{}
		}
		header["Idempotency-Key"] = []string{"k-" + t.Name()}
		return e.send(t, request{principal: "alice", method: http.MethodPost, path: "/v1/runs", body: body, header: header})
	}
	// nest wraps an input object n levels deep; the body's own object and
	// input make two more.
	nest := func(n int) string {
		return `{"agent":"practice-cards","input":` + strings.Repeat(`{"a":`, n) + `{}` + strings.Repeat(`}`, n) + `}`
	}

	t.Run("ErrTooLarge", func(t *testing.T) {
		big := `{"agent":"practice-cards","input":{"markdown":"` + strings.Repeat("x", 5000) + `"}}`
		requireProblem(t, send(t, big, nil), http.StatusRequestEntityTooLarge, server.CodePayloadTooLarge)
	})
	t.Run("ErrTooLargeChunked", func(t *testing.T) {
		big := `{"agent":"practice-cards","input":{"markdown":"` + strings.Repeat("x", 5000) + `"}}`
		req, err := http.NewRequest(http.MethodPost, e.ts.URL+"/v1/runs", io.MultiReader(strings.NewReader(big)))
		require.NoError(t, err)
		// An unknown length (ContentLength 0 with a body) goes out chunked.
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+e.tokens["alice"])
		req.Header.Set("Idempotency-Key", "chunked")
		requireProblem(t, e.roundTrip(t, req), http.StatusRequestEntityTooLarge, server.CodePayloadTooLarge)
	})
	for name, ct := range map[string][]string{
		"none":        {},
		"text":        {"text/plain"},
		"form":        {"application/x-www-form-urlencoded"},
		"json-like":   {"application/json-seq"},
		"latin1":      {"application/json; charset=latin1"},
		"other param": {"application/json; profile=x"},
	} {
		t.Run("ErrMediaType/"+name, func(t *testing.T) {
			res := send(t, submitBody(t), map[string][]string{"Content-Type": ct})
			requireProblem(t, res, http.StatusUnsupportedMediaType, server.CodeUnsupportedMediaType)
		})
	}
	t.Run("CharsetUTF8", func(t *testing.T) {
		res := send(t, submitBody(t), map[string][]string{"Content-Type": {"application/json; charset=UTF-8"}})
		require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	})
	for name, body := range map[string]string{
		"malformed":                  `{"agent": "practice-cards", "input": {`,
		"duplicate key":              `{"agent":"practice-cards","agent":"practice-cards","input":{}}`,
		"duplicate key inside input": `{"agent":"practice-cards","input":{"title":"a","title":"b"}}`,
		"depth 33":                   nest(31),
		"trailing data":              `{"agent":"practice-cards","input":{}} {}`,
		"empty":                      ` `,
	} {
		t.Run("ErrInvalidJSON/"+name, func(t *testing.T) {
			requireProblem(t, send(t, body, nil), http.StatusBadRequest, server.CodeInvalidJSON)
		})
	}
	t.Run("Depth32", func(t *testing.T) {
		res := send(t, nest(30), nil)
		require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	})
	for name, tc := range map[string]struct{ body, loc, msg string }{
		"unknown field":       {`{"agent":"practice-cards","input":{},"priority":1}`, "/priority", "unknown field"},
		"unknown budget":      {`{"agent":"practice-cards","input":{},"budgets":{"max_retries":1}}`, "/budgets/max_retries", "unknown field"},
		"server-owned state":  {`{"agent":"practice-cards","input":{},"state":"completed"}`, "/state", "set by the server"},
		"server-owned tenant": {`{"agent":"practice-cards","input":{},"tenant":"globex"}`, "/tenant", "set by the server"},
		"server-owned id":     {`{"agent":"practice-cards","input":{},"id":"run_x"}`, "/id", "set by the server"},
		"server-owned digest": {`{"agent":"practice-cards","input":{},"request_digest":"sha256:00"}`, "/request_digest", "set by the server"},
		"missing input":       {`{"agent":"practice-cards"}`, "/input", "required"},
		"input not an object": {`{"agent":"practice-cards","input":"text"}`, "/input", "object"},
		"zero budget":         {`{"agent":"practice-cards","input":{},"budgets":{"max_steps":0}}`, "/budgets/max_steps", ""},
		"fractional integer":  {`{"agent":"practice-cards","input":{},"budgets":{"max_steps":5.0}}`, "/budgets/max_steps", "integer"},
		"schema version 2":    {`{"schema_version":"2.0","agent":"practice-cards","input":{}}`, "/schema_version", "not supported"},
		"not an object":       {`["practice-cards"]`, "", ""},
	} {
		t.Run("ErrSchema/"+name, func(t *testing.T) {
			p := requireProblem(t, send(t, tc.body, nil), http.StatusBadRequest, server.CodeSchemaViolation)
			requireLocation(t, p, tc.loc, tc.msg)
		})
	}
	require.Equal(t, 2, e.runCount(t), "only the two good bodies made runs")
}

// TestSubmitInProgress holds the first submit inside the server (after its
// key is marked in flight, before the store) and sends the same key again.
func TestSubmitInProgress(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	hook := func() {
		first := false
		once.Do(func() { first = true })
		if first {
			close(entered)
			<-release
		}
	}
	e := newEnv(t, options{config: func(c *server.Config) { server.SetBeforeSubmit(c, hook) }})

	firstDone := make(chan response, 1)
	go func() { firstDone <- e.submitRaw(t, "alice", "slow", submitBody(t)) }()
	<-entered

	res := e.submitRaw(t, "alice", "slow", submitBody(t))
	requireProblem(t, res, http.StatusConflict, server.CodeRequestInProgress)
	require.Equal(t, "1", res.Header.Get("Retry-After"))
	// Another tenant's same key is another request.
	require.Equal(t, http.StatusCreated, e.submitRaw(t, "eve", "slow", submitBody(t)).Status)
	// Another key of the same tenant is not held up.
	require.Equal(t, http.StatusCreated, e.submitRaw(t, "alice", "fast", submitBody(t)).Status)

	close(release)
	first := <-firstDone
	require.Equal(t, http.StatusCreated, first.Status, string(first.Body))
	require.Empty(t, first.Header.Get(server.HeaderIdempotentReplayed))

	again := e.submitRaw(t, "alice", "slow", submitBody(t))
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, "true", again.Header.Get(server.HeaderIdempotentReplayed))
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, 3, e.runCount(t))

	fams := scrape(t, e)
	require.Equal(t, 1.0, value(sample(t, fams, "ledger_submit_key_conflicts_total", map[string]string{"kind": "in_progress"})))
	require.Equal(t, 1.0, value(sample(t, fams, "ledger_submit_replays_total", nil)))
}

func TestSubmitConcurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	const n = 50
	statuses := make(chan int, n)
	bodies := make(chan string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			res := e.submitRaw(t, "alice", "same", submitBody(t))
			statuses <- res.Status
			if res.Status == http.StatusCreated {
				bodies <- string(res.Body)
			}
		})
	}
	close(start)
	wg.Wait()
	close(statuses)
	close(bodies)
	created := 0
	for s := range statuses {
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, s)
		if s == http.StatusCreated {
			created++
		}
	}
	require.Positive(t, created)
	var first string
	for b := range bodies {
		if first == "" {
			first = b
		}
		require.Equal(t, first, b, "every 201 is the same answer")
	}
	require.Equal(t, 1, e.runCount(t), "exactly one run")
}
