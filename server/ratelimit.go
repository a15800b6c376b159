package server

import (
	"errors"
	"math"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"golang.org/x/time/rate"

	"github.com/actionledger/ledger/ledger"
)

// Rate limits of serve's defaults: generous for people and scripts, a
// brake on a runaway client.
const (
	DefaultRateLimit = 50  // requests a second per identity, on average
	DefaultRateBurst = 100 // requests at once
)

// limiter keeps one token bucket (x/time/rate) per key, in memory, on the
// server's clock. A bucket idle long enough to have refilled is the same
// as a new one, so such buckets are swept away now and then: the map
// holds only keys seen recently.
type limiter struct {
	limit rate.Limit
	burst int
	now   func() time.Time
	idle  time.Duration // after this long unused, a bucket is full again

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// sweepEvery is how often at most the limiter drops full buckets.
const sweepEvery = time.Minute

func newLimiter(perSecond float64, burst int, now func() time.Time) *limiter {
	if burst <= 0 {
		burst = max(1, int(math.Ceil(perSecond)))
	}
	idle := time.Duration(float64(burst) / perSecond * float64(time.Second))
	return &limiter{limit: rate.Limit(perSecond), burst: burst, now: now, idle: max(idle, time.Second),
		buckets: map[string]*bucket{}, lastSweep: now()}
}

// get returns key's bucket, making it if needed; l.mu is held.
func (l *limiter) get(key string, now time.Time) *rate.Limiter {
	if now.Sub(l.lastSweep) > sweepEvery {
		for k, b := range l.buckets {
			if now.Sub(b.seen) > l.idle {
				delete(l.buckets, k)
			}
		}
		l.lastSweep = now
	}
	b, ok := l.buckets[key]
	if !ok {
		b = &bucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[key] = b
	}
	b.seen = now
	return b.lim
}

// take takes a token of key's bucket; with none left it takes nothing and
// says how long until there is one.
func (l *limiter) take(key string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	r := l.get(key, now).ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// empty reports whether key's bucket has no token left, and how long
// until it has one, without taking any. A key without a bucket has a
// full one, so none is made for it.
func (l *limiter) empty(key string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		return false, 0
	}
	now := l.now()
	tokens := b.lim.TokensAt(now)
	if tokens >= 1 {
		return false, 0
	}
	return true, time.Duration((1 - tokens) / float64(l.limit) * float64(time.Second))
}

// spend takes a token of key's bucket if one is left.
func (l *limiter) spend(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.get(key, now).AllowN(now, 1)
}

// limitedError is a refusal of the limiter, with the wait until a request
// can succeed.
type limitedError struct{ retry time.Duration }

func (e *limitedError) Error() string { return "rate limit exceeded" }

// Allow implements Echo's middleware.RateLimiterStore.
func (l *limiter) Allow(key string) (bool, error) {
	if ok, retry := l.take(key); !ok {
		return false, &limitedError{retry: retry}
	}
	return true, nil
}

// rateLimited is the 429 answer: Retry-After in whole seconds, at least 1.
func rateLimited(scope string, retry time.Duration) *apiError {
	secs := max(1, int(math.Ceil(retry.Seconds())))
	return &apiError{code: CodeRateLimited, header: retryAfter(secs),
		detail: "too many requests from this " + scope + "; retry after " + strconv.Itoa(secs) + "s"}
}

// rateLimitMiddleware limits each identity (principal in its tenant; in
// dev mode the one identity) after authentication, with Echo's rate
// limiter on the server's limiter. Nil limits nothing.
func (s *Server) rateLimitMiddleware(l *limiter) echo.MiddlewareFunc {
	if l == nil {
		return func(next echo.HandlerFunc) echo.HandlerFunc { return next }
	}
	return middleware.RateLimiterWithConfig(middleware.RateLimiterConfig{
		Store: l,
		IdentifierExtractor: func(c echo.Context) (string, error) {
			id, ok := identityFrom(c)
			if !ok {
				return "", errors.New("route without authentication")
			}
			return id.key(), nil
		},
		ErrorHandler: func(_ echo.Context, err error) error {
			return &apiError{code: string(ledger.CodeInternal), detail: "internal error", err: err}
		},
		DenyHandler: func(_ echo.Context, _ string, err error) error {
			s.metrics.rateLimited.WithLabelValues("principal").Inc()
			var le *limitedError
			if errors.As(err, &le) {
				return rateLimited("principal", le.retry)
			}
			return rateLimited("principal", time.Second)
		},
	})
}

// clientAddress is the key of a client's failed authentications: its
// address as the connection shows it (never a forwarded header a client
// can write), an IPv6 address by its /64, which one host usually holds
// whole.
func clientAddress(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return host
	case ip.To4() != nil:
		return ip.String()
	default:
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
}
