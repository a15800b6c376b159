//go:build linux

package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/faultmatrix"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/simulator"
)

// TestStopPlan: the fault plan's stop action freezes the real process at
// the point (here after the tool acted, its outcome not recorded) with
// SIGSTOP, never while it holds the effect store: another process writes
// the shared effects file while it is frozen. On SIGCONT it carries on from
// the point, records the outcome and finishes the run: one effect.
func TestStopPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "ledger.db")
	g := contracts.Guarantees{Query: true, Dedup: true, Cancel: true}
	run, action := approvedRun(t, db, g, ledger.BudgetLimits{})
	cmd := exec.Command(ledgerBinary(t), "worker", "--db", db, "--until-idle")
	cmd.Env = append(crashEnv(t, g, ""), envFaultPlan+`={"point":"`+string(engine.FaultAfterToolCall)+`","action":"stop"}`)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-exited
	})
	require.Eventually(t, func() bool {
		stopped, err := faultmatrix.Stopped(cmd.Process.Pid)
		return err == nil && stopped
	}, 20*time.Second, 10*time.Millisecond, "the plan stops the process: %s", &out)

	effects, err := simulator.OpenEffectStore(ctx, db+".effects.db", nil)
	require.NoError(t, err)
	defer effects.Close()
	a, err := func() (*ledger.Action, error) {
		s, err := sqlite.OpenStore(ctx, sqlite.Config{Path: db})
		if err != nil {
			return nil, err
		}
		defer s.Close()
		return s.FindActionByID(ctx, action)
	}()
	require.NoError(t, err)
	n, err := effects.CountEffects(ctx, a.DedupKey)
	require.NoError(t, err)
	require.Equal(t, 1, n, "stopped after the tool acted")
	// Another process writes the shared file while this one is frozen: the
	// stop did not keep its write lock.
	other := simulator.NewTool(simulator.CardsWriteDescriptor(), effects, simulator.ToolConfig{})
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = other.Execute(wctx, engine.Call{DedupKey: "another/action", Attempt: 1, Arguments: []byte(`{"title":"x"}`)})
	require.NoError(t, err, "the frozen process holds the effect store")

	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	select {
	case err := <-exited:
		exited <- err
		require.NoError(t, err, "%s", &out)
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not finish after SIGCONT: %s", &out)
	}
	o := readOutcome(t, db, run, action)
	require.Equal(t, ledger.RunCompleted, o.run.State)
	n, err = effects.CountEffects(ctx, a.DedupKey)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
