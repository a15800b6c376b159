package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/actionledger/ledger/faultmatrix"
	"github.com/spf13/cobra"
)

func newFaultMatrixCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "faultmatrix",
		Short: "Kill and restart this binary at every dangerous point and check what survived",
		Example: `  ledger faultmatrix run
  ledger faultmatrix run --list`,
	}
	var (
		scenario, report, binary string
		seed                     uint64
		parallel                 int
		list                     bool
	)
	run := &cobra.Command{
		Use:   "run",
		Short: "Run the fault matrix (or one scenario) against this binary",
		Long: `Start this very binary as ` + "`ledger serve`" + ` with a fault plan for each scenario, let the plan
SIGKILL it at the fault point, start it again, let recovery act, and check against the
simulator's own effect store: never two effects for one action, no effect lost, every
unknown effect in review with a rationale, the event chain valid. Prints a line per
scenario and a final table; --report writes the machine-readable report. Exits 1 if any
expectation fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if list {
				for _, sc := range faultmatrix.Select(scenario, seed) {
					fmt.Fprintf(cmd.OutOrStdout(), "%-58s %s\n", sc.Name, sc.Fault)
				}
				return nil
			}
			bin := binary
			if bin == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				bin = exe
			}
			rep, err := faultmatrix.Run(cmd.Context(), faultmatrix.Options{Binary: bin, Filter: scenario, Seed: seed,
				Parallel: parallel, Progress: cmd.ErrOrStderr()})
			if err != nil {
				return err
			}
			if report != "" {
				if err := writeReport(report, rep); err != nil {
					return err
				}
			}
			if err := rep.WriteTable(cmd.OutOrStdout()); err != nil {
				return err
			}
			if rep.Failed > 0 {
				return fmt.Errorf("fault matrix: %d of %d scenarios failed", rep.Failed, rep.Total)
			}
			return nil
		},
		Example: `  ledger faultmatrix run --report faultmatrix.json
  ledger faultmatrix run --scenario crash/after_tool_call
  ledger faultmatrix run --list`,
	}
	run.Flags().StringVar(&scenario, "scenario", "", "run one scenario, or every scenario under a prefix (crash/after_tool_call)")
	run.Flags().StringVar(&report, "report", "", "write the JSON report to this file")
	run.Flags().Uint64Var(&seed, "seed", 1, "order of the scenarios")
	run.Flags().IntVar(&parallel, "parallel", 3, "scenarios at once")
	run.Flags().StringVar(&binary, "binary", "", "the ledger binary to test (default: this one)")
	run.Flags().BoolVar(&list, "list", false, "list the scenarios and exit")
	cmd.AddCommand(run)
	return cmd
}

// writeReport writes the report atomically, validated against its schema.
func writeReport(path string, rep *faultmatrix.Report) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return err
	}
	if err := faultmatrix.ValidateReport(buf.Bytes()); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".faultmatrix-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
