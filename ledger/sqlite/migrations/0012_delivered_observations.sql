-- ledger:foreign_keys=off
-- 0012: observations gain the source delivered: a front end that runs a
-- tool for a caller attached to it (the MCP gateway) records that the
-- recorded outcome of an attempt reached the caller. A call repeated after
-- a crash joins an action whose outcome never did, instead of making the
-- call again. SQLite cannot change a CHECK in place, so the table is
-- rebuilt as in 0008.

CREATE TABLE observations_new (
    id           TEXT    PRIMARY KEY,
    run_id       TEXT    NOT NULL REFERENCES runs (id),
    action_id    TEXT    NOT NULL REFERENCES actions (id),
    attempt_id   TEXT    REFERENCES attempts (id),
    source       TEXT    NOT NULL CHECK (source IN ('tool_result','tool_query','tool_cancel','person','late_outcome','stale_holder','delivered')),
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
