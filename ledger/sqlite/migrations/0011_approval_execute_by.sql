-- 0011: a granted approval covers a begin only until its execute_by; a
-- begin after it asks for approval again, and the approval that went stale
-- records when and why (stale_at, stale_reason). Approvals granted before
-- this migration have no execute_by: they cover their action as before.
-- Their content, which the chain binds, has none of the three, so their
-- digests stay as they were.
ALTER TABLE approvals ADD COLUMN execute_by INTEGER
    CHECK (execute_by IS NULL OR state = 'granted');
ALTER TABLE approvals ADD COLUMN stale_at INTEGER
    CHECK (stale_at IS NULL OR state = 'granted');
ALTER TABLE approvals ADD COLUMN stale_reason TEXT
    CHECK ((stale_reason IS NULL) = (stale_at IS NULL));
-- A begin reads its action's newest granted approval.
CREATE INDEX approvals_action ON approvals (action_id, id);
