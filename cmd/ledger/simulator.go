package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/simulator/httpupstream"
	"github.com/actionledger/ledger/simulator/mcpupstream"
)

func newSimulatorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "simulator",
		Short: "Inspect the tool simulator's own side-effect store, or serve its tools over MCP or as http tools",
		Example: `  ledger simulator effects --store ./ledger.db.effects.db
  ledger simulator effects --store ./ledger.db.effects.db --json
  ledger simulator mcp-upstream --store ./upstream.effects.db
  ledger simulator http-tool --store ./http-tool.effects.db --print-addr`,
	}
	cmd.AddCommand(newSimulatorEffectsCmd(), newSimulatorMCPUpstreamCmd(), newSimulatorHTTPToolCmd())
	return cmd
}

func newSimulatorEffectsCmd() *cobra.Command {
	var (
		path   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "effects --store PATH",
		Short: "List the side effects the simulated tools recorded, read from their own store",
		Long: `List every side effect in the simulator's store (by default beside the ledger database,
<db>.effects.db). The ledger never writes this file, so its count is independent evidence
of how often a tool really acted. --json prints one JSON object per effect.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Opening creates a missing file; a typo must not read as "no effects".
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("effect store: %w", err)
			}
			store, err := simulator.OpenEffectStore(cmd.Context(), path, nil)
			if err != nil {
				return err
			}
			defer store.Close()
			effects, err := store.Effects(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				for _, e := range effects {
					if err := enc.Encode(e); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tTOOL\tDEDUP KEY\tARGUMENTS DIGEST\tTIME")
			for _, e := range effects {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", e.Seq, e.Tool, e.DedupKey, e.ArgumentsDigest, e.CreatedAt.Format("2006-01-02T15:04:05.000Z07:00"))
			}
			fmt.Fprintf(tw, "\n%d effects\n", len(effects))
			return tw.Flush()
		},
		Example: `  ledger simulator effects --store ./ledger.db.effects.db
  ledger simulator effects --store ./ledger.db.effects.db --json`,
	}
	cmd.Flags().StringVar(&path, "store", "./ledger.db.effects.db", "path of the simulator's effect store")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per effect")
	return cmd
}

// mcpUpstreamShutdown is how long `simulator mcp-upstream --http` waits for
// requests in flight once signalled (a hang call never ends by itself)
// before it closes their connections.
const mcpUpstreamShutdown = 5 * time.Second

func newSimulatorMCPUpstreamCmd() *cobra.Command {
	var (
		path, configPath, httpAddr string
		misbehaving                bool
	)
	cmd := &cobra.Command{
		Use:   "mcp-upstream --store PATH [--config FILE] [--misbehaving-tools] [--http ADDR]",
		Short: "Serve the simulated tools over MCP, with their effects in their own store (a test and demo upstream)",
		Long: `Serve the simulator's tools as an MCP server: cards_write, cards_count, cards_status and
cards_cancel, keeping their effects in the effect store --store names (created if missing), which
` + "`ledger simulator effects`" + ` lists. It is an upstream for the MCP gateway's tests and demos, not a
product tool: it has no authentication.

A call's dedup key, fencing token, run, action and attempt come from the _meta of its tools/call
request (io.actionledger/dedup_key, …/fencing_token, …/run, …/action, …/attempt); every result says
in its _meta (io.actionledger/effect) whether the call took effect. --config reads a simulator
config file (the JSON of LEDGER_SIMULATOR_CONFIG: guarantees and fault plans under the names
cards.write and cards.count); its crash faults kill this process. --misbehaving-tools adds
huge_read, hang, exit_now (exits with status 3) and malformed, for bad-input tests.

By default it serves one session over stdin and stdout, until stdin closes. With --http it serves
streamable HTTP on ADDR (a loopback address) at the path /mcp, prints that URL as the first line of
stdout, and stops on SIGINT or SIGTERM. Logs go to stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if path == "" {
				return usagef("--store is required: the effect store file (see %s --help)", cmd.CommandPath())
			}
			if httpAddr != "" && !isLoopback(httpAddr) {
				return usagef("--http %q: a loopback address only (this server has no authentication), such as 127.0.0.1:0", httpAddr)
			}
			log := warningLogger(cmd.ErrOrStderr())
			cfg, store, err := openSimulatorTools(cmd.Context(), path, configPath, log)
			if err != nil {
				return err
			}
			defer store.Close()
			srv, err := mcpupstream.New(store, cfg, mcpupstream.Options{Misbehaving: misbehaving, Version: Version, Logger: log})
			if err != nil {
				return err
			}
			if httpAddr == "" {
				err := srv.Run(cmd.Context(), &mcp.StdioTransport{})
				if cmd.Context().Err() != nil {
					return nil // signalled: a normal stop
				}
				return err
			}
			return serveMCPUpstreamHTTP(cmd.Context(), srv, httpAddr, cmd.OutOrStdout(), log)
		},
		Example: `  ledger simulator mcp-upstream --store ./upstream.effects.db
  ledger simulator mcp-upstream --store ./upstream.effects.db --http 127.0.0.1:0
  ledger simulator mcp-upstream --store ./upstream.effects.db --config ./faults.json --misbehaving-tools`,
	}
	cmd.Flags().StringVar(&path, "store", "", "path of the effect store (created if missing)")
	cmd.Flags().StringVar(&configPath, "config", "", "simulator config file: guarantees and fault plans of cards.write and cards.count")
	cmd.Flags().BoolVar(&misbehaving, "misbehaving-tools", false, "add huge_read, hang, exit_now and malformed")
	cmd.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP on this loopback HOST:PORT at /mcp instead of stdio")
	return cmd
}

// openSimulatorTools reads the simulator config file at configPath ("" for
// none) and opens the effect store at storePath, which the caller closes:
// what a command serving the simulator's tools starts from.
func openSimulatorTools(ctx context.Context, storePath, configPath string, log *slog.Logger) (simulator.Config, *simulator.EffectStore, error) {
	cfg, err := simulatorConfigFile(configPath, log)
	if err != nil {
		return cfg, nil, err
	}
	store, err := simulator.OpenEffectStore(ctx, storePath, nil)
	return cfg, store, err
}

// simulatorConfigFile reads the simulator config file at path ("" for
// none), warning on log if it holds a fault plan.
func simulatorConfigFile(path string, log *slog.Logger) (simulator.Config, error) {
	var cfg simulator.Config
	if path == "" {
		return cfg, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, &usageError{err: fmt.Errorf("--config: %w", err)}
	}
	if cfg, err = simulator.ParseConfig(data); err != nil {
		return cfg, &usageError{err: fmt.Errorf("--config %s: %w", path, err)}
	}
	if hasFaults(cfg) {
		log.Warn("a simulator fault plan is configured: calls will fail, hang or crash this process as it says", "config", path)
	}
	return cfg, nil
}

func newSimulatorHTTPToolCmd() *cobra.Command {
	var (
		path, configPath, addr, tokenEnv string
		printAddr                        bool
	)
	cmd := &cobra.Command{
		Use:   "http-tool --store PATH [--addr HOST:PORT] [--print-addr] [--config FILE] [--token-env NAME]",
		Short: "Serve the simulated tools as http tools, with their effects in their own store (a test and demo tool server)",
		Long: `Serve the simulator's tools over HTTP as the ledger's http tools expect them
(docs/http-tools.md), keeping their effects in the effect store --store names (created if
missing), which ` + "`ledger simulator effects`" + ` lists. It is a tool server for tests, demos and
crash tests, not a product tool.

Routes, each POST with a JSON body: /cards.write (a write that dedups by dedup_key and refuses
a call whose fencing_token is lower than the highest its run's calls carried: 409, effect
not_happened, code fenced), /cards.write/query and /cards.write/cancel (by dedup_key), and
/cards.count (a read). Declare cards.write in a config file as an http tool with url
http://ADDR/cards.write, query_url http://ADDR/cards.write/query and cancel_url
http://ADDR/cards.write/cancel.

--config reads a simulator config file (the JSON of LEDGER_SIMULATOR_CONFIG: guarantees and fault
plans under the names cards.write and cards.count); its crash faults kill this process.
--token-env names an environment variable whose value every request must carry as a bearer
token. It listens on --addr (a loopback address; port 0 picks one) and with --print-addr prints
its base URL (http://HOST:PORT) as the first line of stdout; it stops on SIGINT or SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if path == "" {
				return usagef("--store is required: the effect store file (see %s --help)", cmd.CommandPath())
			}
			if !isLoopback(addr) {
				return usagef("--addr %q: a loopback address only (this is a test server), such as 127.0.0.1:0", addr)
			}
			var opts httpupstream.Options
			if tokenEnv != "" {
				if opts.Token = os.Getenv(tokenEnv); opts.Token == "" {
					return usagef("--token-env %s: the variable is not set, or empty", tokenEnv)
				}
			}
			log := warningLogger(cmd.ErrOrStderr())
			cfg, store, err := openSimulatorTools(cmd.Context(), path, configPath, log)
			if err != nil {
				return err
			}
			defer store.Close()
			h, err := httpupstream.New(store, cfg, opts)
			if err != nil {
				return err
			}
			var lc net.ListenConfig
			ln, err := lc.Listen(cmd.Context(), "tcp", addr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", addr, err)
			}
			base := "http://" + ln.Addr().String()
			if printAddr {
				if _, err := fmt.Fprintln(cmd.OutOrStdout(), base); err != nil {
					_ = ln.Close()
					return fmt.Errorf("print the address: %w", err)
				}
			}
			return serveSimulatorHTTP(cmd.Context(), ln, h, log)
		},
		Example: `  ledger simulator http-tool --store ./http-tool.effects.db --print-addr
  ledger simulator http-tool --store ./http-tool.effects.db --addr 127.0.0.1:8091 --token-env SIM_TOKEN
  ledger simulator http-tool --store ./http-tool.effects.db --config ./faults.json`,
	}
	cmd.Flags().StringVar(&path, "store", "", "path of the effect store (created if missing)")
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:0", "loopback HOST:PORT to listen on; port 0 picks a free one")
	cmd.Flags().BoolVar(&printAddr, "print-addr", false, "print the base URL (http://HOST:PORT) as the first line of stdout")
	cmd.Flags().StringVar(&configPath, "config", "", "simulator config file: guarantees and fault plans of cards.write and cards.count")
	cmd.Flags().StringVar(&tokenEnv, "token-env", "", "environment variable holding the bearer token every request must carry")
	return cmd
}

// hasFaults reports whether cfg holds a fault plan for any tool.
func hasFaults(cfg simulator.Config) bool {
	for _, tc := range cfg.Tools {
		if len(tc.Faults) > 0 {
			return true
		}
	}
	return false
}

// serveMCPUpstreamHTTP serves srv as streamable HTTP on addr at /mcp,
// printing the URL as the first line of out, until ctx ends.
func serveMCPUpstreamHTTP(ctx context.Context, srv *mcp.Server, addr string, out io.Writer, log *slog.Logger) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	if _, err := fmt.Fprintf(out, "http://%s/mcp\n", ln.Addr()); err != nil {
		_ = ln.Close()
		return fmt.Errorf("print the URL: %w", err)
	}
	return serveSimulatorHTTP(ctx, ln, mux, log)
}

// serveSimulatorHTTP serves h on ln until ctx ends, then waits up to
// mcpUpstreamShutdown for the requests in flight before it closes their
// connections.
func serveSimulatorHTTP(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mcpUpstreamShutdown)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil {
		log.Warn("requests still in flight at the shutdown timeout; closing their connections", "err", err)
		_ = hs.Close()
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
