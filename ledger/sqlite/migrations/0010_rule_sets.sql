-- 0010: the approval rule sets the gates ran with.
--
-- One row per rule set, kept under its digest (sha256 of its canonical
-- JSON, which document holds as written) and never changed: an action's
-- gate names the digest of the rule set that decided it, so a report can
-- show the rule, and a document that no longer has its digest is caught
-- by the chain's verification. stored_at is when it was first stored, in
-- microseconds.
CREATE TABLE rule_sets (
    digest    TEXT PRIMARY KEY CHECK (digest LIKE 'sha256:%'),
    document  TEXT NOT NULL,
    stored_at INTEGER NOT NULL
);
