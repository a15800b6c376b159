package main

import (
	"context"
	"errors"
	"os"

	"github.com/actionledger/ledger/ledger"
)

// actionStoreFull is the fault plan {"action": "store_full", "while_file":
// PATH}: while PATH exists, every write of this process's ledger store (the
// engine's, the approval service's and the HTTP handlers') fails as on a
// full disk; reads still work, and so does the pool's check for approvals
// to expire, which finds none. Create the file to fill the disk and remove
// it to free it, while the process runs. It takes no point.
const actionStoreFull = "store_full"

// storeFullFaults completes f for a store_full plan, which parseFaultPlan
// has checked.
func storeFullFaults(f faults, plan faultPlan) faults {
	f.WrapWrites = func(s *ledger.GormStore) ledger.Store { return &fullStore{GormStore: s, flag: plan.WhileFile} }
	return f
}

// errDiskFull is what a write answers while the flag file exists: the
// store's own code for an I/O failure, with SQLite's text for SQLITE_FULL.
var errDiskFull = errors.New("database or disk is full (fault plan store_full)")

// fullStore fails every write while its flag file exists. It embeds the
// concrete store, so what only GormStore offers (its schema version, for
// /readyz) stays reachable.
type fullStore struct {
	*ledger.GormStore
	flag string
}

// full reports whether the disk is "full" now.
func (s *fullStore) full(op string) error {
	if _, err := os.Stat(s.flag); err != nil {
		return nil
	}
	return ledger.Errorf(ledger.CodeInternal, "%s: %w", op, errDiskFull)
}

// The writes: each fails while the disk is full, else passes through.

func (s *fullStore) SubmitRun(ctx context.Context, p ledger.SubmitRunParams) (ledger.SubmitRunResult, error) {
	if err := s.full("submit run"); err != nil {
		return ledger.SubmitRunResult{}, err
	}
	return s.GormStore.SubmitRun(ctx, p)
}

func (s *fullStore) TransitionRun(ctx context.Context, p ledger.RunTransition) (*ledger.Run, error) {
	if err := s.full("transition run"); err != nil {
		return nil, err
	}
	return s.GormStore.TransitionRun(ctx, p)
}

func (s *fullStore) CreateAction(ctx context.Context, p ledger.CreateActionParams) (ledger.CreateActionResult, error) {
	if err := s.full("create action"); err != nil {
		return ledger.CreateActionResult{}, err
	}
	return s.GormStore.CreateAction(ctx, p)
}

func (s *fullStore) TransitionAction(ctx context.Context, p ledger.ActionTransition) (*ledger.Action, error) {
	if err := s.full("transition action"); err != nil {
		return nil, err
	}
	return s.GormStore.TransitionAction(ctx, p)
}

func (s *fullStore) StartAttempt(ctx context.Context, p ledger.StartAttemptParams) (*ledger.Attempt, error) {
	if err := s.full("start attempt"); err != nil {
		return nil, err
	}
	return s.GormStore.StartAttempt(ctx, p)
}

func (s *fullStore) FinishAttempt(ctx context.Context, p ledger.FinishAttemptParams) (ledger.FinishAttemptResult, error) {
	if err := s.full("finish attempt"); err != nil {
		return ledger.FinishAttemptResult{}, err
	}
	return s.GormStore.FinishAttempt(ctx, p)
}

func (s *fullStore) RecordObservation(ctx context.Context, p ledger.RecordObservationParams) (*ledger.Observation, *ledger.Attempt, error) {
	if err := s.full("record observation"); err != nil {
		return nil, nil, err
	}
	return s.GormStore.RecordObservation(ctx, p)
}

func (s *fullStore) SettleReview(ctx context.Context, p ledger.SettleReviewParams) (*ledger.Action, error) {
	if err := s.full("settle review"); err != nil {
		return nil, err
	}
	return s.GormStore.SettleReview(ctx, p)
}

func (s *fullStore) DecideApproval(ctx context.Context, p ledger.DecideApprovalParams) (ledger.DecideApprovalResult, error) {
	if err := s.full("decide approval"); err != nil {
		return ledger.DecideApprovalResult{}, err
	}
	return s.GormStore.DecideApproval(ctx, p)
}

// ExpireApprovals answers that nothing is due while the disk is full: on a
// real full disk the check for due approvals is a read, which succeeds on
// every pass of the pool without proving that writes work; expiring one
// waits until the disk is freed.
func (s *fullStore) ExpireApprovals(ctx context.Context) ([]*ledger.Approval, error) {
	if err := s.full("expire approvals"); err != nil {
		return nil, nil
	}
	return s.GormStore.ExpireApprovals(ctx)
}

func (s *fullStore) RequestCancel(ctx context.Context, p ledger.RequestCancelParams) (ledger.RequestCancelResult, error) {
	if err := s.full("request cancel"); err != nil {
		return ledger.RequestCancelResult{}, err
	}
	return s.GormStore.RequestCancel(ctx, p)
}

func (s *fullStore) SettleCancellations(ctx context.Context) ([]*ledger.Cancellation, error) {
	if err := s.full("settle cancellations"); err != nil {
		return nil, err
	}
	return s.GormStore.SettleCancellations(ctx)
}

func (s *fullStore) TransitionCancellation(ctx context.Context, p ledger.CancellationTransition) (*ledger.Cancellation, error) {
	if err := s.full("transition cancellation"); err != nil {
		return nil, err
	}
	return s.GormStore.TransitionCancellation(ctx, p)
}

func (s *fullStore) AddUsage(ctx context.Context, p ledger.AddUsageParams) (*ledger.Budget, error) {
	if err := s.full("add usage"); err != nil {
		return nil, err
	}
	return s.GormStore.AddUsage(ctx, p)
}

func (s *fullStore) RecordRecovery(ctx context.Context, p ledger.RecordRecoveryParams) (ledger.RecordRecoveryResult, error) {
	if err := s.full("record recovery"); err != nil {
		return ledger.RecordRecoveryResult{}, err
	}
	return s.GormStore.RecordRecovery(ctx, p)
}
