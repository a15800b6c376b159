package storehealth

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// FailureLog logs a repeated failure once per interval, with a count: the
// first failure under a message is logged at once; later ones within the
// interval are counted, and the next line, when the interval is over,
// reads "<msg>; 312 errors in the last 10s" with the first of them. A
// message quiet for a whole interval starts over. A failing store (a full
// disk) is then a few lines per interval, not one per try.
type FailureLog struct {
	log   *slog.Logger
	now   func() time.Time
	every time.Duration

	mu  sync.Mutex
	win map[string]*failureWindow
}

// failureWindow is what a message has seen since its last line.
type failureWindow struct {
	start time.Time // when its last line was written
	n     int       // failures since, not yet logged
	first error     // the first of them
}

// NewFailureLog returns a FailureLog writing to log, on the clock now, a
// message at most once per every.
func NewFailureLog(log *slog.Logger, now func() time.Time, every time.Duration) *FailureLog {
	return &FailureLog{log: log, now: now, every: every, win: map[string]*failureWindow{}}
}

// Error records one failure under msg, and logs it or its window's count
// as the rules above say. attrs go with a line logged at once.
func (l *FailureLog) Error(ctx context.Context, msg string, err error, attrs ...any) {
	now := l.now()
	l.mu.Lock()
	w := l.win[msg]
	if w == nil {
		l.win[msg] = &failureWindow{start: now}
		l.mu.Unlock()
		l.log.ErrorContext(ctx, msg, append([]any{"err", err}, attrs...)...)
		return
	}
	if w.n == 0 {
		w.first = err
	}
	w.n++
	line := l.due(msg, w, now)
	l.mu.Unlock()
	line.write(ctx, l.log)
}

// Flush writes the counts of windows whose interval is over, and forgets
// messages quiet for a whole interval. The pool calls it on every pass, so
// a count is logged even when no failure follows it.
func (l *FailureLog) Flush(ctx context.Context) {
	now := l.now()
	var lines []summary
	l.mu.Lock()
	for msg, w := range l.win {
		if now.Sub(w.start) < l.every {
			continue
		}
		if w.n == 0 {
			delete(l.win, msg)
			continue
		}
		lines = append(lines, l.due(msg, w, now))
	}
	l.mu.Unlock()
	for _, s := range lines {
		s.write(ctx, l.log)
	}
}

// due returns the summary of w if its interval is over, and starts the next
// window; the zero summary otherwise. l.mu is held.
func (l *FailureLog) due(msg string, w *failureWindow, now time.Time) summary {
	if now.Sub(w.start) < l.every || w.n == 0 {
		return summary{}
	}
	s := summary{msg: msg, n: w.n, first: w.first, over: now.Sub(w.start)}
	*w = failureWindow{start: now}
	return s
}

// summary is a count to log.
type summary struct {
	msg   string
	n     int
	first error
	over  time.Duration
}

func (s summary) write(ctx context.Context, log *slog.Logger) {
	if s.n == 0 {
		return
	}
	log.ErrorContext(ctx, fmt.Sprintf("%s; %d errors in the last %s", s.msg, s.n, s.over.Round(time.Second)),
		"err", s.first, "errors", s.n)
}
