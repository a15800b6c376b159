package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/postgres"
	"github.com/actionledger/ledger/ledger/postgres/pgtest"
)

// TestKilledSessionsCostNoCall: an administrator (or a failover, or a
// pooler) ends every session the store holds, between two calls. Nothing
// was in flight, so nothing is lost: a read runs again on a fresh
// session, and so does a write, whose transaction never reached its
// COMMIT. Whichever call comes first after the sessions ended, it does
// not fail, round after round.
func TestKilledSessionsCostNoCall(t *testing.T) {
	ctx := context.Background()
	// The store's sessions carry a name of their own, which the killer
	// looks for: the schema's database is shared with other tests.
	u, err := url.Parse(pgtest.NewSchema(t))
	require.NoError(t, err)
	q := u.Query()
	name := q.Get("search_path")
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	s, err := postgres.OpenStore(ctx, postgres.Config{DSN: u.String(), MaxConns: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	admin, err := pgx.Connect(ctx, pgtest.Server())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })

	first, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "first", Principal: "alice",
		Agent: "support", Input: json.RawMessage(`{}`), Start: true})
	require.NoError(t, err)
	var run ledger.RunID // the round's own run
	steps := []struct {
		name string
		call func(round int) error
	}{
		{"a read on the pool", func(int) error {
			got, err := s.FindRunByID(ctx, first.Run.ID)
			if err == nil && got.ID != first.Run.ID {
				err = fmt.Errorf("got run %s", got.ID)
			}
			return err
		}},
		{"a list on the pool", func(int) error {
			events, err := s.FindEvents(ctx, first.Run.ID)
			if err == nil && len(events) == 0 {
				err = errors.New("no events")
			}
			return err
		}},
		{"a read in a snapshot", func(int) error {
			chain, err := s.FindChain(ctx, first.Run.ID)
			if err == nil && !chain.Report.OK {
				err = errors.New(chain.Report.Reason)
			}
			return err
		}},
		{"a new run", func(round int) error {
			res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: fmt.Sprintf("round-%d", round),
				Principal: "alice", Agent: "support", Input: json.RawMessage(`{}`), Start: true})
			if err == nil {
				run = res.Run.ID
			}
			return err
		}},
		{"an action's writes", func(int) error { return doAction(ctx, s, run, "step-1") }},
		{"a transition", func(int) error {
			_, err := s.TransitionRun(ctx, ledger.RunTransition{ID: run, From: ledger.RunRunning, To: ledger.RunCompleted,
				StopReason: ledger.StopCompleted, Actor: "agent"})
			return err
		}},
	}
	for round := range 2 {
		for _, step := range steps {
			// Several sessions in the pool, each lent a moment ago, then
			// every one of them ended.
			warm(func() {
				_, _ = s.FindRunByID(ctx, first.Run.ID)
				_, _ = s.FindEvents(ctx, first.Run.ID)
			})
			require.GreaterOrEqual(t, killSessions(t, admin, name), 2, "round %d: the pool held several sessions", round)
			require.NoError(t, step.call(round), "round %d: %s, first after the sessions ended", round, step.name)
		}
		requireRunIntact(t, s, run, 1)
	}
}

// warm fills the pool: call, from 4 goroutines at once, twice, so that
// the pool holds several sessions, each lent again a moment ago (pgx
// checks a session before it lends it again when it was never lent
// before, or not for over a second).
func warm(call func()) {
	for range 2 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(call)
		}
		wg.Wait()
	}
}

// killSessions ends every session named app, as an administrator's
// pg_terminate_backend does, waits until they have all ended, and returns
// how many there were.
func killSessions(t *testing.T, admin *pgx.Conn, app string) int {
	t.Helper()
	ctx := context.Background()
	rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left))
		return left == 0
	}, 5*time.Second, 5*time.Millisecond, "the sessions end")
	return len(pids)
}

// TestBrokenConnectionsCostNoCall: the connections break without a word
// from the server (a proxy or a load balancer restarted, a network cut):
// the driver reads an EOF or a reset where an answer should be. A read
// runs again, and so does a write that had not sent its COMMIT.
func TestBrokenConnectionsCostNoCall(t *testing.T) {
	ctx := context.Background()
	p := newCutter(t, pgtest.NewSchema(t))
	s, err := postgres.OpenStore(ctx, postgres.Config{DSN: p.dsn, MaxConns: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	res, err := s.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "first", Principal: "alice",
		Agent: "support", Input: json.RawMessage(`{}`), Start: true})
	require.NoError(t, err)
	run := res.Run.ID

	for round := range 3 {
		warm(func() { _, _ = s.FindRunByID(ctx, run) })
		require.GreaterOrEqual(t, p.cut(), 2, "round %d: the pool held several connections", round)
		_, err := s.FindRunByID(ctx, run)
		require.NoError(t, err, "round %d: a read", round)

		p.cut()
		require.NoError(t, doAction(ctx, s, run, fmt.Sprintf("step-%d", round)), "round %d: an action's writes", round)
	}
	requireRunIntact(t, s, run, 3)
}

// cutter is a TCP proxy in front of the test server that can cut every
// connection through it at once, as a restarted proxy does: each side sees
// its connection closed, with nothing said.
type cutter struct {
	dsn   string
	mu    sync.Mutex
	conns []net.Conn
}

// newCutter starts a cutter in front of the server of dsn and returns it
// with dsn pointed at it; it stops when t ends.
func newCutter(t *testing.T, dsn string) *cutter {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	target := u.Host
	u.Host = ln.Addr().String()
	c := &cutter{dsn: u.String()}
	t.Cleanup(func() { _ = ln.Close(); c.cut() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, client, server)
			c.mu.Unlock()
			go func() { _, _ = io.Copy(server, client); _ = server.Close() }()
			go func() { _, _ = io.Copy(client, server); _ = client.Close() }()
		}
	}()
	return c
}

// cut closes every connection through c and returns how many client
// connections there were.
func (c *cutter) cut() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	n := len(c.conns) / 2
	c.conns = nil
	return n
}
