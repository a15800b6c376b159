package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/actionledger/ledger/config"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/spf13/cobra"
)

// ledger mcp: the MCP gateway over stdio, and its tools' confirmations.

func newMCPCmd() *cobra.Command {
	var (
		o                  mcpOptions
		signingKey, apiURL string
		allowUnsigned      bool
		tenant, principal  string
		logLevel           string
	)
	cmd := &cobra.Command{
		Use:   "mcp --config FILE",
		Short: "Serve the MCP gateway over stdio: every tool call of the client through the ledger",
		Long: `Serve MCP over stdin and stdout in front of the MCP servers the config file's mcp section lists
(its upstreams). The client sees each confirmed upstream tool as <upstream>__<tool>; each call is an
action of the ledger: recorded before the upstream is called, gated by the rules (a write waits for
a person to approve its exact arguments), recovered after a crash. Run it as the command of an MCP
client's server entry; logs go to stderr. Approvals are given through ` + "`ledger serve`" + ` on the
same database (ledger approve, the API). A tool is served only once its upstream definition is
confirmed: see ` + "`ledger mcp tools`" + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log, err := newLogger(cmd.ErrOrStderr(), "text", logLevel)
			if err != nil {
				return err
			}
			if tenant == "" || principal == "" {
				return usagef("--tenant and --principal cannot be empty")
			}
			cfg, err := o.config()
			if err != nil {
				return err
			}
			faults, err := faultsFromEnv()
			if err != nil {
				return &usageError{err: err}
			}
			key, err := signingKeyFrom(log, signingKey)
			if err != nil {
				return err
			}
			if apiURL == "" {
				apiURL = os.Getenv(envServer)
			}
			var approvalURL func(ledger.ActionID) string
			if apiURL != "" {
				base := strings.TrimRight(apiURL, "/")
				approvalURL = func(id ledger.ActionID) string { return base + "/v1/actions/" + string(id) }
			}
			svc, err := openService(ctx, serviceConfig{DBPath: o.dbPath, Config: cfg, Rules: cfg.Rules, Logger: log, SigningKey: key,
				AllowUnsigned: allowUnsigned, Simulator: faults.Simulator, FaultFunc: faults.Func, WrapStore: faults.WrapStore,
				WriteFault: faults.WriteFault, OnEffects: faults.UseEffects, ApprovalURL: approvalURL})
			if err != nil {
				return err
			}
			defer svc.Close()
			if err := svc.recover(ctx); err != nil {
				return err
			}
			svc.engine.Start(context.WithoutCancel(ctx))
			defer svc.engine.Stop()
			log.Info("mcp gateway on stdio", "tools", len(svc.gateway.Agent().Tools), "lock_file", svc.gateway.LockPath(),
				"tenant", tenant, "principal", principal)
			err = svc.gateway.ServeStdio(ctx, mcpgw.Identity{Tenant: tenant, Principal: principal}, os.Stdin, os.Stdout)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
		Example: `  ledger mcp --config ./ledger.yaml --db ./ledger.db
  ledger mcp tools list --config ./ledger.yaml
  ledger mcp tools confirm --config ./ledger.yaml --all`,
	}
	o.flags(cmd)
	cmd.Flags().StringVar(&tenant, "tenant", "default", "the tenant of the calls")
	cmd.Flags().StringVar(&principal, "principal", defaultMCPPrincipal(), "the principal the calls are made as (it cannot approve them outside dev mode)")
	cmd.Flags().StringVar(&apiURL, "api-url", "", "the URL of ledger serve on the same database, named in answers that wait for approval (env "+envServer+")")
	cmd.Flags().StringVar(&signingKey, "signing-key", "", "sign chain heads with this Ed25519 key file (env "+envSigningKeyFile+")")
	cmd.Flags().BoolVar(&allowUnsigned, "allow-unsigned", false, allowUnsignedUsage)
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error (logs go to stderr)")
	cmd.AddCommand(newMCPToolsCmd())
	return cmd
}

// defaultMCPPrincipal is mcp:<user>, the principal of a stdio gateway
// started without --principal.
func defaultMCPPrincipal() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "mcp:" + u.Username
	}
	return "mcp"
}

// mcpOptions are the flags every mcp command has.
type mcpOptions struct {
	configPath, dbPath string
}

func (o *mcpOptions) flags(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&o.configPath, "config", "", "the operator's config file, with its mcp section (env "+envConfig+")")
	cmd.Flags().StringVar(&o.dbPath, "db", defaultDB, dbFlagUsage)
}

// config loads the config file, which must have an mcp section.
func (o *mcpOptions) config() (*config.Config, error) {
	path := configFrom(o.configPath)
	if path == "" {
		return nil, usagef("--config is required: the file whose mcp section lists the upstreams")
	}
	cfg, err := loadConfig(path)
	if err != nil {
		return nil, err
	}
	if cfg.MCP == nil {
		return nil, usagef("%s has no mcp section", path)
	}
	return cfg, nil
}

func newMCPToolsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tools",
		Short: "List the upstreams' tools and confirm their definitions",
		Long: `A tool is served only while its upstream's definition is the one an operator confirmed for its
profile, kept in the lock file (mcp.lock_file, default mcp-tools.lock.json beside the config).
` + "`list`" + ` connects to every upstream and shows each tool's status: confirmed, unconfirmed (never
confirmed), changed (the upstream's definition differs from the confirmed one: hidden until
confirmed again) or gone (confirmed, but the upstream no longer lists it). ` + "`confirm`" + ` records
the definitions the upstreams list now.`,
	}
	cmd.AddCommand(newMCPToolsListCmd(), newMCPToolsConfirmCmd())
	cmd.Example = `  ledger mcp tools list --config ./ledger.yaml
  ledger mcp tools confirm --config ./ledger.yaml payments__send_payment`
	return cmd
}

// survey lists every upstream's tools with their status against the lock.
func survey(ctx context.Context, o *mcpOptions) (*mcpgw.Gateway, []mcpgw.ToolStatus, error) {
	cfg, err := o.config()
	if err != nil {
		return nil, nil, err
	}
	gw, err := mcpgw.New(mcpgw.Options{Config: cfg.MCP, Dir: filepath.Dir(cfg.Path), Logger: discardLogger(), Version: Version})
	if err != nil {
		return nil, nil, err
	}
	st, err := gw.Survey(ctx)
	if err != nil {
		return nil, nil, errors.Join(err, gw.Close())
	}
	return gw, st, nil
}

func newMCPToolsListCmd() *cobra.Command {
	var (
		o      mcpOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list --config FILE",
		Short: "Connect to every upstream and show each tool's status against the lock file",
		Example: `  ledger mcp tools list --config ./ledger.yaml
  ledger mcp tools list --config ./ledger.yaml --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gw, st, err := survey(cmd.Context(), &o)
			if err != nil {
				return err
			}
			defer gw.Close()
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TOOL\tSTATUS\tEFFECT\tGUARANTEES\tPROFILE")
			for _, s := range st {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.Status, s.Effect, s.Guarantees, orDash(s.Profile))
			}
			return w.Flush()
		},
	}
	o.flags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newMCPToolsConfirmCmd() *cobra.Command {
	var (
		o   mcpOptions
		all bool
		by  string
	)
	cmd := &cobra.Command{
		Use:   "confirm --config FILE (--all | TOOL...)",
		Short: "Record the upstreams' current definitions of these tools as confirmed",
		Long: `Record, in the lock file, the definition each named tool's upstream lists now (TOOL is
<upstream>__<tool>, as clients see it), so that the gateway serves it with its profile. --all
confirms every tool that is not confirmed or has changed. Read what changed first: a changed
definition may change what the tool does. A running gateway reads the lock file when it starts.`,
		Example: `  ledger mcp tools confirm --config ./ledger.yaml --all
  ledger mcp tools confirm --config ./ledger.yaml payments__send_payment payments__get_balance`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return usagef("name the tools to confirm, or give --all")
			}
			gw, st, err := survey(cmd.Context(), &o)
			if err != nil {
				return err
			}
			defer gw.Close()
			var names []string
			for _, s := range st {
				if s.Status == mcpgw.StatusGone {
					continue
				}
				if all && s.Status != mcpgw.StatusConfirmed || slices.Contains(args, s.Name) {
					names = append(names, s.Name)
				}
			}
			for _, a := range args {
				if !slices.ContainsFunc(st, func(s mcpgw.ToolStatus) bool { return s.Name == a && s.Status != mcpgw.StatusGone }) {
					return usagef("no upstream lists a tool %q (see ledger mcp tools list)", a)
				}
			}
			done, err := gw.Confirm(cmd.Context(), names, by, time.Now())
			if err != nil {
				return err
			}
			for _, n := range done {
				fmt.Fprintf(cmd.OutOrStdout(), "confirmed %s\n", n)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d tools confirmed in %s\n", len(done), gw.LockPath())
			return nil
		},
	}
	o.flags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "confirm every tool not confirmed yet or changed")
	cmd.Flags().StringVar(&by, "by", defaultMCPPrincipal(), "who confirms, as the lock file records it")
	return cmd
}
