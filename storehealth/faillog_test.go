package storehealth_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/storehealth"
)

// logLines is a JSON slog handler's output, safe for concurrent writes.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// records returns the lines logged so far, decoded.
func (l *logLines) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.buf.String()) {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		out = append(out, r)
	}
	return out
}

func newLogLines() (*logLines, *slog.Logger) {
	l := &logLines{}
	return l, slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func TestFailureLog(t *testing.T) {
	ctx := context.Background()
	setup := func() (*logLines, *ledgertest.Clock, *storehealth.FailureLog) {
		lines, log := newLogLines()
		clock := ledgertest.NewClock()
		return lines, clock, storehealth.NewFailureLog(log, clock.Now, 10*time.Second)
	}
	first, later := errors.New("disk full at 1"), errors.New("disk full at 2")

	t.Run("FirstAtOnceThenOncePerIntervalWithCount", func(t *testing.T) {
		lines, clock, l := setup()
		l.Error(ctx, "advance run", first, "run", "run_1")
		require.Len(t, lines.records(t), 1, "the first failure is logged at once")
		for i := range 311 {
			clock.Advance(10 * time.Millisecond)
			if i == 0 {
				l.Error(ctx, "advance run", later, "run", "run_2")
				continue
			}
			l.Error(ctx, "advance run", first, "run", "run_3")
		}
		l.Flush(ctx)
		require.Len(t, lines.records(t), 1, "repeats within the interval are only counted")

		clock.Advance(7 * time.Second) // 10.11s since the first line
		l.Flush(ctx)
		recs := lines.records(t)
		require.Len(t, recs, 2)
		require.Equal(t, "advance run", recs[0]["msg"])
		require.Equal(t, first.Error(), recs[0]["err"])
		require.Equal(t, "run_1", recs[0]["run"])
		require.Equal(t, "ERROR", recs[0]["level"])
		require.Equal(t, "advance run; 311 errors in the last 10s", recs[1]["msg"])
		require.Equal(t, later.Error(), recs[1]["err"], "the first error of the window")
		require.EqualValues(t, 311, recs[1]["errors"])
	})

	t.Run("CountLoggedByTheNextFailureWithoutFlush", func(t *testing.T) {
		lines, clock, l := setup()
		l.Error(ctx, "expire approvals", first)
		clock.Advance(time.Second)
		l.Error(ctx, "expire approvals", later)
		clock.Advance(9 * time.Second)
		l.Error(ctx, "expire approvals", first)
		recs := lines.records(t)
		require.Len(t, recs, 2)
		require.Equal(t, "expire approvals; 2 errors in the last 10s", recs[1]["msg"])
		require.Equal(t, later.Error(), recs[1]["err"])
	})

	t.Run("QuietIntervalStartsOver", func(t *testing.T) {
		lines, clock, l := setup()
		l.Error(ctx, "find runnable runs", first)
		clock.Advance(10 * time.Second)
		l.Flush(ctx) // nothing counted: forgotten
		require.Len(t, lines.records(t), 1)
		l.Error(ctx, "find runnable runs", later)
		recs := lines.records(t)
		require.Len(t, recs, 2, "after a quiet interval the next failure is logged at once")
		require.Equal(t, "find runnable runs", recs[1]["msg"])
	})

	t.Run("MessagesApart", func(t *testing.T) {
		lines, _, l := setup()
		l.Error(ctx, "advance run", first)
		l.Error(ctx, "expire approvals", first)
		l.Error(ctx, "advance run", first)
		require.Len(t, lines.records(t), 2)
	})
}
