package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/redact"
)

// DefaultMaxBodyBytes bounds request bodies when Config.MaxBodyBytes is 0.
const DefaultMaxBodyBytes int64 = 1 << 20

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
	Tokens *Tokens
	// Logger receives request and error logs; nil discards them. Tokens
	// are never logged.
	Logger *slog.Logger
	// Registry receives the server's metrics and is served on /metrics;
	// nil means a new registry with the Go and process collectors.
	Registry *prometheus.Registry
	// MaxBodyBytes bounds request bodies (413 above it); 0 means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Now is the clock for request durations; nil means time.Now.
	Now func() time.Time
	// ReadyFunc reports whether the server can serve (GET /readyz): the
	// store is reachable and its migrations are current. Nil means a
	// one-row FindRuns and, if the store can say (CurrentSchemaVersion),
	// a schema version equal to ledger.SchemaVersion(). Either way /readyz
	// is also not ready while the store's writes fail (the engine's
	// StoreHealth, which also watches Store for the handlers).
	ReadyFunc func(ctx context.Context) error
	// Redaction is the keyed redactor of evidence reports and of the
	// default Redactor; nil means one with a random key of this process
	// (markers then match no other process's).
	Redaction *redact.Redactor
	// Redactor hides secrets in arguments and event data; nil means a
	// KeyedRedactor with Redaction over the engine's tool descriptors.
	Redactor Redactor

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
	health    *engine.StoreHealth
	engine    *engine.Engine
	approvals *approval.Service
	tokens    *Tokens
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

	inflightMu sync.Mutex
	inflight   map[inflightKey]struct{}
}

// inflightKey is a request identity being processed by this server.
type inflightKey struct{ tenant, key string }

// New checks cfg and builds the server with its routes.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Engine == nil || cfg.Approvals == nil {
		return nil, errors.New("server: Store, Engine and Approvals are required")
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, errors.New("server: MaxBodyBytes cannot be negative")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{
		store: cfg.Store, engine: cfg.Engine, approvals: cfg.Approvals, tokens: cfg.Tokens,
		log: cfg.Logger, maxBody: cfg.MaxBodyBytes, now: cfg.Now, ready: cfg.ReadyFunc,
		redactor: cfg.Redactor, beforeSubmit: cfg.beforeSubmit, inflight: map[inflightKey]struct{}{},
	}
	// The handlers' store failures are counted, and decide readiness,
	// with the engine's.
	s.health = cfg.Engine.Health()
	s.store = s.health.Watch(cfg.Store)
	s.schema, _ = cfg.Store.(schemaVersioner)
	if s.ready == nil {
		s.ready = s.defaultReady
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
	m, err := newMetrics(s.reg, own, cfg.Store, cfg.Logger)
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

// Metrics returns the server's metrics, for the recovery scan to count its
// decisions in.
func (s *Server) Metrics() *Metrics { return s.metrics }

// RecoveryDecisions is the ledger_recovery_decisions_total{decision}
// counter the recovery scan increments.
func (s *Server) RecoveryDecisions() *prometheus.CounterVec { return s.metrics.RecoveryDecisions }

// newEcho builds the router. The route table is DESIGN.md section 6;
// openapi.json documents the same table and a test holds them equal.
func (s *Server) newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe, s.recoverPanic)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(metricsHandler(s.reg, s.log)))
	e.GET("/v1/openapi.json", s.openAPI)

	// Authentication is per route, not a group middleware: Echo gives a
	// group with middleware catch-all 404 routes, which would answer 404
	// instead of 405 for a known path with another method.
	auth := s.authenticate
	e.POST("/v1/runs", s.submitRun, auth)
	e.GET("/v1/runs", s.listRuns, auth)
	e.GET("/v1/runs/:run_id", s.getRun, auth)
	e.POST("/v1/runs/:run_id/cancel", s.cancelRun, auth)
	e.GET("/v1/runs/:run_id/timeline", s.timeline, auth)
	e.GET("/v1/runs/:run_id/evidence", s.evidence, auth)
	e.GET("/v1/approvals", s.listApprovals, auth)
	e.GET("/v1/actions/:action_id", s.getAction, auth)
	e.POST("/v1/actions/:action_id/approve", s.approve, auth)
	e.POST("/v1/actions/:action_id/deny", s.deny, auth)
	e.POST("/v1/actions/:action_id/resolve", s.resolve, auth)

	s.routes = map[string]bool{}
	for _, r := range e.Routes() {
		s.routes[r.Path] = true
	}
	return e
}

// observe is the outermost middleware: it turns a returned error into its
// problem answer at once (so the status is known), then counts and logs
// the request under its route template, never its raw path.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := s.now()
		if err := next(c); err != nil {
			c.Error(err)
		}
		route := c.Path()
		if !s.routes[route] {
			route = "unmatched"
		}
		status := c.Response().Status
		took := s.now().Sub(start)
		s.metrics.observe(c.Request().Method, route, status, took)
		attrs := []any{"method", c.Request().Method, "route", route, "status", status, "duration", took}
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
	return sendJSON(c, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	err := s.health.Err()
	if err == nil {
		err = s.ready(c.Request().Context())
	}
	if err != nil {
		// The cause may name files and hosts: it goes to the log, not to
		// an unauthenticated client.
		s.log.WarnContext(c.Request().Context(), "not ready", "err", err)
		return problemf(CodeNotReady, "the service is not ready")
	}
	return sendJSON(c, http.StatusOK, map[string]string{"status": "ready"})
}

// schemaVersioner is implemented by stores that can say which schema
// version their database holds (ledger.GormStore).
type schemaVersioner interface {
	CurrentSchemaVersion(ctx context.Context) (int, error)
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
		if want := ledger.SchemaVersion(); v != want {
			return fmt.Errorf("database schema version %d, this build needs %d", v, want)
		}
	}
	return nil
}
