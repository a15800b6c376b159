package sqlite

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/internal/sqlrows"
)

// Run leases (ledger/runleases.go) live on the runs row: lease_owner
// (NULL when free), lease_token and lease_until (unix microseconds, 0 when
// free), migration 0008. SQLite runs one write transaction at a time, so a
// claim's UPDATE … WHERE id IN (SELECT … free or lapsed …) cannot race
// another process's: the file's write lock orders them. Times are the
// Store's clock.

var (
	selectLeaseSQL = declare(sqlrows.GetRunLeaseSQL)
	renewLeaseSQL  = declare(`UPDATE runs SET lease_until = max(lease_until, ?)
	WHERE id = ? AND lease_owner = ? AND lease_token = ? RETURNING lease_until`)
	releaseLeaseSQL   = declare(sqlrows.ReleaseRunLeaseSQL)
	moveHeadFencedSQL = declare(sqlrows.MoveChainHeadFencedSQL)
)

var selectOwnersSQL = declare(sqlrows.ListRunLeaseOwnersSQL)

func (r reader) ListRunLeaseOwners(ctx context.Context) ([]string, error) {
	rows, err := r.c.query(ctx, selectOwnersSQL)
	if err != nil {
		return nil, translate(err)
	}
	out, err := sqlrows.ScanAll(rows, func(rows *sql.Rows) (string, error) {
		var o string
		err := rows.Scan(&o)
		return o, err
	})
	return out, translate(err)
}

func (r reader) GetRunLease(ctx context.Context, run ledger.RunID) (*ledger.RunLease, error) {
	var row sqlrows.RunLease
	err := r.one(ctx, "run "+string(run), selectLeaseSQL, func(rows *sql.Rows) error {
		return rows.Scan(row.Targets()...)
	}, string(run))
	if err != nil {
		return nil, translate(err)
	}
	l := row.ToRunLease()
	return &l, nil
}

// placeholders is "?, ?, …" for n values.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func (t *tx) ClaimRuns(_ context.Context, p ledger.ClaimRunsParams, now time.Time) ([]ledger.RunLease, error) {
	until := sqlrows.Micros(now.Add(p.TTL))
	args := []any{p.Owner, until}
	var b strings.Builder
	// The index runs_claim (state, lease_until, id, agent) answers the
	// subquery alone: the free or lapsed runs of each state, the top
	// Limit by id kept as they are read.
	b.WriteString(`UPDATE runs SET lease_owner = ?, lease_token = lease_token + 1, lease_until = ?
	WHERE id IN (SELECT id FROM runs WHERE state IN (` + placeholders(len(p.States)) + `) AND `)
	for _, st := range p.States {
		args = append(args, string(st))
	}
	if len(p.TakeOver) > 0 {
		b.WriteString(`(lease_until <= ? OR lease_owner IN (` + placeholders(len(p.TakeOver)) + `))`)
		args = append(args, sqlrows.Micros(now))
		for _, o := range p.TakeOver {
			args = append(args, o)
		}
	} else {
		b.WriteString(`lease_until <= ?`)
		args = append(args, sqlrows.Micros(now))
	}
	if len(p.NotAgents) > 0 {
		b.WriteString(` AND agent NOT IN (` + placeholders(len(p.NotAgents)) + `)`)
		for _, a := range p.NotAgents {
			args = append(args, a)
		}
	}
	if len(p.Runs) > 0 {
		b.WriteString(` AND id IN (` + placeholders(len(p.Runs)) + `)`)
		for _, id := range p.Runs {
			args = append(args, string(id))
		}
	}
	b.WriteString(` ORDER BY id LIMIT ?) RETURNING id, lease_owner, lease_token, lease_until`)
	args = append(args, p.Limit)
	rows, err := t.queryRows(&stmt{sql: b.String(), index: -1}, args...)
	if err != nil {
		return nil, translate(err)
	}
	out, err := sqlrows.ScanAll(rows, sqlrows.ScanRunLease)
	if err != nil {
		return nil, translate(err)
	}
	slices.SortFunc(out, func(a, b ledger.RunLease) int { return strings.Compare(string(a.Run), string(b.Run)) })
	return out, nil
}

func (t *tx) RenewRunLeases(_ context.Context, leases []ledger.RunLease, now time.Time, ttl time.Duration) ([]ledger.RunLease, error) {
	until := sqlrows.Micros(now.Add(ttl))
	var out []ledger.RunLease
	for _, l := range leases {
		var got int64
		ok, err := t.moved(renewLeaseSQL, func(rows *sql.Rows) error { return rows.Scan(&got) },
			until, string(l.Run), l.Owner, l.Token)
		if err != nil {
			return nil, err
		}
		if ok {
			l.Until = sqlrows.FromMicros(got)
			out = append(out, l)
		}
	}
	return out, nil
}

func (t *tx) ReleaseRunLease(_ context.Context, l ledger.RunLease) (bool, error) {
	return t.execOne(releaseLeaseSQL, string(l.Run), l.Owner, l.Token)
}

func (t *tx) MoveChainHeadFenced(_ context.Context, run ledger.RunID, fromSeq, seq int64, hash string, token int64) (bool, error) {
	return t.execOne(moveHeadFencedSQL, seq, hash, string(run), fromSeq, token)
}
