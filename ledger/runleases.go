package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Run leases: which process may advance and recover a run
// (docs/operations.md, "Several processes on one database").
//
// A run is advanced and recovered only by the process holding its lease.
// A lease names its owner, carries a fencing token that only grows (each
// claim raises it by one) and lapses at Until unless renewed. The engine
// marks the context of its work on a run with the lease it holds
// (WithRunLease); every write made with that context that moves the run's
// chain head (every write of a run does) is guarded on the token in the
// same statement as the move, so a holder that lost the lease, even one
// paused past its expiry that wakes up, writes nothing: its write fails
// with ErrLeaseLost. A write whose context carries no lease is not fenced:
// people's decisions and a client's requests are serialised by the guarded
// moves, row versions and attempt tokens, whoever holds the lease.
//
// Leases are compared against the Store's clock (Options.Now) on SQLite,
// where every process sharing the file runs on one host; a driver for a
// database several hosts share (PostgreSQL) compares them against the
// database's clock instead, so that the hosts' clocks need not agree.
// A lease is operational state: it is not part of the run's content, and
// claiming, renewing or releasing one appends no event.

// RunLease is a process's lease of a run: who holds it, its fencing token
// and when it lapses unless renewed.
type RunLease struct {
	Run   RunID
	Owner string
	// Token is the fencing token: raised by every claim of the run, never
	// lowered, so a newer holder's is always greater.
	Token int64
	// Until is when the lease lapses; another process may claim the run
	// from then on.
	Until time.Time
}

// Lapsed reports whether the lease has lapsed at now.
func (l RunLease) Lapsed(now time.Time) bool { return !now.Before(l.Until) }

// ErrLeaseLost matches, with errors.Is, a write refused because the run
// lease its context carries (WithRunLease) is no longer the run's: another
// process claimed the run since. Such an error has CodeConflict, and the
// write changed nothing.
var ErrLeaseLost = errors.New("run lease lost")

// MaxLeaseOwnerLength is the longest lease owner, in bytes.
const MaxLeaseOwnerLength = 255

// ClaimRunsParams claims runs.
type ClaimRunsParams struct {
	// Owner names the claiming process (host, pid, a random part).
	Owner string
	// TTL is how long the claimed leases hold unless renewed.
	TTL time.Duration
	// Limit is the most runs claimed at once; at least 1.
	Limit int
	// States are the states of the runs to claim: at least one, none
	// terminal.
	States []RunState
	// NotAgents leaves out runs of these agents.
	NotAgents []string
	// Runs, if set, claims only among these runs (the recovery scan claims
	// the runs it is about to recover).
	Runs []RunID
	// TakeOver names owners whose leases may be claimed before they lapse:
	// holders the caller knows to be dead (a process of its own host that
	// no longer exists, engine.Config.Owner). Their tokens are raised as
	// at any claim, so should one still be alive it could not write.
	TakeOver []string
}

// RunLeaseStore is the part of Store that leases runs to processes.
type RunLeaseStore interface {
	// ClaimRuns claims, oldest first (in id order), up to p.Limit runs in
	// p.States whose lease is free or lapsed, each with its token raised by
	// one, and returns their leases. A run whose lease another holds and
	// has not lapsed is never claimed; two processes claiming at once never
	// both get a run.
	ClaimRuns(ctx context.Context, p ClaimRunsParams) ([]RunLease, error)
	// RenewRunLeases extends each of owner's leases that is still its own
	// (same owner and token, whether lapsed or not) to at least ttl from
	// now, never shortening one, and returns those with their new Until;
	// a lease left out was claimed by another process, or released.
	RenewRunLeases(ctx context.Context, owner string, leases []RunLease, ttl time.Duration) ([]RunLease, error)
	// ReleaseRunLease frees a lease if it is still its holder's, so that
	// any process may claim the run at once; the token stays. Releasing a
	// lease no longer held does nothing.
	ReleaseRunLease(ctx context.Context, l RunLease) error
	// FindRunLease returns a run's lease: Owner is empty and Until zero
	// when nobody holds it, Token the last claim's. CodeNotFound if the
	// run is unknown.
	FindRunLease(ctx context.Context, run RunID) (RunLease, error)
	// FindRunLeaseOwners lists, sorted, the owners that hold the lease of
	// at least one run, lapsed or not.
	FindRunLeaseOwners(ctx context.Context) ([]string, error)
}

// runLeaseKey is the context key of WithRunLease.
type runLeaseKey struct{}

// WithRunLease returns ctx marked with the lease its holder works under:
// a write made with the returned context that moves l.Run's chain head is
// refused with ErrLeaseLost unless l.Token is still the run's token.
func WithRunLease(ctx context.Context, l RunLease) context.Context {
	return context.WithValue(ctx, runLeaseKey{}, l)
}

// WithoutRunLease returns ctx without the lease it was marked with: its
// writes are not fenced. A holder that lost its lease records what it
// still has to say (a late tool outcome, as evidence for the new holder)
// with it.
func WithoutRunLease(ctx context.Context) context.Context {
	return context.WithValue(ctx, runLeaseKey{}, nil)
}

// RunLeaseFrom returns the lease ctx was marked with, if any.
func RunLeaseFrom(ctx context.Context) (RunLease, bool) {
	l, ok := ctx.Value(runLeaseKey{}).(RunLease)
	return l, ok
}

// checkOwner refuses an owner the schema does not keep.
func checkOwner(owner string) error { return checkText("lease owner", owner, MaxLeaseOwnerLength) }

// ClaimRuns implements Store.
func (s *DB) ClaimRuns(ctx context.Context, p ClaimRunsParams) ([]RunLease, error) {
	if err := checkOwner(p.Owner); err != nil {
		return nil, wrapErr("claim runs", err)
	}
	switch {
	case p.TTL <= 0:
		return nil, Errorf(CodeInvalid, "claim runs: the lease's TTL must be positive")
	case p.Limit < 1:
		return nil, Errorf(CodeInvalid, "claim runs: the limit must be at least 1")
	case len(p.States) == 0:
		return nil, Errorf(CodeInvalid, "claim runs: name at least one state")
	}
	for _, st := range p.States {
		if !st.Valid() || st.Terminal() {
			return nil, Errorf(CodeInvalid, "claim runs: %q is not a live run state", st)
		}
	}
	for _, o := range p.TakeOver {
		if err := checkOwner(o); err != nil {
			return nil, wrapErr("claim runs: take over", err)
		}
	}
	var out []RunLease
	err := s.inTx(ctx, "claim_runs", func(tx *txn) error {
		var err error
		out, err = tx.d.ClaimRuns(tx.ctx, p, tx.now)
		tx.wrote = len(out) > 0
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RenewRunLeases implements Store.
func (s *DB) RenewRunLeases(ctx context.Context, owner string, leases []RunLease, ttl time.Duration) ([]RunLease, error) {
	if err := checkOwner(owner); err != nil {
		return nil, wrapErr("renew run leases", err)
	}
	if ttl <= 0 {
		return nil, Errorf(CodeInvalid, "renew run leases: the TTL must be positive")
	}
	for _, l := range leases {
		if l.Owner != owner {
			return nil, Errorf(CodeInvalid, "renew run leases: the lease of run %s is %q's, not %q's", l.Run, l.Owner, owner)
		}
	}
	if len(leases) == 0 {
		return nil, nil
	}
	var out []RunLease
	err := s.inTx(ctx, "renew_run_leases", func(tx *txn) error {
		var err error
		out, err = tx.d.RenewRunLeases(tx.ctx, leases, tx.now, ttl)
		tx.wrote = len(out) > 0
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReleaseRunLease implements Store.
func (s *DB) ReleaseRunLease(ctx context.Context, l RunLease) error {
	if err := checkOwner(l.Owner); err != nil {
		return wrapErr("release run lease", err)
	}
	return s.inTx(ctx, "release_run_lease", func(tx *txn) error {
		released, err := tx.d.ReleaseRunLease(tx.ctx, l)
		tx.wrote = released
		return err
	})
}

// FindRunLease implements Store.
func (s *DB) FindRunLease(ctx context.Context, run RunID) (RunLease, error) {
	l, err := read(ctx, s, "find_run_lease", func(r Reader) (*RunLease, error) { return r.GetRunLease(ctx, run) })
	if err != nil {
		return RunLease{}, err
	}
	return *l, nil
}

// FindRunLeaseOwners implements Store.
func (s *DB) FindRunLeaseOwners(ctx context.Context) ([]string, error) {
	return read(ctx, s, "find_run_lease_owners", func(r Reader) ([]string, error) { return r.ListRunLeaseOwners(ctx) })
}

// leaseLost is the error of a write refused by its fence: the run's token
// is no longer the one the write's lease carries.
func leaseLost(l RunLease, now RunLease) error {
	holder := "nobody holds it now"
	if now.Owner != "" {
		holder = fmt.Sprintf("%s holds it now with token %d", now.Owner, now.Token)
	}
	return &Error{Code: CodeConflict, Err: ErrLeaseLost,
		Message: fmt.Sprintf("run %s: lease lost: the write was fenced by token %d of %s; %s", l.Run, l.Token, l.Owner, holder)}
}
