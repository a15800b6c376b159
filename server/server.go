package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/storehealth"
)

// DefaultMaxBodyBytes bounds request bodies when Config.MaxBodyBytes is 0.
const DefaultMaxBodyBytes int64 = 1 << 20

// DefaultMaxPendingApprovals is ledger serve's default cap on a tenant's
// pending approvals and live runs (Config.MaxPendingApprovals): far above
// what people decide in a day, far below a flood.
const DefaultMaxPendingApprovals = 1000

// PendingApprovalsRetryAfter is the Retry-After, in seconds, of a submit
// refused by the pending approvals cap: people decide in minutes, not
// milliseconds.
const PendingApprovalsRetryAfter = 30

// DefaultMaxStreams and DefaultMaxLongPolls are ledger serve's default
// caps on each principal's open event streams and waiting long-polls
// (Config.MaxStreams, Config.MaxLongPolls): an agent needs one stream per
// run it follows and one long-poll per action it waits on, a handful at a
// time; a client that opens more is leaking them.
const (
	DefaultMaxStreams   = 16
	DefaultMaxLongPolls = 32
)

// WaitRetryAfter is the Retry-After, in seconds, of a stream or long-poll
// refused by its cap: long enough for one of the principal's own to end.
const WaitRetryAfter = 5

// Config builds a Server.
type Config struct {
	// Store is the ledger. Required.
	Store ledger.Store
	// Engine drives runs; the server asks it which agents exist, cancels
	// through it and notifies it after a submit, a decision or a
	// resolution. Required.
	Engine *engine.Engine
	// Approvals decides approvals (separation of duties, tenant check).
	// Required. Relaxing separation of duties in dev mode is the caller's
	// choice, made when building it.
	Approvals *approval.Service
	// Tokens are the bearer tokens the server accepts. Nil means dev mode:
	// no token needed, every request is principal dev in tenant default
	// with every role. The caller must then listen on loopback only and
	// say so loudly in its log; the server also refuses clients whose
	// address is not loopback (403).
	// Server.SetTokens replaces them while the server runs.
	Tokens *Tokens
	// Logger receives request and error logs; nil discards them. Tokens
	// are never logged.
	Logger *slog.Logger
	// Registry receives the server's metrics and is served on /metrics;
	// nil means a new registry with the Go and process collectors.
	Registry *prometheus.Registry
	// Version is this build's version, shown by ledger_build_info; ""
	// shows "unknown".
	Version string
	// MaxBodyBytes bounds request bodies (413 above it); 0 means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// RateLimit is how many requests a second, on average, each identity
	// (a principal in its tenant; in dev mode the one identity) may send
	// to the authenticated routes, and RateBurst how many at once (0 means
	// RateLimit rounded up): above it the answer is 429 rate_limited with
	// Retry-After. The same limit applies to answers of 401 per client
	// address: while an address has used it up, its requests are 429
	// before their token is looked at, so nobody guesses tokens at speed.
	// 0 limits nothing (serve's default is DefaultRateLimit and
	// DefaultRateBurst). /healthz, /readyz, /metrics and the document are
	// never limited.
	RateLimit float64
	RateBurst int
	// Now is the clock for request durations; nil means time.Now.
	Now func() time.Time
	// ReadyFunc reports whether the server can serve (GET /readyz): the
	// store is reachable and its migrations are current. Nil means a
	// one-row FindRuns and, if the store can say (CurrentSchemaVersion),
	// a schema version equal to the one its driver writes (LatestSchemaVersion). Either way /readyz
	// is also not ready while the store's writes fail (the engine's
	// Health, the store's observation hook, which sees the handlers'
	// operations too), nor while the engine's last claim or renewal of run
	// leases failed.
	ReadyFunc func(ctx context.Context) error
	// Redaction is the keyed redactor of evidence reports and of the
	// default Redactor; nil means one with a random key of this process
	// (markers then match no other process's).
	Redaction *redact.Redactor
	// Redactor hides secrets in arguments and event data; nil means a
	// KeyedRedactor with Redaction over the engine's tool descriptors.
	Redactor Redactor
	// MaxPendingApprovals caps, per tenant, the approvals waiting for a
	// person together with the runs that may still ask for one (queued or
	// running): a submit beyond it is 429 too_many_pending_approvals with
	// Retry-After. Counting those runs too keeps a burst of submits from
	// outrunning the cap before their approvals open.
	// 0 means no cap; ledger serve's --max-pending-approvals defaults to
	// DefaultMaxPendingApprovals.
	MaxPendingApprovals int
	// MaxStreams caps the event streams (GET /v1/runs/{run_id}/events)
	// each identity (a principal in its tenant; in dev mode the one
	// identity) holds open at once, and MaxLongPolls its long-polls
	// (GET /v1/actions/{action_id}?wait=) waiting at once: one more is
	// 429 too_many_streams or too_many_long_polls with Retry-After. A
	// long-poll answered at once (another version) takes no slot. 0 means
	// no cap; ledger serve's --max-streams and --max-long-polls default to
	// DefaultMaxStreams and DefaultMaxLongPolls.
	MaxStreams   int
	MaxLongPolls int
	// ClientTools are the leases of the tools outside agents execute (the
	// config file's client tools, engine.ClientTool), by tool name: GET
	// /v1/tools shows them, and every other tool as executed by the
	// ledger. Nil means none.
	ClientTools map[string]engine.Lease
	// HTTPTools are the names of the tools the ledger calls over HTTP (the
	// config file's http tools, registered as the engine's Config.Tools):
	// GET /v1/tools shows them with executor http. Nil means none.
	HTTPTools []string
	// MCP is the MCP gateway served at /mcp, or nil; MCPAgent is its
	// agent, which a token must drive to use it.
	MCP      *mcpgw.Gateway
	MCPAgent string

	// beforeSubmit, if set, runs after a submit is marked in flight and
	// before it reaches the store. Tests set it (export_test.go) to hold a
	// submit in flight; nothing reachable from the network can.
	beforeSubmit func()
}

// Server is the HTTP API v1. It holds no goroutines of its own; Handler
// serves it.
type Server struct {
	store     ledger.Store
	schema    schemaVersioner // the store's, if it can tell
	health    *storehealth.Tracker
	engine    *engine.Engine
	approvals *approval.Service
	// tokens is swapped whole by SetTokens; it is nil, for good, in dev mode.
	tokens    atomic.Pointer[Tokens]
	log       *slog.Logger
	reg       *prometheus.Registry
	metrics   *Metrics
	maxBody   int64
	now       func() time.Time
	ready     func(ctx context.Context) error
	redactor  Redactor
	redaction *redact.Redactor
	openapi   []byte
	echo      *echo.Echo
	routes    map[string]bool // route templates, to bound the metrics' route label

	beforeSubmit func()
	maxPending   int
	clientTools  map[string]engine.Lease
	httpTools    map[string]bool
	// mcp and mcpAgent: Config.MCP and Config.MCPAgent.
	mcp      *mcpgw.Gateway
	mcpAgent string

	// limits holds each identity's bucket, authFailures each client
	// address's bucket of 401s; both nil without a rate limit.
	limits, authFailures *limiter

	inflightMu sync.Mutex
	inflight   map[inflightKey]struct{}

	// streams and longPolls count each identity's open event streams and
	// waiting long-polls (protocol_wait.go).
	streams, longPolls *slots
}

// inflightKey is a request identity being processed by this server.
type inflightKey struct{ tenant, principal, key string }

// New checks cfg and builds the server with its routes.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Engine == nil || cfg.Approvals == nil {
		return nil, errors.New("server: Store, Engine and Approvals are required")
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, errors.New("server: MaxBodyBytes cannot be negative")
	}
	if cfg.RateLimit < 0 || cfg.RateBurst < 0 || math.IsNaN(cfg.RateLimit) || math.IsInf(cfg.RateLimit, 0) {
		return nil, errors.New("server: RateLimit and RateBurst must be finite and not negative")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxPendingApprovals < 0 {
		return nil, errors.New("server: MaxPendingApprovals cannot be negative")
	}
	if cfg.MaxStreams < 0 || cfg.MaxLongPolls < 0 {
		return nil, errors.New("server: MaxStreams and MaxLongPolls cannot be negative")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// Every line logged with a request's context names the request.
	cfg.Logger = slog.New(requestIDHandler{cfg.Logger.Handler()})
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{
		store: cfg.Store, engine: cfg.Engine, approvals: cfg.Approvals,
		log: cfg.Logger, maxBody: cfg.MaxBodyBytes, now: cfg.Now, ready: cfg.ReadyFunc,
		redactor: cfg.Redactor, beforeSubmit: cfg.beforeSubmit, inflight: map[inflightKey]struct{}{},
		maxPending: cfg.MaxPendingApprovals, clientTools: maps.Clone(cfg.ClientTools), mcp: cfg.MCP, mcpAgent: cfg.MCPAgent,
		streams:   newSlots(cfg.MaxStreams, CodeTooManyStreams, "event streams"),
		longPolls: newSlots(cfg.MaxLongPolls, CodeTooManyLongPolls, "long-polls"),
	}
	s.httpTools = map[string]bool{}
	for _, name := range cfg.HTTPTools {
		s.httpTools[name] = true
	}
	s.tokens.Store(cfg.Tokens)
	// The handlers' store failures are counted, and decide readiness, with
	// the engine's: the store's hook tells the one Health of both.
	s.health = cfg.Engine.Health()
	s.store = cfg.Store
	s.schema, _ = cfg.Store.(schemaVersioner)
	if s.ready == nil {
		s.ready = s.defaultReady
	}
	if cfg.RateLimit > 0 {
		s.limits = newLimiter(cfg.RateLimit, cfg.RateBurst, cfg.Now)
		s.authFailures = newLimiter(cfg.RateLimit, cfg.RateBurst, cfg.Now)
	}
	if cfg.Redaction == nil {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("server: redaction key: %w", err)
		}
		r, err := redact.NewRedactor(key)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		cfg.Redaction = r
	}
	s.redaction = cfg.Redaction
	if s.redactor == nil {
		s.redactor = KeyedRedactor{Redactor: cfg.Redaction, Tools: cfg.Engine.Tool}
	}
	own := cfg.Registry == nil
	s.reg = cfg.Registry
	if own {
		s.reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(s.reg, own, cfg.Store, cfg.Logger, cfg.Version)
	if err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	s.metrics = m
	if err := s.reg.Register(storeErrorsCollector{health: s.health}); err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	if s.openapi, err = openAPIDocument(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.echo = s.newEcho()
	return s, nil
}

// Handler returns the HTTP handler of the API.
func (s *Server) Handler() http.Handler { return s.echo }

// Metrics returns the server's metrics, for the ledger's, the engine's and
// the recovery scan's hooks to feed (ObserveCommit, ObserveToolCall,
// ObserveDecision).
func (s *Server) Metrics() *Metrics { return s.metrics }

// RecoveryDecisions is the ledger_recovery_decisions_total{decision}
// counter the recovery scan increments.
func (s *Server) RecoveryDecisions() *prometheus.CounterVec { return s.metrics.RecoveryDecisions }

// newEcho builds the router. The route table is docs/api.md;
// openapi.json documents the same table and a test holds them equal.
func (s *Server) newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe, s.recoverPanic)

	// Every GET route answers HEAD too: the same status and headers, no
	// body (observe drops it). Echo does not add HEAD by itself.
	get := func(path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) {
		e.GET(path, h, m...)
		e.HEAD(path, h, m...)
	}
	get("/healthz", s.healthz)
	get("/readyz", s.readyz)
	get("/metrics", echo.WrapHandler(metricsHandler(s.reg, s.log)))
	get("/v1/openapi.json", s.openAPI)

	// Authentication and the identity's rate limit are per route, not a
	// group middleware: Echo gives a group with middleware catch-all 404
	// routes, which would answer 404 instead of 405 for a known path with
	// another method.
	auth := []echo.MiddlewareFunc{s.authenticate, s.rateLimitMiddleware(s.limits)}
	e.POST("/v1/runs", s.submitRun, auth...)
	get("/v1/runs", s.listRuns, auth...)
	get("/v1/runs/:run_id", s.getRun, auth...)
	e.POST("/v1/runs/:run_id/cancel", s.cancelRun, auth...)
	get("/v1/runs/:run_id/timeline", s.timeline, auth...)
	get("/v1/runs/:run_id/evidence", s.evidence, auth...)
	get("/v1/approvals", s.listApprovals, auth...)
	get("/v1/actions/:action_id", s.getAction, auth...)
	e.POST("/v1/actions/:action_id/approve", s.approve, auth...)
	e.POST("/v1/actions/:action_id/deny", s.deny, auth...)
	e.POST("/v1/actions/:action_id/resolve", s.resolve, auth...)
	get("/v1/tools", s.listTools, auth...)
	get("/v1/agents", s.listAgents, auth...)
	// The agent protocol (protocol.go, docs/agent-protocol.md).
	e.POST("/v1/runs/:run_id/actions", s.proposeAction, auth...)
	e.POST("/v1/actions/:action_id/attempts", s.beginAttempt, auth...)
	e.POST("/v1/attempts/:attempt_id/heartbeat", s.heartbeatAttempt, auth...)
	e.POST("/v1/attempts/:attempt_id/complete", s.completeAttempt, auth...)
	e.POST("/v1/attempts/:attempt_id/abandon", s.abandonAttempt, auth...)
	e.POST("/v1/attempts/:attempt_id/observations", s.postObservation, auth...)
	get("/v1/runs/:run_id/next", s.nextDirectives, auth...)
	get("/v1/runs/:run_id/events", s.streamEvents, auth...)
	e.POST("/v1/runs/:run_id/finish", s.finishRun, auth...)
	if s.mcp != nil {
		s.mountMCP(e, s.mcp, s.mcpAgent, auth...)
	}

	s.routes = map[string]bool{}
	for _, r := range e.Routes() {
		s.routes[r.Path] = true
	}
	return e
}

// observe is the outermost middleware. It gives the request its id
// (HeaderRequestID: on the answer, in the context for every log line),
// turns a returned error into its problem answer at once (so the status is
// known), drops the body of a HEAD answer, then counts and logs the
// request under its route template, never its raw path, with its duration
// in milliseconds (duration_ms).
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := s.now()
		r := c.Request()
		id := requestID(r.Header.Values(HeaderRequestID), s.now)
		c.SetRequest(r.WithContext(withRequestID(r.Context(), id)))
		c.Response().Header().Set(HeaderRequestID, id)
		var head *headWriter
		if r.Method == http.MethodHead {
			head = &headWriter{ResponseWriter: c.Response().Writer}
			c.Response().Writer = head
		}
		if err := next(c); err != nil {
			c.Error(err)
		}
		if head != nil {
			head.flush()
		}
		route := c.Path()
		if !s.routes[route] {
			route = "unmatched"
		}
		status := c.Response().Status
		took := s.now().Sub(start)
		s.metrics.observe(r.Method, route, status, took)
		attrs := []any{"method", r.Method, "route", route, "status", status,
			"duration_ms", float64(took.Microseconds()) / 1000}
		if id, ok := identityFrom(c); ok {
			attrs = append(attrs, "principal", id.Principal, "tenant", id.Tenant)
		}
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelError
		}
		s.log.Log(c.Request().Context(), level, "http request", attrs...)
		return nil
	}
}

// headWriter answers a HEAD request as its GET would be answered, without
// the body: it counts the body's bytes for Content-Length and sends the
// header once the handler is done. Problems and every other answer pass
// through it alike, so HEAD gets the same status and headers as GET.
type headWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

// WriteHeader implements http.ResponseWriter; the status is sent by flush.
func (w *headWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

// Write implements http.ResponseWriter: the bytes are counted, not sent.
func (w *headWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.n += int64(len(p))
	return len(p), nil
}

// Flush implements http.Flusher: nothing is sent before flush, so that a
// handler that flushes cannot send the header early.
func (w *headWriter) Flush() {}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *headWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// flush sends the status and headers, with the Content-Length of the body
// that was left out.
func (w *headWriter) flush() {
	if w.status == 0 {
		return // nothing was written; net/http answers 200 without a body
	}
	if h := w.Header(); h.Get(echo.HeaderContentLength) == "" {
		h.Set(echo.HeaderContentLength, strconv.FormatInt(w.n, 10))
	}
	w.ResponseWriter.WriteHeader(w.status)
}

// recoverPanic turns a panic in a handler into a 500, logged with what
// panicked; the process keeps serving.
func (s *Server) recoverPanic(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r) // net/http's own signal to abort the response
				}
				err = &apiError{code: string(ledger.CodeInternal), detail: "internal error", err: fmt.Errorf("panic: %v", r)}
			}
		}()
		return next(c)
	}
}

func (s *Server) healthz(c echo.Context) error {
	return sendJSON(c, http.StatusOK, Status{Status: "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	leases := s.engine.Leases()
	err := s.health.Err()
	if err == nil {
		err = s.ready(c.Request().Context())
	}
	if err == nil && leases.Err != nil {
		err = fmt.Errorf("run leases: %w", leases.Err)
	}
	if err != nil {
		// The cause may name files and hosts: it goes to the log, not to
		// an unauthenticated client.
		s.log.WarnContext(c.Request().Context(), "not ready", "err", err)
		return problemf(CodeNotReady, "the service is not ready")
	}
	loop := &LeaseLoop{Held: leases.Held}
	if !leases.LastClaim.IsZero() {
		loop.LastClaim = &leases.LastClaim
	}
	if !leases.LastRenew.IsZero() {
		loop.LastRenew = &leases.LastRenew
	}
	return sendJSON(c, http.StatusOK, Status{Status: "ready", Leases: loop})
}

// schemaVersioner is implemented by stores that can say which schema
// version their database holds and which their driver writes (ledger.DB).
type schemaVersioner interface {
	CurrentSchemaVersion(ctx context.Context) (int, error)
	LatestSchemaVersion() int
}

// defaultReady reads one run, and compares the database's schema version
// with this build's where the store can tell it.
func (s *Server) defaultReady(ctx context.Context) error {
	if _, err := s.store.FindRuns(ctx, ledger.RunFilter{Limit: 1}); err != nil {
		return fmt.Errorf("store unreachable: %w", err)
	}
	if sv := s.schema; sv != nil {
		v, err := sv.CurrentSchemaVersion(ctx)
		if err != nil {
			return fmt.Errorf("store unreachable: %w", err)
		}
		if want := sv.LatestSchemaVersion(); v != want {
			return fmt.Errorf("database schema version %d, this build needs %d", v, want)
		}
	}
	return nil
}
