package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/ledger"
)

// Waiting for the ledger over HTTP: the long-poll of GET
// /v1/actions/{action_id}?wait=&version= and the Server-Sent Events of GET
// /v1/runs/{run_id}/events. Both read the store again at an interval
// rather than wait for a notification, so they see every writer's
// changes, this process's or another's. What one such read costs does not
// grow with the run: a long-poll reads its action, a stream its run's head
// and, only when the head has moved, the events after the last one it
// sent. Each identity holds a bounded number of each at once
// (Config.MaxStreams, Config.MaxLongPolls), and both end once the token
// they came with is no longer in force.

const (
	// MaxWait bounds the wait of a long-poll.
	MaxWait = 60 * time.Second
	// pollInterval is how often a long-poll or an event stream reads the
	// store again.
	pollInterval = 150 * time.Millisecond
	// keepAliveInterval is how long an event stream may stay silent
	// before it sends a comment, so that proxies keep it open and a client
	// that left is noticed.
	keepAliveInterval = 15 * time.Second
	// streamWriteTimeout bounds each write of a long-poll's answer and of
	// an event stream, in place of the server's write timeout, which a
	// wait of MaxWait or a stream would outlast.
	streamWriteTimeout = 30 * time.Second
	// eventsPage is how many events a stream reads at a time.
	eventsPage = 256
)

// slots counts what each identity (a principal in its tenant) holds open
// at once of one kind, event streams or waiting long-polls, up to max
// each; max 0 is no cap.
type slots struct {
	max  int
	code string // the problem code of a refusal
	what string // what is held, plural, for the problem's detail

	mu   sync.Mutex
	held map[string]int // by identity; a key at 0 is deleted
}

func newSlots(maxN int, code, what string) *slots {
	return &slots{max: maxN, code: code, what: what, held: map[string]int{}}
}

// take takes one of id's slots and returns the function that gives it
// back (once, however often it is called); with none left it is 429 code
// with Retry-After.
func (l *slots) take(id Identity) (release func(), err error) {
	if l.max <= 0 {
		return func() {}, nil
	}
	k := id.key()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[k] >= l.max {
		return nil, &apiError{code: l.code, header: retryAfter(WaitRetryAfter),
			detail: fmt.Sprintf("this principal has %d %s open, the most the server allows; retry after %ds", l.max, l.what, WaitRetryAfter)}
	}
	l.held[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.held[k]--; l.held[k] <= 0 {
				delete(l.held, k)
			}
		})
	}, nil
}

// waitQuery is a long-poll's parameters: wait for a version other than
// version, for at most wait. ok is false when the request does not ask
// to wait (either is absent, or wait is 0).
type waitQuery struct {
	wait    time.Duration
	version int64
	ok      bool
}

// parseWait reads wait (a Go duration or a number of seconds, 0 to
// MaxWait) and version (a non-negative integer); a bad value is 400.
func parseWait(c echo.Context) (waitQuery, error) {
	var q waitQuery
	wv, vv := c.QueryParam("wait"), c.QueryParam("version")
	if wv != "" {
		d, err := parseWaitDuration(wv)
		if err != nil {
			return q, badQuery("wait", err.Error())
		}
		q.wait = d
	}
	if vv != "" {
		n, err := strconv.ParseInt(vv, 10, 64)
		if err != nil || n < 0 {
			return q, badQuery("version", "version must be a non-negative integer")
		}
		q.version = n
	}
	q.ok = wv != "" && vv != "" && q.wait > 0
	return q, nil
}

func parseWaitDuration(v string) (time.Duration, error) {
	var d time.Duration
	if f, err := strconv.ParseFloat(v, 64); err == nil && !strings.ContainsAny(v, "xXpPiInN") {
		if f < 0 || f > MaxWait.Seconds() {
			return 0, fmt.Errorf("wait must be 0 to %d seconds", int(MaxWait.Seconds()))
		}
		d = time.Duration(math.Round(f * float64(time.Second)))
	} else {
		var perr error
		if d, perr = time.ParseDuration(v); perr != nil {
			return 0, errors.New("wait must be a duration such as 30s, or a number of seconds")
		}
	}
	if d < 0 || d > MaxWait {
		return 0, fmt.Errorf("wait must be 0 to %s", MaxWait)
	}
	return d, nil
}

// waitAction answers a long-poll: a at once if its version is not
// q.version (or the request does not wait), else the action as it stands
// once its version changes or the wait ends, whichever comes first. A
// client that leaves ends the wait.
func (s *Server) waitAction(c echo.Context, q waitQuery, a *ledger.Action) (*ledger.Action, error) {
	if !q.ok || a.Version != q.version {
		return a, nil
	}
	id, _ := identityFrom(c) // there: getAction's needRole found it
	release, err := s.longPolls.take(id)
	if err != nil {
		return nil, err
	}
	defer release()
	inForce := s.tokenInForce(c, id)
	s.extendWriteDeadline(c, q.wait+streamWriteTimeout)
	ctx := c.Request().Context()
	timer := time.NewTimer(q.wait)
	defer timer.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return a, nil // nobody reads the answer
		case <-timer.C:
			return s.store.FindActionByID(ctx, a.ID)
		case <-tick.C:
			if !inForce() {
				return nil, &apiError{code: CodeUnauthorized, detail: "the token was revoked while the request waited"}
			}
			cur, err := s.store.FindActionByID(ctx, a.ID)
			if err != nil {
				return nil, err
			}
			if cur.Version != q.version {
				return cur, nil
			}
		}
	}
}

// extendWriteDeadline lets the answer be written d from now, whatever
// the server's write timeout; a writer that cannot say (a test's
// recorder) is left as it is.
func (s *Server) extendWriteDeadline(c echo.Context, d time.Duration) {
	_ = http.NewResponseController(c.Response()).SetWriteDeadline(s.now().Add(d))
}

// lastEventID reads the Last-Event-ID header: the seq after which the
// stream resumes, 0 when absent.
func lastEventID(r *http.Request) (int64, error) {
	vals := r.Header.Values("Last-Event-ID")
	switch {
	case len(vals) == 0:
		return 0, nil
	case len(vals) > 1:
		return 0, badHeader("Last-Event-ID", "send at most one Last-Event-ID header")
	}
	n, err := strconv.ParseInt(strings.TrimSpace(vals[0]), 10, 64)
	if err != nil || n < 0 {
		return 0, badHeader("Last-Event-ID", "Last-Event-ID must be the seq of an event, a non-negative integer")
	}
	return n, nil
}

func badHeader(name, msg string) error {
	return &apiError{code: string(ledger.CodeInvalid), detail: "invalid header " + name,
		fields: []FieldError{{Location: name, Message: msg}}}
}

// streamEvents is GET /v1/runs/{run_id}/events: the run's events, oldest
// first, as Server-Sent Events (id: the seq, event: the type, data: the
// timeline entry, redacted as /timeline redacts it), from after
// Last-Event-ID. The 200 and its header go out at once; then every
// pollInterval it reads the run's head and, if the head has moved past the
// last event sent, the events after that one, a page at a time. It ends
// once the run has ended and every event up to the run's head then has
// been sent, or once the token it was opened with is no longer in force
// (SetTokens). Each identity holds at most Config.MaxStreams open (429
// too_many_streams beyond). A HEAD request is answered as its GET, the
// body left out (observe), so it too ends when the run has ended.
func (s *Server) streamEvents(c echo.Context) error {
	caller, err := s.caller(c)
	if err != nil {
		return err
	}
	runID, err := pathID(c, "run_id", "run")
	if err != nil {
		return err
	}
	after, err := lastEventID(c.Request())
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	if _, err := s.drivableRun(ctx, caller, runID); err != nil {
		return err
	}
	id, _ := identityFrom(c) // there: caller's needRole found it
	release, err := s.streams.take(id)
	if err != nil {
		return err
	}
	defer release()
	inForce := s.tokenInForce(c, id)
	res := c.Response()
	h := res.Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	res.WriteHeader(http.StatusOK)
	// Flushed through the writer Echo wraps: Echo's own Flush panics on a
	// writer that cannot flush (a test's recorder), where this reports
	// ErrNotSupported.
	rc := http.NewResponseController(res.Writer)
	flush := func() error {
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return fmt.Errorf("events of %s: flush: %w", runID, err)
		}
		return nil
	}
	// The header at once: the client sees the stream open before the
	// first read, also when nothing is new.
	if err := flush(); err != nil {
		return streamErr(ctx, err)
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	silent := time.Duration(0)
	for {
		if !inForce() {
			return nil // its token was revoked
		}
		_ = rc.SetWriteDeadline(s.now().Add(streamWriteTimeout))
		// The run first: every event up to its head is in what follows,
		// and with nothing new there is nothing more to read.
		run, err := s.store.FindRunByID(ctx, ledger.RunID(runID))
		if err != nil {
			return streamErr(ctx, err)
		}
		sent := false
		if run.EventSeq > after {
			if sent, err = s.writeEvents(c, run.ID, &after, run.EventSeq); err != nil {
				return streamErr(ctx, err)
			}
		}
		switch {
		case sent:
			silent = 0
		case silent >= keepAliveInterval:
			if _, err := res.Write([]byte(": keep-alive\n\n")); err != nil {
				return streamErr(ctx, err)
			}
			silent = 0
			sent = true
		}
		if sent {
			if err := flush(); err != nil {
				return streamErr(ctx, err)
			}
		}
		if run.State.Terminal() && after >= run.EventSeq {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			silent += pollInterval
		}
	}
}

// writeEvents writes the run's events after *after, at least up to head,
// read eventsPage at a time, and moves *after to the last one written; it
// reports whether it wrote any.
func (s *Server) writeEvents(c echo.Context, run ledger.RunID, after *int64, head int64) (bool, error) {
	sent := false
	for *after < head {
		evs, err := s.store.FindEventsAfter(c.Request().Context(), ledger.EventFilter{RunID: run, AfterSeq: *after, Limit: eventsPage})
		if err != nil {
			return sent, err
		}
		for _, e := range evs {
			if err := s.writeEvent(c, e); err != nil {
				return sent, err
			}
			*after, sent = e.Seq, true
		}
		if len(evs) < eventsPage {
			break
		}
	}
	return sent, nil
}

// writeEvent writes one event as a Server-Sent Event.
func (s *Server) writeEvent(c echo.Context, e *ledger.Event) error {
	te, err := s.timelineEvent(e)
	if err != nil {
		return err
	}
	line, err := encodeLine(te)
	if err != nil {
		return err
	}
	msg := make([]byte, 0, len(line)+len(e.Type)+40)
	msg = append(msg, "id: "...)
	msg = strconv.AppendInt(msg, e.Seq, 10)
	msg = append(msg, "\nevent: "...)
	msg = append(msg, e.Type...)
	msg = append(msg, "\ndata: "...)
	msg = append(msg, line...)
	msg = append(msg, "\n\n"...)
	_, err = c.Response().Write(msg)
	return err
}

// timelineEvent is an event as /timeline shows it: its data through the
// Redactor.
func (s *Server) timelineEvent(e *ledger.Event) (TimelineEvent, error) {
	data, err := s.redactor.RedactEventData(e)
	if err != nil {
		return TimelineEvent{}, err
	}
	return TimelineEvent{Seq: e.Seq, Type: e.Type, EntityType: e.EntityType, EntityID: e.EntityID,
		FromState: e.FromState, ToState: e.ToState, Actor: e.Actor, Data: data, CreatedAt: e.CreatedAt, Hash: e.Hash}, nil
}

// streamErr is what a stream that fails after its header returns: nothing
// when the client left, else the error, which is logged (the answer has
// begun and cannot become a problem).
func streamErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
