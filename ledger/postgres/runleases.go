package postgres

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// Run leases (ledger/runleases.go) live on the runs row: lease_owner (NULL
// when free), lease_token and lease_until (unix microseconds, 0 when free),
// migration 0002.
//
// Every lease time is the database's clock (clock_timestamp()), never the
// process's: the now the ledger passes is ignored, so that processes on
// hosts whose clocks disagree still agree on when a lease lapses. A claim
// locks the runs it takes with FOR NO KEY UPDATE SKIP LOCKED, so two
// processes claiming at once never wait on each other, and never both get
// a run: a row one claim holds is skipped by the other, and one it has
// just claimed no longer matches "free or lapsed" when the other reads it
// (READ COMMITTED re-checks a locked row's newest version). A run a write
// is busy with (it holds the run's lock, locks.go) is skipped as well, and
// claimed by the next claim after that write.

// dbNowUs is the database's clock in unix microseconds.
const dbNowUs = `(floor(extract(epoch FROM clock_timestamp()) * 1000000)::BIGINT)`

// GetRunLease implements ledger.Reader.
func (r *reader) GetRunLease(ctx context.Context, run ledger.RunID) (*ledger.RunLease, error) {
	var row sqlrows.RunLease
	if err := r.get(ctx, "run "+string(run), sqlrows.GetRunLeaseSQL, []any{string(run)}, row.Targets()...); err != nil {
		return nil, wrapErr("get run lease", err)
	}
	l := row.ToRunLease()
	return &l, nil
}

// ClaimRuns implements ledger.Tx, in one statement on the database's
// clock; now is ignored.
func (t *tx) ClaimRuns(ctx context.Context, p ledger.ClaimRunsParams, _ time.Time) ([]ledger.RunLease, error) {
	var w sqlrows.Where
	states := make([]string, len(p.States))
	for i, st := range p.States {
		states[i] = string(st)
	}
	w.Add("state IN ?", states)
	if len(p.TakeOver) > 0 {
		// A named holder's leases are claimed before they lapse: it is
		// gone (ClaimRunsParams.TakeOver).
		w.Add("(lease_until <= (SELECT us FROM now) OR lease_owner IN ?)", p.TakeOver)
	} else {
		w.Add("lease_until <= (SELECT us FROM now)")
	}
	if len(p.NotAgents) > 0 {
		w.Add("agent NOT IN ?", p.NotAgents)
	}
	if len(p.Runs) > 0 {
		ids := make([]string, len(p.Runs))
		for i, id := range p.Runs {
			ids[i] = string(id)
		}
		w.Add("id IN ?", ids)
	}
	// The index runs_claim (state, lease_until, id, agent) finds the free
	// or lapsed runs of each state.
	pick := w.Query(`SELECT id FROM runs`, "id", p.Limit)
	q := `WITH now AS (SELECT ` + dbNowUs + ` AS us),
	picked AS (` + pick + ` FOR NO KEY UPDATE SKIP LOCKED)
	UPDATE runs r SET lease_owner = ?, lease_token = r.lease_token + 1, lease_until = (SELECT us FROM now) + ?
	FROM picked WHERE r.id = picked.id
	RETURNING r.id, r.lease_owner, r.lease_token, r.lease_until`
	args := append(w.Args, p.Owner, p.TTL.Microseconds())
	out, err := all(ctx, &t.reader, q, args, sqlrows.ScanRunLease)
	if err != nil {
		return nil, wrapErr("claim runs", err)
	}
	// RETURNING keeps no order.
	slices.SortFunc(out, func(a, b ledger.RunLease) int { return strings.Compare(string(a.Run), string(b.Run)) })
	return out, nil
}

const renewRunLeaseSQL = `UPDATE runs SET lease_until = GREATEST(lease_until, ` + dbNowUs + ` + ?)
	WHERE id = ? AND lease_owner = ? AND lease_token = ? RETURNING lease_until`

// RenewRunLeases implements ledger.Tx on the database's clock; now is
// ignored.
func (t *tx) RenewRunLeases(ctx context.Context, leases []ledger.RunLease, _ time.Time, ttl time.Duration) ([]ledger.RunLease, error) {
	var out []ledger.RunLease
	for _, l := range leases {
		var until int64
		ok, err := t.one(ctx, renewRunLeaseSQL, []any{ttl.Microseconds(), string(l.Run), l.Owner, l.Token}, &until)
		if err != nil {
			return nil, wrapErr("renew run lease", err)
		}
		if ok {
			l.Until = sqlrows.FromMicros(until)
			out = append(out, l)
		}
	}
	return out, nil
}

// ReleaseRunLease implements ledger.Tx.
func (t *tx) ReleaseRunLease(ctx context.Context, l ledger.RunLease) (bool, error) {
	n, err := t.exec(ctx, sqlrows.ReleaseRunLeaseSQL, string(l.Run), l.Owner, l.Token)
	return n > 0, wrapErr("release run lease", err)
}

// MoveChainHeadFenced implements ledger.Tx: one UPDATE guarded on the head
// and on the lease token. The write holds the run's lock from its first
// read of the run, so no claim can raise the token in between.
func (t *tx) MoveChainHeadFenced(ctx context.Context, run ledger.RunID, fromSeq, seq int64, hash string, token int64) (bool, error) {
	if err := t.lockRun(ctx, run); err != nil {
		return false, err
	}
	n, err := t.exec(ctx, sqlrows.MoveChainHeadFencedSQL, seq, hash, string(run), fromSeq, token)
	if n > 0 {
		t.st.movedHead(run, seq, hash)
	}
	return n > 0, wrapErr("move chain head", err)
}

// ListRunLeaseOwners implements ledger.Reader.
func (r *reader) ListRunLeaseOwners(ctx context.Context) ([]string, error) {
	out, err := all(ctx, r, sqlrows.ListRunLeaseOwnersSQL, nil, scanRunLeaseOwner)
	return out, wrapErr("list run lease owners", err)
}

// scanRunLeaseOwner scans a lease owner.
func scanRunLeaseOwner(rows *sql.Rows) (string, error) {
	var o string
	err := rows.Scan(&o)
	return o, err
}
