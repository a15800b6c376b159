package main

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
	"github.com/spf13/cobra"
)

// errDemoFailed means the demo ran but its effect count was not exactly one.
var errDemoFailed = errors.New("demo: expected exactly one effect")

func newDemoCmd() *cobra.Command {
	var (
		keep, signingKey string
		allowUnsigned    bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole approval-gated flow once on a temporary database",
		Long: `Submit a practice-cards run from a shipped Markdown document, show the pending
write action and its digest, approve it as a second principal, execute it, and print
the run, its stop reason and the effect count read from the simulator's own store.
Exits non-zero unless exactly one effect was recorded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := keep
			if dir == "" {
				tmp, err := os.MkdirTemp("", "ledger-demo-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(tmp)
				dir = tmp
			} else if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			key, err := signingKeyFrom(warningLogger(cmd.ErrOrStderr()), signingKey)
			if err != nil {
				return err
			}
			return runDemo(cmd, dir, key, allowUnsigned)
		},
		Example: `  ledger demo
  ledger demo --keep ./demo && ledger simulator effects --store ./demo/ledger.db.effects.db`,
	}
	cmd.Flags().StringVar(&keep, "keep", "", "keep the databases in this directory instead of a temporary one")
	cmd.Flags().StringVar(&signingKey, "signing-key", "", "sign chain heads with this Ed25519 key file (env "+envSigningKeyFile+")")
	cmd.Flags().BoolVar(&allowUnsigned, "allow-unsigned", false, allowUnsignedUsage)
	return cmd
}

func runDemo(cmd *cobra.Command, dir string, signingKey ed25519.PrivateKey, allowUnsigned bool) error {
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	rt, err := openService(ctx, serviceConfig{DBPath: filepath.Join(dir, "ledger.db"), Logger: discardLogger(), SigningKey: signingKey,
		AllowUnsigned: allowUnsigned, Warnings: warningLogger(cmd.ErrOrStderr())})
	if err != nil {
		return err
	}
	defer rt.Close()

	title, markdown := simulator.SampleDocument()
	input, err := json.Marshal(map[string]string{"title": title, "markdown": markdown})
	if err != nil {
		return err
	}
	submit := ledger.SubmitRunParams{Tenant: "demo", IdempotencyKey: "demo-run-1", Principal: "alice",
		Agent: "practice-cards", Input: input}
	res, err := rt.store.SubmitRun(ctx, submit)
	if err != nil {
		return err
	}
	run := res.Run
	if res.Replayed {
		// A kept directory from an earlier demo: the key resolves to the
		// same run, which already ran; show its outcome again.
		step(out, "1. alice's submit resolves to the existing run %s (replayed: true)", run.ID)
		return report(cmd, rt, run.ID)
	}
	step(out, "1. alice submitted run %s (agent practice-cards, document %q)", run.ID, title)

	if err := rt.engine.Advance(ctx, run.ID); err != nil {
		return err
	}
	pending, err := rt.approvals.Pending(ctx, "demo", 10)
	if err != nil {
		return err
	}
	if len(pending) != 1 {
		return fmt.Errorf("demo: expected one pending approval, found %d", len(pending))
	}
	action, err := rt.store.FindActionByID(ctx, pending[0].ActionID)
	if err != nil {
		return err
	}
	var args struct {
		Cards []simulator.Card `json:"cards"`
	}
	if err := json.Unmarshal(action.Arguments, &args); err != nil {
		return err
	}
	step(out, "2. the model proposed %s %s (%s) with %d cards; it waits for approval", action.ID, action.Tool, action.Effect, len(args.Cards))
	for i, c := range args.Cards {
		fmt.Fprintf(out, "     card %d: %s\n", i+1, c.Front)
	}
	fmt.Fprintf(out, "     action digest: %s\n", action.ActionDigest)

	if _, err := rt.approvals.Decide(ctx, approval.DecideParams{Tenant: "demo", Principal: "alice", ActionID: action.ID,
		ActionDigest: action.ActionDigest, Decision: ledger.DecisionGrant}); err != nil {
		step(out, "3. alice tries to approve her own run's action: refused (%v)", ledger.Code(err))
	} else {
		return errors.New("demo: self-approval was not refused")
	}
	if _, err := rt.approvals.Decide(ctx, approval.DecideParams{Tenant: "demo", Principal: "bob", ActionID: action.ID,
		ActionDigest: action.ActionDigest, Decision: ledger.DecisionGrant, Reason: "cards look right"}); err != nil {
		return err
	}
	step(out, "4. bob approved digest %s…", action.ActionDigest[:19])

	if err := rt.engine.Advance(ctx, run.ID); err != nil {
		return err
	}
	again, err := rt.store.SubmitRun(ctx, submit)
	if err != nil {
		return err
	}
	step(out, "5. the same submit again resolves to the same run: %s (replayed: %t)", again.Run.ID, again.Replayed)
	return report(cmd, rt, run.ID)
}

// report prints the run's outcome and the effect count read from the
// simulator's store, and fails unless exactly one effect was recorded.
func report(cmd *cobra.Command, rt *service, id ledger.RunID) error {
	ctx, out := cmd.Context(), cmd.OutOrStdout()
	run, err := rt.store.FindRunByID(ctx, id)
	if err != nil {
		return err
	}
	effects, err := rt.effects.Effects(ctx)
	if err != nil {
		return err
	}
	chain, err := rt.store.VerifyChain(ctx, run.ID)
	if err != nil {
		return err
	}
	step(out, "6. run %s is %s, stop reason %s; %d events, chain valid: %t", run.ID, run.State, run.StopReason, chain.Events, chain.OK)
	step(out, "7. effects counted in the simulator's own store (ledger.db.effects.db, which the ledger never writes): %d", len(effects))
	for _, e := range effects {
		fmt.Fprintf(out, "     %s %s args %s\n", e.Tool, e.DedupKey, e.ArgumentsDigest)
	}
	if len(effects) != 1 || run.State != ledger.RunCompleted || !chain.OK {
		return errDemoFailed
	}
	return nil
}

func step(w io.Writer, format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
