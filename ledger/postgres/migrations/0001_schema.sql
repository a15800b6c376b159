-- 0001_schema: the ledger's tables on PostgreSQL, as the SQLite migrations
-- 0001–0007 leave them: the same tables, columns, constraints and indexes.
--
-- Times are BIGINT unix microseconds in UTC. JSON and canonical bytes are
-- TEXT, never jsonb: the hash chain covers their exact bytes, which jsonb
-- would re-encode. Every TEXT column is COLLATE "C", so ids, keys and states
-- compare and sort byte by byte as they do on SQLite, whatever the
-- database's default collation (the id cursors and "in id order" rely on
-- it). States are guarded by CHECK constraints listing the same strings as
-- the Go constants in ledger/states.go.
-- A released migration is never edited; add a new numbered file instead.

CREATE TABLE runs (
    id               TEXT COLLATE "C" PRIMARY KEY,
    tenant           TEXT COLLATE "C" NOT NULL CHECK (length(tenant) BETWEEN 1 AND 128),
    idempotency_key  TEXT COLLATE "C" NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_digest   TEXT COLLATE "C" NOT NULL CHECK (request_digest LIKE 'sha256:%'),
    submitted_by     TEXT COLLATE "C" NOT NULL,
    agent            TEXT COLLATE "C" NOT NULL,
    input            TEXT COLLATE "C" NOT NULL,
    state            TEXT COLLATE "C" NOT NULL CHECK (state IN ('queued','running','awaiting_approval','needs_review','stopping','completed','stopped','failed')),
    stop_reason      TEXT COLLATE "C" CHECK (stop_reason IN ('completed','max_steps','max_runtime','token_budget_exceeded','repeated_action','no_progress','consecutive_errors','policy_denied','approval_denied','approval_expired','retry_budget_exhausted','provider_error','tool_error','invalid_model_response','user_cancelled','internal_error')),
    version          BIGINT NOT NULL DEFAULT 1,
    event_seq        BIGINT NOT NULL DEFAULT 0,
    event_hash       TEXT COLLATE "C" NOT NULL DEFAULT '',
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    -- a request identity is (tenant, principal, idempotency key)
    UNIQUE (tenant, submitted_by, idempotency_key),
    -- exactly one stop reason for a terminal run, none otherwise
    CHECK ((state IN ('completed','stopped','failed')) = (stop_reason IS NOT NULL)),
    CHECK (state <> 'completed' OR stop_reason = 'completed'),
    CHECK (state <> 'failed' OR stop_reason IN ('provider_error','tool_error','invalid_model_response','internal_error')),
    CHECK (state <> 'stopped' OR stop_reason NOT IN ('completed','provider_error','tool_error','invalid_model_response','internal_error'))
);
CREATE INDEX runs_tenant_state ON runs (tenant, state, id);
CREATE INDEX runs_state ON runs (state, id);
CREATE INDEX runs_tenant_submitter ON runs (tenant, submitted_by, id);

CREATE TABLE budgets (
    run_id                  TEXT COLLATE "C" PRIMARY KEY REFERENCES runs (id),
    max_attempts_per_action BIGINT  NOT NULL DEFAULT 0 CHECK (max_attempts_per_action >= 0),
    max_attempts_per_run    BIGINT  NOT NULL DEFAULT 0 CHECK (max_attempts_per_run >= 0),
    max_execution_us        BIGINT  NOT NULL DEFAULT 0 CHECK (max_execution_us >= 0),
    max_steps               BIGINT  NOT NULL DEFAULT 0 CHECK (max_steps >= 0),
    max_tokens              BIGINT  NOT NULL DEFAULT 0 CHECK (max_tokens >= 0),
    deadline_at             BIGINT,
    attempts_used           BIGINT  NOT NULL DEFAULT 0 CHECK (attempts_used >= 0),
    execution_used_us       BIGINT  NOT NULL DEFAULT 0 CHECK (execution_used_us >= 0),
    steps_used              BIGINT  NOT NULL DEFAULT 0 CHECK (steps_used >= 0),
    tokens_used             BIGINT  NOT NULL DEFAULT 0 CHECK (tokens_used >= 0),
    tokens_unavailable      BOOLEAN NOT NULL DEFAULT FALSE,
    version                 BIGINT  NOT NULL DEFAULT 1
);

CREATE TABLE actions (
    id               TEXT COLLATE "C" PRIMARY KEY,
    run_id           TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    tenant           TEXT COLLATE "C" NOT NULL,
    seq              BIGINT NOT NULL CHECK (seq >= 1),
    idempotency_key  TEXT COLLATE "C" NOT NULL CHECK (length(idempotency_key) >= 1),
    tool             TEXT COLLATE "C" NOT NULL CHECK (length(tool) >= 1),
    tool_version     TEXT COLLATE "C" NOT NULL,
    effect           TEXT COLLATE "C" NOT NULL CHECK (effect IN ('read','write')),
    arguments        TEXT COLLATE "C" NOT NULL,
    action_digest    TEXT COLLATE "C" NOT NULL CHECK (action_digest LIKE 'sha256:%'),
    dedup_key        TEXT COLLATE "C" NOT NULL UNIQUE,
    supersedes       TEXT COLLATE "C" REFERENCES actions (id),
    state            TEXT COLLATE "C" NOT NULL CHECK (state IN ('proposed','awaiting_approval','approved','running','succeeded','failed','uncertain','needs_review','denied','expired','cancelled','abandoned','superseded')),
    attempt_count    BIGINT NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    version          BIGINT NOT NULL DEFAULT 1,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    -- The gate's decision and why (SQLite's 0007): all four NULL for an
    -- action recorded without an audit, all four set otherwise.
    gate_decision    TEXT COLLATE "C" CHECK (gate_decision IN ('approved','awaiting_approval','denied')),
    gate_rule        BIGINT CHECK (gate_rule >= -1 AND (gate_rule IS NULL) = (gate_decision IS NULL)),
    gate_reason      TEXT COLLATE "C" CHECK ((gate_reason IS NULL) = (gate_decision IS NULL)),
    rules_digest     TEXT COLLATE "C" CHECK (rules_digest LIKE 'sha256:%' AND (rules_digest IS NULL) = (gate_decision IS NULL)),
    UNIQUE (run_id, seq),
    UNIQUE (run_id, idempotency_key)
);
CREATE INDEX actions_state ON actions (state, run_id);

-- An attempt is written before its tool is called; (action_id, attempt_no)
-- is unique, so a retry after a crash that re-runs the same "start" cannot
-- create a second attempt with the same number. attempts and observations
-- refer to each other: the reference from attempts to observations is
-- added once both exist.
CREATE TABLE attempts (
    id                     TEXT COLLATE "C" PRIMARY KEY,
    action_id              TEXT COLLATE "C" NOT NULL REFERENCES actions (id),
    run_id                 TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    attempt_no             BIGINT NOT NULL CHECK (attempt_no >= 1),
    status                 TEXT COLLATE "C" NOT NULL CHECK (status IN ('started','succeeded','failed','timed_out','cancelled','uncertain')),
    effect                 TEXT COLLATE "C" NOT NULL CHECK (effect IN ('happened','not_happened','unknown')),
    effect_observation_id  TEXT COLLATE "C",
    result                 TEXT COLLATE "C",
    error                  TEXT COLLATE "C",
    version                BIGINT NOT NULL DEFAULT 1,
    started_at             BIGINT NOT NULL,
    finished_at            BIGINT,
    UNIQUE (action_id, attempt_no),
    CHECK ((effect = 'unknown') = (effect_observation_id IS NULL)),
    CHECK ((status = 'started') = (finished_at IS NULL))
);
CREATE INDEX attempts_status ON attempts (status, run_id);
CREATE INDEX attempts_run ON attempts (run_id);

CREATE TABLE observations (
    id           TEXT COLLATE "C" PRIMARY KEY,
    run_id       TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    action_id    TEXT COLLATE "C" NOT NULL REFERENCES actions (id),
    attempt_id   TEXT COLLATE "C" REFERENCES attempts (id),
    source       TEXT COLLATE "C" NOT NULL CHECK (source IN ('tool_result','tool_query','tool_cancel','person','late_outcome')),
    effect       TEXT COLLATE "C" NOT NULL CHECK (effect IN ('happened','not_happened','unknown')),
    detail       TEXT COLLATE "C",
    observed_at  BIGINT NOT NULL
);
CREATE INDEX observations_action ON observations (action_id, observed_at);

ALTER TABLE attempts ADD FOREIGN KEY (effect_observation_id) REFERENCES observations (id);

CREATE TABLE approvals (
    id             TEXT COLLATE "C" PRIMARY KEY,
    action_id      TEXT COLLATE "C" NOT NULL REFERENCES actions (id),
    run_id         TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    tenant         TEXT COLLATE "C" NOT NULL,
    action_digest  TEXT COLLATE "C" NOT NULL CHECK (action_digest LIKE 'sha256:%'),
    state          TEXT COLLATE "C" NOT NULL CHECK (state IN ('pending','granted','denied','expired','invalidated')),
    decided_by     TEXT COLLATE "C",
    reason         TEXT COLLATE "C",
    version        BIGINT NOT NULL DEFAULT 1,
    requested_at   BIGINT NOT NULL,
    expires_at     BIGINT,
    decided_at     BIGINT,
    CHECK ((state = 'pending') = (decided_at IS NULL))
);
-- at most one pending approval per action
CREATE UNIQUE INDEX approvals_one_pending ON approvals (action_id) WHERE state = 'pending';
CREATE INDEX approvals_tenant_state ON approvals (tenant, state, id);
CREATE INDEX approvals_expiry ON approvals (expires_at) WHERE state = 'pending';
CREATE INDEX approvals_run ON approvals (run_id, id);

CREATE TABLE cancellations (
    id            TEXT COLLATE "C" PRIMARY KEY,
    run_id        TEXT COLLATE "C" NOT NULL UNIQUE REFERENCES runs (id),
    tenant        TEXT COLLATE "C" NOT NULL,
    state         TEXT COLLATE "C" NOT NULL CHECK (state IN ('requested','accepted','stopping','stopped','too_late')),
    requested_by  TEXT COLLATE "C" NOT NULL,
    reason        TEXT COLLATE "C",
    version       BIGINT NOT NULL DEFAULT 1,
    requested_at  BIGINT NOT NULL,
    accepted_at   BIGINT,
    stopping_at   BIGINT,
    stopped_at    BIGINT,
    too_late_at   BIGINT,
    CHECK ((state = 'too_late') = (too_late_at IS NOT NULL))
);
-- The start-up recovery scan looks for cancellations not yet settled; this
-- partial index holds only those, so the scan does not read the table.
CREATE INDEX cancellations_unsettled ON cancellations (id) WHERE state IN ('requested', 'accepted', 'stopping');

-- The event log is append-only. format is how an event's hash is computed
-- (1: data hashed inline, no rows bound; 2: the data's digest and
-- row_digests hashed instead); row_digests is the canonical JSON object
-- {"<entity>/<id>": "sha256:…"} of the rows the event's write left changed,
-- NULL if it binds none.
CREATE TABLE events (
    id           TEXT COLLATE "C" PRIMARY KEY,
    run_id       TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    seq          BIGINT NOT NULL CHECK (seq >= 1),
    type         TEXT COLLATE "C" NOT NULL,
    entity_type  TEXT COLLATE "C" NOT NULL,
    entity_id    TEXT COLLATE "C" NOT NULL,
    from_state   TEXT COLLATE "C" NOT NULL DEFAULT '',
    to_state     TEXT COLLATE "C" NOT NULL DEFAULT '',
    actor        TEXT COLLATE "C" NOT NULL DEFAULT '',
    data         TEXT COLLATE "C",
    created_at   BIGINT NOT NULL,
    prev_hash    TEXT COLLATE "C" NOT NULL,
    hash         TEXT COLLATE "C" NOT NULL,
    format       INTEGER NOT NULL DEFAULT 1 CHECK (format IN (1, 2)),
    row_digests  TEXT COLLATE "C",
    UNIQUE (run_id, seq)
);

-- The newest signature of each run's chain head, by the signing key a
-- process was given (the key itself is never stored).
CREATE TABLE chain_signatures (
    run_id     TEXT COLLATE "C" PRIMARY KEY REFERENCES runs (id),
    seq        BIGINT NOT NULL CHECK (seq >= 1),
    hash       TEXT COLLATE "C" NOT NULL CHECK (hash LIKE 'sha256:%'),
    signed_at  BIGINT NOT NULL,
    key_id     TEXT COLLATE "C" NOT NULL,
    signature  TEXT COLLATE "C" NOT NULL
);

-- The agent protocol: an attempt a client executes holds a lease, renewed
-- by heartbeats up to a maximum, and a secret token stored only as its
-- SHA-256; a begin is idempotent per (action, begin key).
CREATE TABLE attempt_leases (
    attempt_id      TEXT COLLATE "C" PRIMARY KEY REFERENCES attempts (id),
    action_id       TEXT COLLATE "C" NOT NULL REFERENCES actions (id),
    run_id          TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
    begin_key       TEXT COLLATE "C" NOT NULL CHECK (length(begin_key) BETWEEN 1 AND 255),
    token_sha256    TEXT COLLATE "C" NOT NULL CHECK (length(token_sha256) = 64),
    lease_us        BIGINT NOT NULL CHECK (lease_us > 0),
    lease_until     BIGINT NOT NULL,
    max_until       BIGINT NOT NULL,
    heartbeats      BIGINT NOT NULL DEFAULT 0 CHECK (heartbeats >= 0),
    progress        TEXT COLLATE "C",
    outcome_digest  TEXT COLLATE "C" CHECK (outcome_digest IS NULL OR outcome_digest LIKE 'sha256:%'),
    outcome         TEXT COLLATE "C",
    UNIQUE (action_id, begin_key)
);
CREATE INDEX attempt_leases_open ON attempt_leases (lease_until) WHERE outcome_digest IS NULL;

-- The last recovery decision an agent was told for each action, and
-- whether an observation answered it.
CREATE TABLE agent_decisions (
    action_id    TEXT COLLATE "C" PRIMARY KEY REFERENCES actions (id),
    decision_id  TEXT COLLATE "C" NOT NULL CHECK (length(decision_id) >= 1),
    kind         TEXT COLLATE "C" NOT NULL,
    answered     BOOLEAN NOT NULL DEFAULT FALSE,
    decided_at   BIGINT NOT NULL
);

-- Events and observations are append-only: these triggers stop accidental
-- edits. They do not stop someone who drops them: the hash chain is what
-- detects that.
CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% are append-only', TG_TABLE_NAME;
END
$$;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER observations_no_update BEFORE UPDATE ON observations
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER observations_no_delete BEFORE DELETE ON observations
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
