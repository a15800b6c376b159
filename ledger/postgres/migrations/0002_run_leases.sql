-- 0002_run_leases: run leases, so that several processes can serve one
-- database (SQLite's 0008).
--
-- A run is advanced and recovered only by the process holding its lease:
-- lease_owner names the holder (NULL when nobody holds it), lease_until is
-- when the lease lapses (unix microseconds on the DATABASE's clock, 0 when
-- nobody holds it) and lease_token is the fencing token, raised by one at
-- every claim and never lowered. A holder's write that moves the run's
-- chain head is guarded on the token in the same statement, so a holder
-- that lost the lease cannot write. The lease is operational state, not
-- part of the run's content, so leasing leaves the chain alone.
--
-- runs_claim lets a claim read only the free (or lapsed) runs of the
-- states it asks for, in id order.
--
-- observations gains the source stale_holder: the outcome of a tool call
-- that reached a worker after it had lost its run's lease, kept as evidence
-- for the new holder's recovery. PostgreSQL changes a CHECK in place.

ALTER TABLE runs
    ADD COLUMN lease_owner TEXT COLLATE "C" CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 255),
    ADD COLUMN lease_token BIGINT NOT NULL DEFAULT 0 CHECK (lease_token >= 0),
    ADD COLUMN lease_until BIGINT NOT NULL DEFAULT 0;
CREATE INDEX runs_claim ON runs (state, lease_until, id, agent);
CREATE INDEX runs_lease_owner ON runs (lease_owner) WHERE lease_owner IS NOT NULL;

ALTER TABLE observations DROP CONSTRAINT observations_source_check;
ALTER TABLE observations ADD CONSTRAINT observations_source_check
    CHECK (source IN ('tool_result','tool_query','tool_cancel','person','late_outcome','stale_holder'));
