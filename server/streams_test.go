package server_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// Waiting on the server costs it little and is capped: an event stream
// reads only what is new, each principal holds a bounded number of streams
// and long-polls (429 beyond), a stream's header is sent at once, and a
// stream ends once its token is revoked.

// eventsRead counts the events a real store hands out through FindEvents
// and FindEventsAfter: what the server read of the events table. Each read
// of a run (a stream's look at the run's head, once a poll) is signalled
// on polls, if set, without blocking.
type eventsRead struct {
	ledger.Store
	n     *atomic.Int64
	polls chan struct{}
}

func (s eventsRead) FindRunByID(ctx context.Context, id ledger.RunID) (*ledger.Run, error) {
	r, err := s.Store.FindRunByID(ctx, id)
	select {
	case s.polls <- struct{}{}:
	default:
	}
	return r, err
}

// polled waits until the stream has looked at the run n more times.
func (s eventsRead) polled(t *testing.T, n int) {
	t.Helper()
	for len(s.polls) > 0 {
		<-s.polls
	}
	for range n {
		select {
		case <-s.polls:
		case <-time.After(5 * time.Second): // a bound on the wait, not a pause
			t.Fatalf("the stream did not poll the run %d times within 5 s", n)
		}
	}
}

func (s eventsRead) FindEvents(ctx context.Context, run ledger.RunID) ([]*ledger.Event, error) {
	evs, err := s.Store.FindEvents(ctx, run)
	s.n.Add(int64(len(evs)))
	return evs, err
}

func (s eventsRead) FindEventsAfter(ctx context.Context, f ledger.EventFilter) ([]*ledger.Event, error) {
	evs, err := s.Store.FindEventsAfter(ctx, f)
	s.n.Add(int64(len(evs)))
	return evs, err
}

// stream is one event stream as a client reads it, straight from the
// server's handler (the validating server answers only once the handler
// is done).
type stream struct {
	res    *http.Response
	r      *bufio.Reader
	cancel context.CancelFunc
}

// rawServer serves e's handler without the document check, for answers
// read while they are written; closed when the test ends.
func rawServer(t *testing.T, e *env) (*httptest.Server, *http.Client) {
	t.Helper()
	raw := httptest.NewServer(e.srv.Handler())
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		raw.Close()
	})
	return raw, client
}

// openStream opens an event stream of run as principal from after
// (Last-Event-ID, if not negative) and returns it once its header has
// arrived, or the answer if it is not 200; the stream is closed when the
// test ends. The header must arrive within 5 s.
func openStream(t *testing.T, e *env, raw *httptest.Server, client *http.Client, principal string, run ledger.RunID, after int64) (*stream, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw.URL+"/v1/runs/"+string(run)+"/events", nil)
	require.NoError(t, err)
	if tok, ok := e.tokens[principal]; ok {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if after >= 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	}
	timer := time.AfterFunc(5*time.Second, cancel) // a bound on the wait for the header
	res, err := client.Do(req)
	stopped := timer.Stop()
	require.NoError(t, err, "the stream's header within 5 s")
	require.True(t, stopped)
	if res.StatusCode != http.StatusOK {
		cancel()
		return nil, res
	}
	s := &stream{res: res, r: bufio.NewReader(res.Body), cancel: cancel}
	t.Cleanup(s.close)
	return s, res
}

func (s *stream) close() {
	s.cancel()
	_ = s.res.Body.Close()
}

// next reads the stream's next event, within d; io.EOF once it has ended.
func (s *stream) next(t *testing.T, d time.Duration) (sse, error) {
	t.Helper()
	type read struct {
		ev  sse
		err error
	}
	got := make(chan read, 1)
	go func() {
		ev, err := readSSE(s.r)
		got <- read{ev, err}
	}()
	select {
	case r := <-got:
		return r.ev, r.err
	case <-time.After(d): // a bound on the wait for the event
		s.close() // ends the read
		<-got
		t.Fatalf("no event and no end of the stream within %s", d)
		return sse{}, nil
	}
}

// getWithin is e.get through the validating server, failing the test if
// no answer comes within 5 s (a stream or long-poll not refused would
// otherwise hold the test).
func getWithin(t *testing.T, e *env, principal, path string, header map[string][]string) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+e.tokens[principal])
	for k, vs := range header {
		req.Header[k] = vs
	}
	return e.roundTrip(t, req)
}

// until calls cond, on the test's goroutine, until it holds, for at most
// 5 s. It asks again every third of a poll interval: what it waits for
// (a slot given back once the server sees a client leave) shows only in
// the answer to a new request, with no event to wait on.
func until(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(pollInterval / 3) { // no event: only a new request shows it
		require.True(t, time.Now().Before(deadline), "not within 5 s: %s", what)
	}
}

// longPoll starts a GET of url as principal, straight to the server, and
// returns its cancel and, once it is answered, its status (0 if it failed).
func longPoll(t *testing.T, e *env, client *http.Client, url, principal string) (context.CancelFunc, <-chan int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+e.tokens[principal])
	status := make(chan int, 1)
	go func() {
		res, err := client.Do(req)
		if err != nil {
			status <- 0
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		status <- res.StatusCode
	}()
	return cancel, status
}

// pollInterval is the server's: how often a stream reads the store.
const pollInterval = 150 * time.Millisecond

// TestEventStreamReadsOnlyNewEvents: an open stream reads, each time it
// looks, only the events it has not sent: nothing while the run is idle,
// the one new event when one is written — never the run's history again.
func TestEventStreamReadsOnlyNewEvents(t *testing.T) {
	t.Parallel()
	var read atomic.Int64
	store := eventsRead{n: &read, polls: make(chan struct{}, 64)}
	e := newProtocolEnv(t, options{config: func(c *server.Config) { store.Store = c.Store; c.Store = store }})
	run := e.clientRun(t, "ada", "s1")
	for range 20 {
		_, err := e.Store.AddUsage(t.Context(), ledger.AddUsageParams{RunID: run, Steps: 1, Tokens: 1})
		require.NoError(t, err)
	}
	head := e.run(t, run).EventSeq
	raw, client := rawServer(t, e)

	s, _ := openStream(t, e, raw, client, "ada", run, head-1)
	ev, err := s.next(t, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, head, ev.ID)
	require.LessOrEqual(t, read.Load(), int64(1), "the first read: the one event after Last-Event-ID")

	before := read.Load()
	store.polled(t, 4)
	require.Equal(t, before, read.Load(), "an idle stream reads no event again")

	_, err = e.Store.AddUsage(t.Context(), ledger.AddUsageParams{RunID: run, Steps: 1, Tokens: 1})
	require.NoError(t, err)
	ev, err = s.next(t, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, head+1, ev.ID)
	store.polled(t, 2)
	require.Equal(t, before+1, read.Load(), "the new event, read once")
}

// TestEventStreamHeaderAtOnce: the stream's 200 and header reach the
// client before any event, also on a run with nothing new to send.
func TestEventStreamHeaderAtOnce(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "h1")
	raw, client := rawServer(t, e)
	s, res := openStream(t, e, raw, client, "ada", run, e.run(t, run).EventSeq) // fails if not within 5 s
	require.NotNil(t, s, "status %d", res.StatusCode)
	require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
}

// TestEventStreamCap: a principal holds at most Config.MaxStreams open
// streams; one more is 429 too_many_streams with Retry-After (checked
// against the document), while other principals are not held up; every
// stream that ends gives its slot back, however it ends.
func TestEventStreamCap(t *testing.T) {
	t.Parallel()
	const capN = 2
	e := newProtocolEnv(t, options{config: func(c *server.Config) { c.MaxStreams = capN }})
	run := e.clientRun(t, "ada", "c1")
	head := e.run(t, run).EventSeq
	raw, client := rawServer(t, e)
	path := "/v1/runs/" + string(run) + "/events"
	refused := func(t *testing.T, principal string) {
		t.Helper()
		res := getWithin(t, e, principal, path, map[string][]string{"Last-Event-ID": {strconv.FormatInt(head, 10)}})
		requireProblem(t, res, http.StatusTooManyRequests, server.CodeTooManyStreams)
		require.Equal(t, strconv.Itoa(server.WaitRetryAfter), res.Header.Get("Retry-After"))
	}
	open := func(t *testing.T) []*stream {
		t.Helper()
		var out []*stream
		for range capN {
			// A slot given back is free once the server has seen its
			// client leave: within a poll interval. That shows only in
			// the answer to a new stream, so it is asked again (until).
			var got *stream
			until(t, func() bool {
				s, res := openStream(t, e, raw, client, "ada", run, head)
				if s == nil {
					require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
					require.NoError(t, res.Body.Close())
				}
				got = s
				return s != nil
			}, "a slot given back")
			out = append(out, got)
		}
		return out
	}

	first := open(t)
	refused(t, "ada")
	refused(t, "ada")
	other, _ := openStream(t, e, raw, client, "root", run, head)
	require.NotNil(t, other, "the cap is each principal's")

	t.Run("ClientLeaves", func(t *testing.T) {
		for _, s := range first {
			s.close()
		}
		again := open(t)
		refused(t, "ada")
		for _, s := range again {
			s.close()
		}
	})
	t.Run("RunEnds", func(t *testing.T) {
		streams := open(t)
		res := e.post(t, "ada", "/v1/runs/"+string(run)+"/finish", `{"outcome":"completed"}`)
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		for _, s := range streams {
			for {
				_, err := s.next(t, 5*time.Second)
				if errors.Is(err, io.EOF) {
					break
				}
				require.NoError(t, err)
			}
		}
		// The run has ended: a stream sends what is left and ends, and
		// holds its slot no longer.
		for range 3 * capN {
			res := e.get(t, "ada", path)
			require.Equal(t, http.StatusOK, res.Status, string(res.Body))
			require.NotEmpty(t, parseSSE(t, res.Body))
		}
	})
}

// TestEventStreamCapDevMode: in dev mode every request is the one
// principal dev, and the cap holds it too. A negative cap is refused.
func TestEventStreamCapDevMode(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{dev: true, config: func(c *server.Config) { c.MaxStreams = 1 }})
	for _, cfg := range []server.Config{{MaxStreams: -1}, {MaxLongPolls: -1}} {
		cfg.Store, cfg.Engine, cfg.Approvals = e.Store, e.engine, e.approvals
		_, err := server.New(cfg)
		require.ErrorContains(t, err, "MaxStreams and MaxLongPolls")
	}

	run := e.clientRun(t, "", "d1")
	head := e.run(t, run).EventSeq
	raw, client := rawServer(t, e)
	s, _ := openStream(t, e, raw, client, "dev", run, head)
	require.NotNil(t, s)
	_, res := openStream(t, e, raw, client, "dev", run, head)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.NoError(t, res.Body.Close())
}

// TestLongPollCap: a principal holds at most Config.MaxLongPolls waiting
// long-polls; one more is 429 too_many_long_polls with Retry-After, a
// request that would not wait (another version) is answered as ever, and
// a long-poll whose client leaves gives its slot back.
func TestLongPollCap(t *testing.T) {
	t.Parallel()
	const capN = 2
	e := newProtocolEnv(t, options{config: func(c *server.Config) { c.MaxLongPolls = capN }})
	run := e.clientRun(t, "ada", "l1")
	a := e.proposeOK(t, run, "pay-1", toolQuery, `{"to":"acct_1","cents":500}`)
	require.Equal(t, ledger.ActionAwaitingApproval, a.State)
	path := "/v1/actions/" + string(a.ID)
	cur := e.get(t, "ada", path)
	require.Equal(t, http.StatusOK, cur.Status)
	decode(t, cur, &a) // its version now
	wait := path + "?wait=30s&version=" + strconv.FormatInt(a.Version, 10)
	// A probe waits briefly if it gets a slot.
	probe := path + "?wait=0.1&version=" + strconv.FormatInt(a.Version, 10)
	raw, client := rawServer(t, e)

	poll := func(t *testing.T) (context.CancelFunc, <-chan int) {
		return longPoll(t, e, client, raw.URL+wait, "ada")
	}
	// waiting starts capN long-polls, one after another, each seen
	// waiting (not answered, refused or not, within two poll intervals).
	waiting := func(t *testing.T) []context.CancelFunc {
		var cancels []context.CancelFunc
		for range capN {
			cancel, status := poll(t)
			cancels = append(cancels, cancel)
			// That it waits (and holds its slot) shows only as no
			// answer: two poll intervals without one.
			select {
			case st := <-status:
				t.Fatalf("a long-poll was answered %d instead of waiting", st)
			case <-time.After(2 * pollInterval): // waiting shows only as no answer
			}
		}
		return cancels
	}

	cancels := waiting(t)
	res := getWithin(t, e, "ada", wait, nil)
	requireProblem(t, res, http.StatusTooManyRequests, server.CodeTooManyLongPolls)
	require.Equal(t, strconv.Itoa(server.WaitRetryAfter), res.Header.Get("Retry-After"))
	other := e.get(t, "ada", path+"?wait=30s&version="+strconv.FormatInt(a.Version+1, 10))
	require.Equal(t, http.StatusOK, other.Status, "a request that does not wait takes no slot")
	require.Equal(t, http.StatusOK, getWithin(t, e, "root", probe, nil).Status, "the cap is each principal's")

	for _, c := range cancels {
		c()
	}
	// Given back: within a poll interval of the clients leaving.
	until(t, func() bool { return getWithin(t, e, "ada", probe, nil).Status == http.StatusOK }, "the slots are given back")
	for _, c := range waiting(t) {
		c()
	}
}

// TestEventStreamEndsWhenTokenRevoked: once the tokens are reloaded
// (LoadTokens and SetTokens, as serve does on SIGHUP) without the token a
// stream was opened with, the stream ends, and a long-poll waiting with it
// is answered 401; a stream whose token is still in force goes on.
func TestEventStreamEndsWhenTokenRevoked(t *testing.T) {
	t.Parallel()
	e := newProtocolEnv(t, options{})
	run := e.clientRun(t, "ada", "r1")
	a := e.proposeOK(t, run, "r1", toolRead, `{"q":"balance"}`)
	require.Equal(t, ledger.ActionApproved, a.State)
	head := e.run(t, run).EventSeq
	raw, client := rawServer(t, e)
	revoked, _ := openStream(t, e, raw, client, "ada", run, head)
	require.NotNil(t, revoked)
	kept, _ := openStream(t, e, raw, client, "root", run, head)
	require.NotNil(t, kept)

	_, polled := longPoll(t, e, client, raw.URL+"/v1/actions/"+string(a.ID)+"?wait=30s&version="+strconv.FormatInt(a.Version, 10), "ada")
	// That it waits shows only as no answer: two poll intervals without one.
	select {
	case st := <-polled:
		t.Fatalf("the long-poll was answered %d before the tokens changed", st)
	case <-time.After(2 * pollInterval): // waiting shows only as no answer
	}

	// The tokens file again, without ada's.
	var f server.TokensFile
	for name, tok := range e.tokens {
		if name == "ada" {
			continue
		}
		p := principals[name]
		f.Tokens = append(f.Tokens, server.TokenEntry{SHA256: server.HashToken(tok), Principal: name, Tenant: p.tenant,
			Roles: p.roles, Agents: p.agents})
	}
	require.NoError(t, e.srv.SetTokens(loadTokensFile(t, f)))

	_, err := revoked.next(t, 5*time.Second)
	require.ErrorIs(t, err, io.EOF, "the revoked token's stream ends")
	select {
	case st := <-polled:
		require.Equal(t, http.StatusUnauthorized, st, "the revoked token's long-poll")
	case <-time.After(5 * time.Second): // a bound on the wait for the answer
		t.Fatal("the revoked token's long-poll still waits")
	}
	requireProblem(t, e.get(t, "ada", "/v1/runs/"+string(run)+"/events"), http.StatusUnauthorized, "unauthorized")

	// root's stream is still open: it delivers the next event.
	_, err = e.Store.AddUsage(t.Context(), ledger.AddUsageParams{RunID: run, Steps: 1, Tokens: 1})
	require.NoError(t, err)
	ev, err := kept.next(t, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, head+1, ev.ID)
}
