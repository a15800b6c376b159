package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/config"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
)

func newRulesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rules",
		Short: "Show the approval rule sets the gates ran with",
		Args:  usageArgs(cobra.NoArgs),
		Example: `  ledger rules show --db ./ledger.db
  ledger rules show sha256:3f… --db ./ledger.db`,
	}
	cmd.AddCommand(newRulesShowCmd())
	return asUsage(cmd)
}

func newRulesShowCmd() *cobra.Command {
	var dbPath, rulesPath, configPath string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show [DIGEST]",
		Short: "Print a rule set: the one stored under DIGEST, the one configured, or the latest stored",
		Long: `Print an approval rule set: its rules in file order (rule N is the JSON Pointer
/rules/N that an action's gate names) and the defaults that decide where no rule
matches. Every action records the digest of the rule set that gated it, and ledger
serve stores the rule set it runs with under that digest when it starts.

  DIGEST            the rule set stored under DIGEST in --db (exit status 5 if none is)
  --rules, --config the rule set these files configure (as ledger serve would run it)
  neither           the rule set stored last in --db

--json prints the rule set's document, the canonical JSON its digest covers.`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			configured := rulesPath != "" || configFrom(configPath) != ""
			if len(args) == 1 && configured {
				return usagef("rules show: give DIGEST or --rules/--config, not both")
			}
			if len(args) == 1 && !ledger.Digest(args[0]).Valid() {
				return usagef("rules show: %q is not a rules digest (sha256: and 64 hex digits)", args[0])
			}
			var rs *ledger.RuleSet
			var source string
			if configured {
				cfg, err := loadConfig(configFrom(configPath))
				if err != nil {
					return err
				}
				rules, err := configuredRules(rulesPath, configFrom(configPath), cfg)
				if err != nil {
					return err
				}
				policy, err := approval.NewPolicy(rules, approval.Defaults{})
				if err != nil {
					return err
				}
				rs, source = &ledger.RuleSet{Digest: policy.RulesDigest(), Document: policy.RuleSet()}, "configured, as ledger serve would run it"
			} else {
				var err error
				if rs, err = storedRuleSet(cmd, dbPath, args); err != nil {
					return err
				}
				source = "stored " + rs.StoredAt.UTC().Format(time.RFC3339Nano)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), rs.Document)
			}
			return printRuleSet(cmd.OutOrStdout(), rs, source)
		},
		Example: `  ledger rules show --db ./ledger.db
  ledger rules show sha256:3f… --db ./ledger.db --json
  ledger rules show --rules rules.json`,
	}
	addDBFlag(cmd, &dbPath)
	f := cmd.Flags()
	f.StringVar(&rulesPath, "rules", "", "show the rule set of this rules file (schema rules)")
	f.StringVar(&configPath, "config", "", "show the rule set of this config file (env "+envConfig+")")
	f.BoolVar(&asJSON, "json", false, "print the rule set's canonical JSON document")
	return asUsage(cmd)
}

// storedRuleSet is the rule set stored under args[0] in the database at
// path, or the latest stored without args.
func storedRuleSet(cmd *cobra.Command, path string, args []string) (*ledger.RuleSet, error) {
	ctx := cmd.Context()
	store, err := openExistingStore(ctx, path)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	f := ledger.RuleSetFilter{Limit: 1}
	if len(args) == 1 {
		f.Digests = []ledger.Digest{ledger.Digest(args[0])}
	}
	found, err := store.FindRuleSets(ctx, f)
	switch {
	case err != nil:
		return nil, err
	case len(found) == 0 && len(args) == 1:
		return nil, &notFoundError{err: ledger.Errorf(ledger.CodeNotFound, "rule set %s is not stored in %s", args[0], path)}
	case len(found) == 0:
		return nil, &notFoundError{err: ledger.Errorf(ledger.CodeNotFound,
			"no rule set is stored in %s: ledger serve stores the rule set it runs with when it starts", path)}
	}
	if err := found[0].Check(); err != nil {
		return nil, err
	}
	return found[0], nil
}

// configuredRules is the rules of a rules file and of cfg, the config file
// at configPath (nil if none), which may not both have rules; nil if
// neither has any. A rules file that does not parse is a usage error.
func configuredRules(rulesPath, configPath string, cfg *config.Config) (*contracts.Rules, error) {
	var rules *contracts.Rules
	if rulesPath != "" {
		data, err := os.ReadFile(rulesPath)
		if err != nil {
			return nil, usagef("--rules: %w", err)
		}
		if rules, err = contracts.ParseRules(data); err != nil {
			return nil, &usageError{err: fmt.Errorf("rules file %s: %w", rulesPath, err)}
		}
	}
	if cfg != nil && cfg.Rules != nil {
		if rules != nil {
			return nil, usagef("--rules %s and the rules of config file %s: give the rules in one place", rulesPath, configPath)
		}
		rules = cfg.Rules
	}
	return rules, nil
}

// ruleSetDocument is the document a rules digest covers
// (approval.Policy.RuleSet), for printing.
type ruleSetDocument struct {
	Rules    []contracts.Rule `json:"rules"`
	Defaults struct {
		ApprovalTTLMS int64             `json:"approval_ttl_ms"`
		Effects       map[string]string `json:"effects"`
		UnknownEffect string            `json:"unknown_effect"`
	} `json:"defaults"`
}

// printRuleSet prints a rule set in words, one rule a line.
func printRuleSet(w io.Writer, rs *ledger.RuleSet, source string) error {
	var doc ruleSetDocument
	if err := json.Unmarshal(rs.Document, &doc); err != nil {
		return fmt.Errorf("rule set %s: %w", rs.Digest, err)
	}
	fmt.Fprintf(w, "rule set %s (%s)\n", rs.Digest, source)
	if len(doc.Rules) == 0 {
		fmt.Fprintln(w, "no rules: the defaults decide")
	}
	for i, r := range doc.Rules {
		fmt.Fprintf(w, "rule %d: %s\n", i, ruleText(r))
	}
	d := doc.Defaults
	fmt.Fprintf(w, "default: read %s, write %s, other effects %s; approvals open %s\n",
		d.Effects["read"], d.Effects["write"], d.UnknownEffect, time.Duration(d.ApprovalTTLMS)*time.Millisecond)
	return nil
}

// ruleText is one rule in words: what it matches, then what it decides.
func ruleText(r contracts.Rule) string {
	match := []string{"tool " + displayText(r.Tool)}
	if r.Tenant != "" {
		match = append(match, "tenant "+displayText(r.Tenant))
	}
	if r.Effect != "" {
		match = append(match, "effect "+string(r.Effect))
	}
	s := strings.Join(match, ", ") + ": " + string(r.Decision)
	if r.ApprovalTTLMS > 0 {
		s += fmt.Sprintf(", approvals open %s", r.ApprovalTTL())
	}
	if r.AllowSelfApproval {
		s += ", the submitter may approve"
	}
	if r.AllowSelfConfirmation {
		s += ", an MCP client may confirm"
	}
	return s
}
