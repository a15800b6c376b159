package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/actionledger/ledger/config"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

// envTokensFile names the tokens file when --tokens is not given.
const envTokensFile = "LEDGER_TOKENS_FILE"

// envConfig names the config file when --config is not given.
const envConfig = "LEDGER_CONFIG"

// envAddr is the listen address when --addr is not given: with
// $LEDGER_SERVER, it moves a server and its clients to another port
// without editing a command line.
const envAddr = "LEDGER_ADDR"

// devModeWarning is logged at start-up without a tokens file.
const devModeWarning = "DEV MODE: no tokens file; every request is principal dev in tenant default with all roles; separation of duties relaxed; loopback only"

// serveOptions are the flags of ledger serve.
type serveOptions struct {
	dbPath          string
	effectsPath     string
	addr            string
	tokensPath      string
	rulesPath       string
	configPath      string
	logFormat       string
	logLevel        string
	maxBodyBytes    int64
	shutdownTimeout time.Duration
	rateLimit       float64
	rateBurst       int
	maxPending      int
	maxStreams      int
	maxLongPolls    int
	signingKeyPath  string
	allowUnsigned   bool
	leaseTTL        time.Duration
}

func newServeCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve [--db PATH] [--addr HOST:PORT] [--tokens FILE] [--config FILE]",
		Short: "Run the HTTP API and the engine's workers",
		Long: `Serve HTTP API v1 on --addr over the ledger database --db, and advance runs with
the engine's worker pool. Before it accepts requests, serve runs the recovery scan, so
every action interrupted by a crash gets its decision first.

Authentication: --tokens (or $LEDGER_TOKENS_FILE) names a JSON file of token hashes,
{"tokens": [{"sha256": "…", "principal": "alice", "tenant": "acme", "roles": ["submitter"]}]};
make entries with "ledger token new" and remove them with "ledger token revoke". The
file is read at start-up and again on SIGHUP, replacing the tokens in force at once; a
file that does not parse, lists no tokens, or that group or others may write is refused
(exit status 2 at start-up; on SIGHUP the tokens in force stay, and the reason is
logged). A symlink is followed, and its target logged. Without a tokens file serve runs in DEV
MODE: every request is principal "dev" in tenant "default" with every role, separation
of duties is relaxed, and --addr must be a loopback address (exit status 2 otherwise).

Agents and tools: --config (or $LEDGER_CONFIG) names the operator's config file, in
YAML or JSON (a .json name is read as JSON): the tools agents may call, the agents runs
may name (a client agent is driven by its own process through the agent protocol),
and optionally the approval rules (then not together with --rules). A file with
problems is refused before anything starts, every problem on a line of its own with
its location (exit status 2). The built-in practice-cards agent is always there; the
file may restrict its tenants and set its loop-policy thresholds. See
docs/operations.md, "The config file".

The database (--db, or $LEDGER_DB) is a SQLite file, created if missing, or a
PostgreSQL database named by a postgres:// URL, whose schema is created if missing.

The simulator's write tool keeps its side effects in its own store, --effects, by
default beside a SQLite database in <db>.effects.db.

Each principal may send --rate-limit requests a second on average and --rate-burst at
once (429 with Retry-After above that); a client address gets the same allowance of
answers of 401, after which its requests are refused (429) before their token is
looked at. --rate-limit 0 turns both off. /healthz, /readyz, /metrics and
/v1/openapi.json are never limited. Each principal may also hold at most --max-streams
event streams open and --max-long-polls long-polls waiting at once (429 beyond).

On SIGTERM or SIGINT serve stops accepting connections, waits up to
--shutdown-timeout for requests in flight, stops the workers (an attempt interrupted
mid-call stays started; the recovery scan of the next start settles it), closes the
stores and exits 0. Logs are structured (slog), JSON on stderr by default.

Several processes (serve, worker) may share one database: each advances and recovers
only the runs whose leases it holds, renewed every third of --lease-ttl (or
$LEDGER_LEASE_TTL); the runs of a process that stops renewing are taken over by another
once its leases lapse, or at once when it was a process of this host that no longer
exists. $LEDGER_LEASE_OWNER names this replica in its leases (a pod's name, say) in place
of the host. See docs/operations.md, "Several processes on one database".`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addr := os.Getenv(envAddr); addr != "" && !cmd.Flags().Changed("addr") {
				o.addr = addr
			}
			return runServe(cmd.Context(), &o, cmd.ErrOrStderr())
		},
		Example: `  ledger serve                                  # dev mode: ./ledger.db on 127.0.0.1:8080
  ledger serve --db /var/lib/ledger/ledger.db --addr 0.0.0.0:8080 --tokens /etc/ledger/tokens.json
  ledger serve --tokens tokens.json --config ledger.yaml   # client agents, their tools and rules
  kill -HUP $(pidof ledger)                     # re-read the tokens file`,
	}
	f := cmd.Flags()
	addDBFlag(cmd, &o.dbPath)
	f.StringVar(&o.effectsPath, "effects", "", "the simulator's effect store (default <db>.effects.db; ./ledger.effects.db with a postgres:// --db)")
	f.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen address HOST:PORT (env "+envAddr+"; port 0 picks a free one)")
	f.StringVar(&o.tokensPath, "tokens", "", "tokens file (env "+envTokensFile+"); none means dev mode")
	f.StringVar(&o.rulesPath, "rules", "", "approval rules file (schema rules); default: reads run, writes need approval")
	f.StringVar(&o.configPath, "config", "", "the operator's config file, YAML or JSON: tools, agents, rules (env "+envConfig+"; docs/operations.md)")
	f.StringVar(&o.logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.Int64Var(&o.maxBodyBytes, "max-body-bytes", 1<<20, "largest request body accepted (413 above)")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long to wait for requests in flight on shutdown")
	f.DurationVar(&o.leaseTTL, "lease-ttl", 0, "how long a run lease holds unless renewed (env "+envLeaseTTL+"; default 15s)")
	f.Float64Var(&o.rateLimit, "rate-limit", server.DefaultRateLimit, "requests a second each principal may send, on average (0: no limit)")
	f.IntVar(&o.rateBurst, "rate-burst", server.DefaultRateBurst, "requests each principal may send at once")
	f.IntVar(&o.maxPending, "max-pending-approvals", server.DefaultMaxPendingApprovals,
		"per tenant: refuse new runs (429) while this many approvals are pending or runs queued or running; 0 means no cap")
	f.IntVar(&o.maxStreams, "max-streams", server.DefaultMaxStreams, "event streams each principal may hold open at once (429 beyond); 0 means no cap")
	f.IntVar(&o.maxLongPolls, "max-long-polls", server.DefaultMaxLongPolls, "long-polls each principal may have waiting at once (429 beyond); 0 means no cap")
	f.StringVar(&o.signingKeyPath, "signing-key", "", "sign each run's chain head with this Ed25519 key file (env "+envSigningKeyFile+"; make one with `ledger signing-key new`)")
	f.BoolVar(&o.allowUnsigned, "allow-unsigned", false, allowUnsignedUsage)
	return asUsage(cmd)
}

// rulesCount is how many rules a rules file holds; 0 without one.
func rulesCount(r *contracts.Rules) int {
	if r == nil {
		return 0
	}
	return len(r.Rules)
}

// newLogger builds the structured logger of serve.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, usagef("--log-format %q: want json or text", format)
	}
}

func runServe(ctx context.Context, o *serveOptions, stderr io.Writer) (err error) {
	log, err := newLogger(stderr, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	if o.maxBodyBytes <= 0 {
		return usagef("--max-body-bytes must be positive")
	}
	if o.shutdownTimeout <= 0 {
		return usagef("--shutdown-timeout must be positive")
	}
	if o.leaseTTL < 0 {
		return usagef("--lease-ttl must be positive")
	}
	if o.rateLimit < 0 || math.IsNaN(o.rateLimit) || math.IsInf(o.rateLimit, 0) {
		return usagef("--rate-limit must be a number of requests a second, 0 for no limit")
	}
	if o.rateBurst < 1 {
		return usagef("--rate-burst must be at least 1")
	}
	if o.maxPending < 0 {
		return usagef("--max-pending-approvals cannot be negative (0 means no cap)")
	}
	if o.maxStreams < 0 || o.maxLongPolls < 0 {
		return usagef("--max-streams and --max-long-polls cannot be negative (0 means no cap)")
	}
	if _, _, err := net.SplitHostPort(o.addr); err != nil {
		return usagef("--addr %q: want HOST:PORT: %v", o.addr, err)
	}
	tokensPath := o.tokensPath
	if tokensPath == "" {
		tokensPath = os.Getenv(envTokensFile)
	}
	var tokens *server.Tokens
	devMode := tokensPath == ""
	if devMode {
		if !isLoopback(o.addr) {
			return usagef("dev mode (no --tokens and no $%s) serves loopback addresses only, not %q: give a tokens file, or --addr 127.0.0.1:PORT", envTokensFile, o.addr)
		}
		log.Warn(devModeWarning, "dev_mode", true, "principal", "dev", "tenant", "default")
	} else {
		if tokens, err = loadTokens(log, tokensPath); err != nil {
			return &usageError{err: fmt.Errorf("tokens file: %w", err)}
		}
	}
	configPath := configFrom(o.configPath)
	cfg, err := loadConfig(configPath)
	if err != nil {
		return err
	}
	rules, err := configuredRules(o.rulesPath, configPath, cfg)
	if err != nil {
		return err
	}
	if cfg != nil {
		log.Info("config file loaded", "config", configPath, "tools", len(cfg.Tools), "agents", len(cfg.Agents), "rules", cfg.Rules != nil)
	}

	// Fault plans and simulator settings come from the process environment
	// only (faults.go): whoever starts the process chose them, never a
	// request. They are for the crash tests and the fault matrix.
	faults, err := faultsFromEnv()
	if err != nil {
		return &usageError{err: err}
	}
	if plan, simCfg := os.Getenv(envFaultPlan), os.Getenv(envSimulatorConfig); plan != "" || simCfg != "" {
		log.Warn("FAULT INJECTION: this process runs with a fault plan or simulator configuration from its environment; it may kill itself or fail tool calls on purpose",
			"fault_plan", plan, "simulator_config", simCfg)
	}

	signingKey, err := signingKeyFrom(log, o.signingKeyPath)
	if err != nil {
		return err
	}
	if signingKey != nil {
		log.Info("chain heads are signed", "key_id", ledger.SigningKeyID(signingKey.Public().(ed25519.PublicKey)))
	}

	// The store's commits, the engine's tool calls and the recovery
	// decisions are counted by the server's metrics, which exist only once
	// the server does (it needs the store and the engine); the recovery
	// scan and the first request come after it.
	var metrics atomic.Pointer[server.Metrics]
	// The address the server listens on, for the URLs the MCP gateway's
	// answers name: --addr until the listener is bound (port 0 resolved).
	var listening atomic.Pointer[string]
	listening.Store(&o.addr)
	svc, err := openService(ctx, serviceConfig{DBPath: o.dbPath, EffectsPath: o.effectsPath, Rules: rules, Config: cfg, DevMode: devMode, Simulator: faults.Simulator,
		FaultFunc: faults.Func, WrapStore: faults.WrapStore, WriteFault: faults.WriteFault, OnEffects: faults.UseEffects, Logger: log, SigningKey: signingKey, AllowUnsigned: o.allowUnsigned, LeaseTTL: o.leaseTTL,
		// The MCP gateway's clients are sent to the action's URL to approve
		// (the console's page once there is one).
		ApprovalURL:         func(id ledger.ActionID) string { return "http://" + *listening.Load() + "/v1/actions/" + string(id) },
		MaxPendingApprovals: o.maxPending,
		OnDecision: func(d recovery.Decision) {
			if m := metrics.Load(); m != nil {
				m.ObserveDecision(d)
			}
		},
		OnCommit: func(c ledger.CommitStats) {
			if m := metrics.Load(); m != nil {
				m.ObserveCommit(c)
			}
		},
		OnToolCall: func(c engine.ToolCallStats) {
			if m := metrics.Load(); m != nil {
				m.ObserveToolCall(c)
			}
		}})
	if err != nil {
		return err
	}
	// The digest every gated action records, so an auditor can match an
	// action's rules digest to the process and rules file that gated it.
	log.Info("approval rules in force", "rules_digest", svc.approvals.RulesDigest(), "rules_file", o.rulesPath,
		"rules", rulesCount(rules))
	defer func() {
		// Last: the workers are stopped by now (Close stops them again,
		// harmlessly), so nothing writes to the stores while they close.
		if cerr := svc.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close stores: %w", cerr))
		}
	}()
	srv, err := server.New(server.Config{
		Store:               svc.store,
		Engine:              svc.engine,
		Approvals:           svc.approvals,
		Tokens:              tokens,
		Logger:              log,
		MaxBodyBytes:        o.maxBodyBytes,
		RateLimit:           o.rateLimit,
		RateBurst:           o.rateBurst,
		Now:                 time.Now,
		Redaction:           svc.redactor,
		Version:             Version,
		MaxPendingApprovals: o.maxPending,
		MaxStreams:          o.maxStreams,
		MaxLongPolls:        o.maxLongPolls,
		ClientTools:         svc.clientTools,
		HTTPTools:           svc.httpTools,
		MCP:                 svc.gateway,
		MCPAgent:            mcpAgentOf(cfg),
	})
	if err != nil {
		return fmt.Errorf("build server: %w", err)
	}
	defer reloadTokensOnHUP(log, srv, tokensPath)()
	metrics.Store(srv.Metrics())
	// Every action a crash interrupted gets its decision before the first
	// request or worker can touch it.
	if err := svc.recover(ctx); err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.addr, err)
	}
	bound := ln.Addr().String()
	listening.Store(&bound)
	// The workers outlive the signal: they are stopped explicitly, after
	// the HTTP server has drained, not by the signal's context.
	svc.engine.Start(context.WithoutCancel(ctx))
	defer svc.engine.Stop()

	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	log.Info("listening on "+url, "addr", ln.Addr().String(), "url", url, "db", shownDB(o.dbPath), "dev_mode", devMode)

	select {
	case err := <-serveErr:
		// Serve never returns nil; ErrServerClosed cannot happen before Shutdown.
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "cause", context.Cause(ctx).Error(), "timeout", o.shutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.shutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil {
		log.Warn("requests still in flight at the shutdown timeout; closing their connections", "err", err)
		_ = hs.Close()
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	svc.engine.Stop()
	log.Info("stopped")
	return nil
}

// isLoopback reports whether addr's host is a loopback address: "localhost"
// or a literal loopback IP. An empty host means every interface, and a
// name other than localhost could resolve anywhere; both are refused.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// configFrom is the config file a command uses: its --config flag, else
// $LEDGER_CONFIG; "" for none.
func configFrom(flag string) string {
	if flag != "" {
		return flag
	}
	return os.Getenv(envConfig)
}

// mcpAgentOf is the agent of the config's MCP gateway, "" if it has none.
func mcpAgentOf(cfg *config.Config) string {
	if cfg == nil || cfg.MCP == nil {
		return ""
	}
	return cfg.MCP.AgentName()
}

// loadConfig loads the operator's config file, if path names one; a file
// with problems is a usage error listing them all.
func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		return nil, nil
	}
	cfg, err := config.Load(path, builtins())
	if err != nil {
		return nil, &usageError{err: err}
	}
	return cfg, nil
}
