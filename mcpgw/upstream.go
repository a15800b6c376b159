package mcpgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// upstream is the gateway's connection to one MCP server: opened at the
// first use, opened again after it fails, no sooner than a backoff that
// doubles from 500 ms to 30 s while it keeps failing.
type upstream struct {
	cfg  contracts.ConfigUpstream
	impl *mcp.Implementation
	// maxBody caps each HTTP answer of a url upstream, in bytes; capHits
	// counts the answers cut there (the SDK's error does not say why).
	maxBody int64
	capHits atomic.Int64
	log     *slog.Logger
	now     func() time.Time

	mu        sync.Mutex
	closed    bool
	session   *mcp.ClientSession
	failures  int
	notBefore time.Time
	lastErr   error
	// live are the digests of the definitions the upstream listed when it
	// was last connected, by its tool name; nil before the first listing.
	// Under liveMu, not mu, which a connect holds while the upstream starts.
	liveMu sync.Mutex
	live   map[string]ledger.Digest
}

// connectTimeout bounds an upstream's start: the handshake and the first
// listing of its tools.
const connectTimeout = 30 * time.Second

// Backoff bounds of an upstream that fails to start or dies.
const (
	upstreamBackoffMin = 500 * time.Millisecond
	upstreamBackoffMax = 30 * time.Second
)

func newUpstream(cfg contracts.ConfigUpstream, impl *mcp.Implementation, maxResult int64, log *slog.Logger, now func() time.Time) *upstream {
	return &upstream{cfg: cfg, impl: impl, maxBody: maxResult + mcp.DefaultMaxLineLength, log: log.With("upstream", cfg.Name), now: now}
}

// transport is how the gateway reaches the upstream: its command, started
// with only PATH, HOME and the configured environment, or its URL with its
// bearer token.
func (u *upstream) transport() (mcp.Transport, error) {
	if u.cfg.URL != "" {
		var rt http.RoundTripper = capped{limit: u.maxBody, hits: &u.capHits, next: http.DefaultTransport}
		if name := u.cfg.BearerTokenEnv; name != "" {
			token := os.Getenv(name)
			if token == "" {
				return nil, fmt.Errorf("upstream %s: $%s is empty", u.cfg.Name, name)
			}
			rt = bearer{token: token, next: rt}
		}
		client := &http.Client{Transport: rt}
		return &mcp.StreamableClientTransport{Endpoint: u.cfg.URL, HTTPClient: client, MaxRetries: -1}, nil
	}
	cmd := exec.Command(u.cfg.Command[0], u.cfg.Command[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range u.cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = &logWriter{log: u.log}
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// capped stops reading an upstream's HTTP answer past limit bytes, as the
// SDK's stdio transport stops at a line over 16 MiB: a huge answer costs
// the gateway no more than that before the call fails.
type capped struct {
	limit int64
	hits  *atomic.Int64 // counts the answers cut at the cap
	next  http.RoundTripper
}

// errTooLarge is the error of an answer read past the cap.
var errTooLarge = errors.New("the upstream's answer is over the gateway's cap")

func (c capped) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err != nil || c.limit <= 0 {
		return resp, err
	}
	resp.Body = &cappedBody{ReadCloser: resp.Body, left: c.limit, hits: c.hits}
	return resp, nil
}

type cappedBody struct {
	io.ReadCloser
	left int64
	hits *atomic.Int64
	hit  bool
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		if !b.hit {
			b.hit = true
			b.hits.Add(1)
		}
		return 0, errTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// logWriter logs an upstream command's stderr, a line at a time as it
// comes.
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	w.log.Info("upstream stderr", "text", string(p))
	return len(p), nil
}

// errUpstreamDown is the error of a call while the upstream cannot be
// reached (it failed to start or died, and its backoff has not passed).
var errUpstreamDown = errors.New("upstream unavailable")

// connect returns the open session, opening one if there is none and the
// backoff allows.
func (u *upstream) connect(ctx context.Context) (*mcp.ClientSession, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.session != nil {
		return u.session, nil
	}
	if u.closed {
		return nil, fmt.Errorf("%w: %s: the gateway is closing", errUpstreamDown, u.cfg.Name)
	}
	if now := u.now(); now.Before(u.notBefore) {
		return nil, fmt.Errorf("%w: %s: %v (again in %s)", errUpstreamDown, u.cfg.Name, u.lastErr, u.notBefore.Sub(now).Round(time.Millisecond))
	}
	t, err := u.transport()
	if err == nil {
		client := mcp.NewClient(u.impl, &mcp.ClientOptions{
			ToolListChangedHandler: func(ctx context.Context, _ *mcp.ToolListChangedRequest) { u.relist(ctx) },
		})
		cctx, cancel := context.WithTimeout(ctx, connectTimeout)
		defer cancel()
		var s *mcp.ClientSession
		if s, err = client.Connect(cctx, t, nil); err == nil {
			var live map[string]ledger.Digest
			if live, err = listDigests(cctx, s); err == nil {
				u.session, u.failures = s, 0
				u.setLive(live)
				go u.watch(s)
				return s, nil
			}
			_ = s.Close()
		}
	}
	u.failures++
	u.lastErr = err
	wait := min(upstreamBackoffMin<<min(u.failures-1, 10), upstreamBackoffMax)
	u.notBefore = u.now().Add(wait)
	u.log.Warn("upstream could not be reached", "err", err, "retry_in", wait.String())
	return nil, fmt.Errorf("%w: %s: %v", errUpstreamDown, u.cfg.Name, err)
}

// watch forgets the session once it ends (the upstream died or closed),
// so that the next call opens a new one.
func (u *upstream) watch(s *mcp.ClientSession) {
	err := s.Wait()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.session == s {
		u.session = nil
		u.failures++
		u.lastErr = fmt.Errorf("the session ended: %v", err)
		u.notBefore = u.now().Add(min(upstreamBackoffMin<<min(u.failures-1, 10), upstreamBackoffMax))
		u.log.Warn("upstream session ended", "err", err)
	}
}

// relist reads the upstream's tool definitions again after it said they
// changed.
func (u *upstream) relist(ctx context.Context) {
	u.mu.Lock()
	s := u.session
	u.mu.Unlock()
	if s == nil {
		return
	}
	live, err := listDigests(ctx, s)
	if err != nil {
		u.log.Warn("list the upstream's tools after a change", "err", err)
		return
	}
	u.setLive(live)
}

func (u *upstream) setLive(live map[string]ledger.Digest) {
	u.liveMu.Lock()
	u.live = live
	u.liveMu.Unlock()
}

// listDigests lists every tool of s, with the digest of its definition.
func listDigests(ctx context.Context, s *mcp.ClientSession) (map[string]ledger.Digest, error) {
	live := map[string]ledger.Digest{}
	for t, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("list tools: %w", err)
		}
		_, d, err := definitionOf(t)
		if err != nil {
			return nil, err
		}
		live[t.Name] = d
	}
	return live, nil
}

// liveDigest is the digest of the tool's definition as the upstream last
// listed it; ok is false if it has not been listed (not connected yet) and
// the digest "" if the upstream no longer has the tool.
func (u *upstream) liveDigest(tool string) (d ledger.Digest, ok bool) {
	u.liveMu.Lock()
	defer u.liveMu.Unlock()
	if u.live == nil {
		return "", false
	}
	return u.live[tool], true
}

// List lists the upstream's tools now, connecting if need be.
func (u *upstream) List(ctx context.Context) ([]*mcp.Tool, error) {
	s, err := u.connect(ctx)
	if err != nil {
		return nil, err
	}
	var out []*mcp.Tool
	for t, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("upstream %s: list tools: %w", u.cfg.Name, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// call calls one of the upstream's tools.
func (u *upstream) call(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	s, err := u.connect(ctx)
	if err != nil {
		return nil, err
	}
	return s.CallTool(ctx, p)
}

// Close closes the session, stopping a command upstream.
func (u *upstream) Close() error {
	u.mu.Lock()
	s := u.session
	u.session, u.closed = nil, true
	u.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.Close()
}
