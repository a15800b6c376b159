-- 0004_rule_sets: the approval rule sets the gates ran with (SQLite's
-- 0010).
--
-- One row per rule set, kept under its digest (sha256 of its canonical
-- JSON, which document holds as written: TEXT, not JSONB, which would not
-- keep the bytes) and never changed. stored_at is when it was first
-- stored, in microseconds.
CREATE TABLE rule_sets (
    digest    TEXT PRIMARY KEY CHECK (digest LIKE 'sha256:%'),
    document  TEXT NOT NULL,
    stored_at BIGINT NOT NULL
);
