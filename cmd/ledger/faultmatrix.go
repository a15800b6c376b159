package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/actionledger/ledger/faultmatrix"
	"github.com/actionledger/ledger/ledger"
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
		python, pythonClient     string
		postgres                 string
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
unknown effect in review with a rationale, the event chain valid. The client-driven
scenarios (client/…, client-server-kill/…, client-gone/…, client-read/…) run a real Python
agent instead, SIGKILL it (or the server) mid-attempt, start it again or never, and check
the agent's own effect store; they are skipped, with the reason, without python3 or the
repository's clients/python. The replica scenarios
(replica/…) run two or three serve processes on one fresh PostgreSQL database (made on the
--postgres server, dropped after a passing scenario) with short run leases, under load, and
SIGKILL one of them mid-attempt, or SIGSTOP it past its leases and wake it once another has
taken its runs over; they are skipped, with the reason, where the server cannot be reached.
Prints a line per
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
				Parallel: parallel, Progress: cmd.ErrOrStderr(), Python: python, PythonClient: pythonClient,
				Postgres: faultmatrix.PostgresServer(postgres)})
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
  ledger faultmatrix run --scenario replica --postgres 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
  ledger faultmatrix run --list`,
	}
	run.Flags().StringVar(&scenario, "scenario", "", "run one scenario, or every scenario under a prefix (crash/after_tool_call)")
	run.Flags().StringVar(&report, "report", "", "write the JSON report to this file")
	run.Flags().Uint64Var(&seed, "seed", 1, "order of the scenarios")
	run.Flags().IntVar(&parallel, "parallel", 3, "scenarios at once")
	run.Flags().StringVar(&binary, "binary", "", "the ledger binary to test (default: this one)")
	run.Flags().BoolVar(&list, "list", false, "list the scenarios and exit")
	run.Flags().StringVar(&python, "python", "", "the Python interpreter of the client-driven scenarios (default: python3 on PATH)")
	run.Flags().StringVar(&pythonClient, "python-client", "", "the directory holding the ledger_client package (default: clients/python found above the working directory or the binary)")
	run.Flags().StringVar(&postgres, "postgres", "", "the PostgreSQL server of the replica scenarios, a postgres:// URL whose user may create databases (default $"+faultmatrix.EnvPostgres+", else "+faultmatrix.DefaultPostgres+")")
	cmd.AddCommand(run, newFaultMatrixWritesCmd())
	return cmd
}

func newFaultMatrixWritesCmd() *cobra.Command {
	var (
		binary, report string
		paths, points  []string
		stride         int
	)
	cmd := &cobra.Command{
		Use:   "writes",
		Short: "Kill this binary at every store write of a representative run and check what survived",
		Long: `For each path (approval: cards.write waits for a person, approved over HTTP; auto: a rule
approves it) and each point (before_commit, after_commit), start this binary as ` + "`ledger serve`" + `
with the plan {"action": "kill", "write": i, "at": POINT} for i = 1, 2, …, drive one run through
the crash as a client would, restart without a plan, and check: the run is terminal or in
review, evidence verify passes, every row is in the state its last event says, the budget
counts what was recorded, and the simulator's own store holds at most one effect per dedup
key (exactly one for a completed run). A loop ends at the first write its run does not
reach. --stride tests every n-th write only. Exits 1 if any check fails.`,
		Example: `  ledger faultmatrix writes
  ledger faultmatrix writes --path approval --at before_commit --report writes.json
  ledger faultmatrix writes --stride 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				binary = exe
			}
			o := faultmatrix.WriteOptions{Binary: binary, Stride: stride, Progress: cmd.ErrOrStderr()}
			for _, p := range paths {
				if p != string(faultmatrix.WritePathApproval) && p != string(faultmatrix.WritePathAuto) {
					return usagef("--path %q: approval or auto", p)
				}
				o.Paths = append(o.Paths, faultmatrix.WritePath(p))
			}
			for _, p := range points {
				if !slices.Contains(ledger.WritePoints(), ledger.WritePoint(p)) {
					return usagef("--at %q: before_commit or after_commit", p)
				}
				o.Points = append(o.Points, ledger.WritePoint(p))
			}
			if stride < 1 {
				return usagef("--stride %d: at least 1", stride)
			}
			rep, err := faultmatrix.RunWrites(cmd.Context(), o)
			if rep != nil && report != "" {
				b, merr := json.MarshalIndent(rep, "", "  ")
				if merr == nil {
					merr = os.WriteFile(report, append(b, '\n'), 0o644)
				}
				err = errors.Join(err, merr)
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, l := range rep.Loops {
				fmt.Fprintf(out, "%-8s %-13s last write struck %3d, %3d crashes\n", l.Path, l.At, l.Writes, len(l.Results))
			}
			fmt.Fprintf(out, "\n%d crashes: %d failed in %.1fs\n", rep.Crashes, rep.Failed, rep.Seconds)
			if rep.Failed > 0 {
				return fmt.Errorf("write crashes: %d of %d failed", rep.Failed, rep.Crashes)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&binary, "binary", "", "the ledger binary to test (default: this one)")
	cmd.Flags().StringSliceVar(&paths, "path", nil, "approval, auto (default: both)")
	cmd.Flags().StringSliceVar(&points, "at", nil, "before_commit, after_commit (default: both)")
	cmd.Flags().IntVar(&stride, "stride", 1, "test every n-th write")
	cmd.Flags().StringVar(&report, "report", "", "write the JSON report to this file")
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
