-- ledger:foreign_keys=off
-- 0006: the agent protocol (docs/agent-protocol.md).
--
-- attempt_leases: an attempt a client executes holds a lease, renewed by
-- heartbeats up to a maximum, and a secret token stored only as its SHA-256.
-- A begin is idempotent per (action, begin key). Once the attempt is
-- completed the digest of the outcome is kept, so that a replay of the same
-- outcome answers the same and another outcome is a conflict. The lease is
-- operational state, not evidence: the attempt row and its events are.
--
-- agent_decisions: the last recovery decision the agent was told for each
-- action (query, resend, cancel, ...), so that asking /next twice records it
-- once, and an observation answers it at most once.
--
-- observations gains the source late_outcome: an outcome reported after the
-- attempt's lease lapsed or recovery moved on, kept as evidence. SQLite
-- cannot change a CHECK in place, so the table is rebuilt (attempts refer to
-- it, hence foreign keys off), with its index and its append-only triggers.

CREATE TABLE attempt_leases (
    attempt_id      TEXT    PRIMARY KEY REFERENCES attempts (id),
    action_id       TEXT    NOT NULL REFERENCES actions (id),
    run_id          TEXT    NOT NULL REFERENCES runs (id),
    begin_key       TEXT    NOT NULL CHECK (length(begin_key) BETWEEN 1 AND 255),
    token_sha256    TEXT    NOT NULL CHECK (length(token_sha256) = 64),
    lease_us        INTEGER NOT NULL CHECK (lease_us > 0),
    lease_until     INTEGER NOT NULL,
    max_until       INTEGER NOT NULL,
    heartbeats      INTEGER NOT NULL DEFAULT 0 CHECK (heartbeats >= 0),
    progress        TEXT,
    outcome_digest  TEXT    CHECK (outcome_digest IS NULL OR outcome_digest LIKE 'sha256:%'),
    outcome         TEXT,
    UNIQUE (action_id, begin_key)
);
CREATE INDEX attempt_leases_open ON attempt_leases (lease_until) WHERE outcome_digest IS NULL;

CREATE TABLE agent_decisions (
    action_id    TEXT    PRIMARY KEY REFERENCES actions (id),
    decision_id  TEXT    NOT NULL CHECK (length(decision_id) >= 1),
    kind         TEXT    NOT NULL,
    answered     INTEGER NOT NULL DEFAULT 0 CHECK (answered IN (0, 1)),
    decided_at   INTEGER NOT NULL
);

CREATE TABLE observations_new (
    id           TEXT    PRIMARY KEY,
    run_id       TEXT    NOT NULL REFERENCES runs (id),
    action_id    TEXT    NOT NULL REFERENCES actions (id),
    attempt_id   TEXT    REFERENCES attempts (id),
    source       TEXT    NOT NULL CHECK (source IN ('tool_result','tool_query','tool_cancel','person','late_outcome')),
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
