-- ledger:foreign_keys=off
-- 0004: a request identity is (tenant, principal, idempotency key), so
-- runs.UNIQUE (tenant, idempotency_key) becomes UNIQUE (tenant, submitted_by,
-- idempotency_key); and a cancellation gets the terminal state too_late (the
-- run ended before the cancel took effect) with the time it was settled.
--
-- SQLite cannot change a table's constraints in place: both tables are
-- rebuilt (create the new one, copy, drop the old, rename), keeping every
-- other column, constraint and index. Other tables refer to runs, so the
-- first line asks the migration runner to run this file with foreign keys
-- off (a PRAGMA that is a no-op inside a transaction) and to check them
-- with PRAGMA foreign_key_check before it commits.

CREATE TABLE runs_new (
    id               TEXT    PRIMARY KEY,
    tenant           TEXT    NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
    idempotency_key  TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_digest   TEXT    NOT NULL CHECK (request_digest LIKE 'sha256:%'),
    submitted_by     TEXT    NOT NULL,
    agent            TEXT    NOT NULL,
    input            TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('queued','running','awaiting_approval','needs_review','stopping','completed','stopped','failed')),
    stop_reason      TEXT    CHECK (stop_reason IN ('completed','max_steps','max_runtime','token_budget_exceeded','repeated_action','no_progress','consecutive_errors','policy_denied','approval_denied','approval_expired','retry_budget_exhausted','provider_error','tool_error','invalid_model_response','user_cancelled','internal_error')),
    version          INTEGER NOT NULL DEFAULT 1,
    event_seq        INTEGER NOT NULL DEFAULT 0,
    event_hash       TEXT    NOT NULL DEFAULT '',
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (tenant, submitted_by, idempotency_key),
    -- exactly one stop reason for a terminal run, none otherwise
    CHECK ((state IN ('completed','stopped','failed')) = (stop_reason IS NOT NULL)),
    CHECK (state <> 'completed' OR stop_reason = 'completed'),
    CHECK (state <> 'failed' OR stop_reason IN ('provider_error','tool_error','invalid_model_response','internal_error')),
    CHECK (state <> 'stopped' OR stop_reason NOT IN ('completed','provider_error','tool_error','invalid_model_response','internal_error'))
);
INSERT INTO runs_new (id, tenant, idempotency_key, request_digest, submitted_by, agent, input, state, stop_reason,
    version, event_seq, event_hash, created_at, updated_at)
SELECT id, tenant, idempotency_key, request_digest, submitted_by, agent, input, state, stop_reason,
    version, event_seq, event_hash, created_at, updated_at FROM runs;
DROP TABLE runs;
ALTER TABLE runs_new RENAME TO runs;
CREATE INDEX runs_tenant_state ON runs (tenant, state, id);
CREATE INDEX runs_state ON runs (state, id);
CREATE INDEX runs_tenant_submitter ON runs (tenant, submitted_by, id);

CREATE TABLE cancellations_new (
    id            TEXT    PRIMARY KEY,
    run_id        TEXT    NOT NULL UNIQUE REFERENCES runs (id),
    tenant        TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('requested','accepted','stopping','stopped','too_late')),
    requested_by  TEXT    NOT NULL,
    reason        TEXT,
    version       INTEGER NOT NULL DEFAULT 1,
    requested_at  INTEGER NOT NULL,
    accepted_at   INTEGER,
    stopping_at   INTEGER,
    stopped_at    INTEGER,
    too_late_at   INTEGER,
    CHECK ((state = 'too_late') = (too_late_at IS NOT NULL))
);
INSERT INTO cancellations_new (id, run_id, tenant, state, requested_by, reason, version, requested_at,
    accepted_at, stopping_at, stopped_at)
SELECT id, run_id, tenant, state, requested_by, reason, version, requested_at,
    accepted_at, stopping_at, stopped_at FROM cancellations;
DROP TABLE cancellations;
ALTER TABLE cancellations_new RENAME TO cancellations;
-- The start-up recovery scan looks for cancellations not yet settled; this
-- partial index holds only those, so the scan does not read the table.
CREATE INDEX cancellations_unsettled ON cancellations (id) WHERE state IN ('requested', 'accepted', 'stopping');
