package ledger

import (
	"context"
	"fmt"
)

// readRecord reads on r (FindChain's snapshot) a run with its budget,
// actions, attempts, approvals, cancellation, observations, the stored
// rule sets its actions cite and the newest signature of its head. If ctx ends during the read, its error is the
// result.
func readRecord(ctx context.Context, r Reader, run RunID, out *Chain) (err error) {
	defer func() {
		if cerr := ctx.Err(); err != nil && cerr != nil {
			err = cerr
		}
	}()
	if out.Run, err = r.GetRun(ctx, run); err != nil {
		return err
	}
	if out.Actions, err = r.ListActions(ctx, ActionFilter{RunID: &run}); err != nil {
		return fmt.Errorf("read actions: %w", err)
	}
	if out.Attempts, err = r.ListAttempts(ctx, AttemptFilter{RunID: &run}); err != nil {
		return fmt.Errorf("read attempts: %w", err)
	}
	if out.Approvals, err = r.ListApprovals(ctx, ApprovalFilter{RunID: &run}); err != nil {
		return fmt.Errorf("read approvals: %w", err)
	}
	out.Cancellation, err = r.GetCancellation(ctx, run)
	switch {
	case Code(err) == CodeNotFound:
		out.Cancellation = nil
	case err != nil:
		return err
	}
	if out.Observations, err = r.ListObservations(ctx, ObservationFilter{RunID: &run}); err != nil {
		return fmt.Errorf("read observations: %w", err)
	}
	if cited := citedRuleSets(out.Actions); len(cited) > 0 {
		if out.RuleSets, err = readRuleSets(ctx, r, RuleSetFilter{Digests: cited}); err != nil {
			return fmt.Errorf("read rule sets: %w", err)
		}
	}
	out.Signature, err = r.GetSignature(ctx, run)
	switch {
	case Code(err) == CodeNotFound:
		out.Signature = nil
	case err != nil:
		return fmt.Errorf("read head signature: %w", err)
	}
	return ctx.Err()
}
