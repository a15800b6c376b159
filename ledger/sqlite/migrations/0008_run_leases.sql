-- ledger:foreign_keys=off
-- 0008: run leases, so that several processes can serve one database.
--
-- A run is advanced and recovered only by the process holding its lease:
-- lease_owner names the holder (NULL when nobody holds it), lease_until is
-- when the lease lapses (unix microseconds, 0 when nobody holds it) and
-- lease_token is the fencing token, raised by one at every claim and never
-- lowered. A holder's write that moves the run's chain head is guarded on
-- the token in the same statement, so a holder that lost the lease cannot
-- write. The lease is operational state: it is not part of the run's
-- content, which its events bind, so leasing leaves the chain alone.
--
-- runs_claim lets a claim read only the free (or lapsed) runs of the
-- states it asks for, from the index alone; runs_lease_owner, which holds
-- only the runs someone holds, lists the holders (to find dead ones).
--
-- observations gains the source stale_holder: the outcome of a tool call
-- that reached a worker after it had lost its run's lease, kept as evidence
-- for the new holder's recovery instead of finishing the attempt. SQLite
-- cannot change a CHECK in place, so the table is rebuilt as in 0006.

ALTER TABLE runs ADD COLUMN lease_owner TEXT CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 255);
ALTER TABLE runs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0 CHECK (lease_token >= 0);
ALTER TABLE runs ADD COLUMN lease_until INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_claim ON runs (state, lease_until, id, agent);
CREATE INDEX runs_lease_owner ON runs (lease_owner) WHERE lease_owner IS NOT NULL;

CREATE TABLE observations_new (
    id           TEXT    PRIMARY KEY,
    run_id       TEXT    NOT NULL REFERENCES runs (id),
    action_id    TEXT    NOT NULL REFERENCES actions (id),
    attempt_id   TEXT    REFERENCES attempts (id),
    source       TEXT    NOT NULL CHECK (source IN ('tool_result','tool_query','tool_cancel','person','late_outcome','stale_holder')),
    effect       TEXT    NOT NULL CHECK (effect IN ('happened','not_happened','unknown')),
    detail       TEXT,
    observed_at  INTEGER NOT NULL
);
INSERT INTO observations_new (id, run_id, action_id, attempt_id, source, effect, detail, observed_at)
    SELECT id, run_id, action_id, attempt_id, source, effect, detail, observed_at FROM observations;
DROP TABLE observations;
ALTER TABLE observations_new RENAME TO observations;
CREATE INDEX observations_action ON observations (action_id, observed_at);
CREATE TRIGGER observations_no_update BEFORE UPDATE ON observations
BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END;
CREATE TRIGGER observations_no_delete BEFORE DELETE ON observations
BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END;
