-- 0001_init: the durable facts of the ledger.
-- Times are INTEGER unix microseconds in UTC. States are guarded by CHECK
-- constraints listing the same strings as the Go constants in states.go.
-- A released migration is never edited; add a new numbered file instead.

CREATE TABLE runs (
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
    UNIQUE (tenant, idempotency_key),
    -- exactly one stop reason for a terminal run, none otherwise
    CHECK ((state IN ('completed','stopped','failed')) = (stop_reason IS NOT NULL)),
    CHECK (state <> 'completed' OR stop_reason = 'completed'),
    CHECK (state <> 'failed' OR stop_reason IN ('provider_error','tool_error','invalid_model_response','internal_error')),
    CHECK (state <> 'stopped' OR stop_reason NOT IN ('completed','provider_error','tool_error','invalid_model_response','internal_error'))
);
CREATE INDEX runs_tenant_state ON runs (tenant, state, id);
CREATE INDEX runs_state ON runs (state, id);

CREATE TABLE budgets (
    run_id                  TEXT    PRIMARY KEY REFERENCES runs (id),
    max_attempts_per_action INTEGER NOT NULL DEFAULT 0 CHECK (max_attempts_per_action >= 0),
    max_attempts_per_run    INTEGER NOT NULL DEFAULT 0 CHECK (max_attempts_per_run >= 0),
    max_execution_us        INTEGER NOT NULL DEFAULT 0 CHECK (max_execution_us >= 0),
    max_steps               INTEGER NOT NULL DEFAULT 0 CHECK (max_steps >= 0),
    max_tokens              INTEGER NOT NULL DEFAULT 0 CHECK (max_tokens >= 0),
    deadline_at             INTEGER,
    attempts_used           INTEGER NOT NULL DEFAULT 0 CHECK (attempts_used >= 0),
    execution_used_us       INTEGER NOT NULL DEFAULT 0 CHECK (execution_used_us >= 0),
    steps_used              INTEGER NOT NULL DEFAULT 0 CHECK (steps_used >= 0),
    tokens_used             INTEGER NOT NULL DEFAULT 0 CHECK (tokens_used >= 0),
    tokens_unavailable      INTEGER NOT NULL DEFAULT 0 CHECK (tokens_unavailable IN (0, 1)),
    version                 INTEGER NOT NULL DEFAULT 1
);

CREATE TABLE actions (
    id               TEXT    PRIMARY KEY,
    run_id           TEXT    NOT NULL REFERENCES runs (id),
    tenant           TEXT    NOT NULL,
    seq              INTEGER NOT NULL CHECK (seq >= 1),
    idempotency_key  TEXT    NOT NULL CHECK (length(idempotency_key) >= 1),
    tool             TEXT    NOT NULL CHECK (length(tool) >= 1),
    tool_version     TEXT    NOT NULL,
    effect           TEXT    NOT NULL CHECK (effect IN ('read','write')),
    arguments        TEXT    NOT NULL,
    action_digest    TEXT    NOT NULL CHECK (action_digest LIKE 'sha256:%'),
    dedup_key        TEXT    NOT NULL UNIQUE,
    supersedes       TEXT    REFERENCES actions (id),
    state            TEXT    NOT NULL CHECK (state IN ('proposed','awaiting_approval','approved','running','succeeded','failed','uncertain','needs_review','denied','expired','cancelled','abandoned','superseded')),
    attempt_count    INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    version          INTEGER NOT NULL DEFAULT 1,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (run_id, seq),
    UNIQUE (run_id, idempotency_key)
);
CREATE INDEX actions_state ON actions (state, run_id);

CREATE TABLE observations (
    id           TEXT    PRIMARY KEY,
    run_id       TEXT    NOT NULL REFERENCES runs (id),
    action_id    TEXT    NOT NULL REFERENCES actions (id),
    attempt_id   TEXT    REFERENCES attempts (id),
    source       TEXT    NOT NULL CHECK (source IN ('tool_result','tool_query','tool_cancel','person')),
    effect       TEXT    NOT NULL CHECK (effect IN ('happened','not_happened','unknown')),
    detail       TEXT,
    observed_at  INTEGER NOT NULL
);
CREATE INDEX observations_action ON observations (action_id, observed_at);

-- An attempt is written before its tool is called; (action_id, attempt_no)
-- is unique, so a retry after a crash that re-runs the same "start" cannot
-- create a second attempt with the same number.
CREATE TABLE attempts (
    id                     TEXT    PRIMARY KEY,
    action_id              TEXT    NOT NULL REFERENCES actions (id),
    run_id                 TEXT    NOT NULL REFERENCES runs (id),
    attempt_no             INTEGER NOT NULL CHECK (attempt_no >= 1),
    status                 TEXT    NOT NULL CHECK (status IN ('started','succeeded','failed','timed_out','cancelled','uncertain')),
    effect                 TEXT    NOT NULL CHECK (effect IN ('happened','not_happened','unknown')),
    effect_observation_id  TEXT    REFERENCES observations (id),
    result                 TEXT,
    error                  TEXT,
    version                INTEGER NOT NULL DEFAULT 1,
    started_at             INTEGER NOT NULL,
    finished_at            INTEGER,
    UNIQUE (action_id, attempt_no),
    CHECK ((effect = 'unknown') = (effect_observation_id IS NULL)),
    CHECK ((status = 'started') = (finished_at IS NULL))
);
CREATE INDEX attempts_status ON attempts (status, run_id);
CREATE INDEX attempts_run ON attempts (run_id);

CREATE TABLE approvals (
    id             TEXT    PRIMARY KEY,
    action_id      TEXT    NOT NULL REFERENCES actions (id),
    run_id         TEXT    NOT NULL REFERENCES runs (id),
    tenant         TEXT    NOT NULL,
    action_digest  TEXT    NOT NULL CHECK (action_digest LIKE 'sha256:%'),
    state          TEXT    NOT NULL CHECK (state IN ('pending','granted','denied','expired','invalidated')),
    decided_by     TEXT,
    reason         TEXT,
    version        INTEGER NOT NULL DEFAULT 1,
    requested_at   INTEGER NOT NULL,
    expires_at     INTEGER,
    decided_at     INTEGER,
    CHECK ((state = 'pending') = (decided_at IS NULL))
);
-- at most one pending approval per action
CREATE UNIQUE INDEX approvals_one_pending ON approvals (action_id) WHERE state = 'pending';
CREATE INDEX approvals_tenant_state ON approvals (tenant, state, id);
CREATE INDEX approvals_expiry ON approvals (expires_at) WHERE state = 'pending';

CREATE TABLE cancellations (
    id            TEXT    PRIMARY KEY,
    run_id        TEXT    NOT NULL UNIQUE REFERENCES runs (id),
    tenant        TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('requested','accepted','stopping','stopped')),
    requested_by  TEXT    NOT NULL,
    reason        TEXT,
    version       INTEGER NOT NULL DEFAULT 1,
    requested_at  INTEGER NOT NULL,
    accepted_at   INTEGER,
    stopping_at   INTEGER,
    stopped_at    INTEGER
);

-- The event log is append-only; these triggers stop accidental edits. They
-- do not stop someone who drops them: the hash chain is what detects that.
CREATE TABLE events (
    id           TEXT    PRIMARY KEY,
    run_id       TEXT    NOT NULL REFERENCES runs (id),
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    type         TEXT    NOT NULL,
    entity_type  TEXT    NOT NULL,
    entity_id    TEXT    NOT NULL,
    from_state   TEXT    NOT NULL DEFAULT '',
    to_state     TEXT    NOT NULL DEFAULT '',
    actor        TEXT    NOT NULL DEFAULT '',
    data         TEXT,
    created_at   INTEGER NOT NULL,
    prev_hash    TEXT    NOT NULL,
    hash         TEXT    NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER observations_no_update BEFORE UPDATE ON observations
BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END;
CREATE TRIGGER observations_no_delete BEFORE DELETE ON observations
BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END;
