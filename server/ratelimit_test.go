package server_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/server"
)

// limitedEnv is an env whose server allows burst requests at once and one
// more every 1000 s, on a clock the test moves.
func limitedEnv(t *testing.T, dev bool, burst int) (*env, *ledgertest.Clock) {
	t.Helper()
	clock := ledgertest.NewClock()
	e := newEnv(t, options{dev: dev, config: func(c *server.Config) {
		c.RateLimit, c.RateBurst, c.Now = 0.001, burst, clock.Now
	}})
	return e, clock
}

func requireRateLimited(t *testing.T, res response, retryAfter int) server.Problem {
	t.Helper()
	p := requireProblem(t, res, http.StatusTooManyRequests, server.CodeRateLimited)
	require.Equal(t, strconv.Itoa(retryAfter), res.Header.Get("Retry-After"))
	require.NotEmpty(t, p.Instance)
	return p
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	t.Run("PerPrincipal", func(t *testing.T) {
		e, clock := limitedEnv(t, false, 3)
		for i := range 3 {
			require.Equal(t, http.StatusOK, e.get(t, "alice", "/v1/runs").Status, "request %d is within the burst", i+1)
		}
		requireRateLimited(t, e.get(t, "alice", "/v1/runs"), 1000)
		requireRateLimited(t, e.submitRaw(t, "alice", "k1", submitBody(t)), 1000)
		head := e.send(t, request{principal: "alice", method: http.MethodHead, path: "/v1/runs"})
		require.Equal(t, http.StatusTooManyRequests, head.Status, "HEAD counts too")
		require.Equal(t, "1000", head.Header.Get("Retry-After"))
		require.Zero(t, e.runCount(t), "a refused submit did nothing")

		// Another principal of the tenant has its own allowance.
		require.Equal(t, http.StatusOK, e.get(t, "bob", "/v1/runs").Status)
		// Unauthenticated routes are not limited per token.
		for range 5 {
			for _, p := range []string{"/healthz", "/readyz", "/v1/openapi.json", "/metrics"} {
				require.Equal(t, http.StatusOK, e.get(t, "", p).Status, p)
			}
		}

		// Retry-After is right: after it, one request more.
		clock.Advance(999 * time.Second)
		requireRateLimited(t, e.get(t, "alice", "/v1/runs"), 1)
		clock.Advance(time.Second)
		require.Equal(t, http.StatusOK, e.get(t, "alice", "/v1/runs").Status)
		requireRateLimited(t, e.get(t, "alice", "/v1/runs"), 1000)

		fams := scrape(t, e)
		require.Equal(t, 5.0, value(sample(t, fams, "ledger_http_rate_limited_total", map[string]string{"scope": "principal"})))
		require.Equal(t, 3.0, value(sample(t, fams, "ledger_http_requests_total",
			map[string]string{"method": "GET", "route": "/v1/runs", "code": "429"})), "counted as answered requests too")
	})

	t.Run("DevMode", func(t *testing.T) {
		e, _ := limitedEnv(t, true, 2)
		require.Equal(t, http.StatusOK, e.get(t, "", "/v1/runs").Status)
		require.Equal(t, http.StatusOK, e.get(t, "", "/v1/approvals").Status)
		requireRateLimited(t, e.get(t, "", "/v1/runs"), 1000)
	})

	t.Run("BadTokensPerAddress", func(t *testing.T) {
		e, clock := limitedEnv(t, false, 3)
		bad := map[string][]string{"Authorization": {"Bearer lgr_guess"}}
		for range 3 {
			requireProblem(t, e.send(t, request{method: http.MethodGet, path: "/v1/runs", header: bad}),
				http.StatusUnauthorized, server.CodeUnauthorized)
		}
		requireRateLimited(t, e.send(t, request{method: http.MethodGet, path: "/v1/runs", header: bad}), 1000)
		// A right guess from that address is refused as well: otherwise a
		// guesser would still learn from every try.
		requireRateLimited(t, e.get(t, "alice", "/v1/runs"), 1000)
		// Another address is not held up.
		req := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
		req.RemoteAddr = "192.0.2.8:40000"
		req.Header.Set("Authorization", "Bearer "+e.tokens["alice"])
		require.Equal(t, http.StatusOK, e.direct(t, req).Status)
		// Good tokens do not spend the address's allowance (bob's own
		// burst is 3), nor make a bucket for an address without failures.
		require.Equal(t, 1, e.srv.AuthFailureBuckets(), "127.0.0.1 only, not 192.0.2.8")
		clock.Advance(1000 * time.Second)
		for range 3 {
			require.Equal(t, http.StatusOK, e.get(t, "bob", "/v1/approvals").Status)
		}
		requireProblem(t, e.send(t, request{method: http.MethodGet, path: "/v1/runs", header: bad}),
			http.StatusUnauthorized, server.CodeUnauthorized)
		requireRateLimited(t, e.send(t, request{method: http.MethodGet, path: "/v1/runs", header: bad}), 1000)

		fams := scrape(t, e)
		require.Equal(t, 3.0, value(sample(t, fams, "ledger_http_rate_limited_total", map[string]string{"scope": "address"})))
	})

	t.Run("IdleBucketsAreSwept", func(t *testing.T) {
		e, clock := limitedEnv(t, false, 3)
		guess := func(addr string) int {
			req := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
			req.RemoteAddr = addr
			req.Header.Set("Authorization", "Bearer lgr_guess")
			return e.direct(t, req).Status
		}
		for i := range 20 {
			require.Equal(t, http.StatusUnauthorized, guess(fmt.Sprintf("198.51.100.%d:1000", i)))
		}
		// IPv6 addresses count by their /64.
		require.Equal(t, http.StatusUnauthorized, guess("[2001:db8::1]:1000"))
		require.Equal(t, http.StatusUnauthorized, guess("[2001:db8::2]:1000"))
		require.Equal(t, 21, e.srv.AuthFailureBuckets())
		// Once their buckets have refilled, they are forgotten.
		clock.Advance(3001 * time.Second)
		require.Equal(t, http.StatusUnauthorized, guess("203.0.113.1:1000"))
		require.Equal(t, 1, e.srv.AuthFailureBuckets())
	})

	t.Run("ErrConfig", func(t *testing.T) {
		e := newEnv(t, options{})
		for _, c := range []server.Config{{RateLimit: -1}, {RateBurst: -1}} {
			c.Store, c.Engine, c.Approvals = e.Store, e.engine, e.approvals
			_, err := server.New(c)
			require.Error(t, err)
		}
	})
}
