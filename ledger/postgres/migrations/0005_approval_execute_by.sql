-- 0005_approval_execute_by: a granted approval covers a begin only until
-- its execute_by (SQLite's 0011); a begin after it asks for approval
-- again, and the approval that went stale records when and why. Approvals
-- granted before have no execute_by and cover their action as before.
ALTER TABLE approvals ADD COLUMN execute_by BIGINT
    CHECK (execute_by IS NULL OR state = 'granted');
ALTER TABLE approvals ADD COLUMN stale_at BIGINT
    CHECK (stale_at IS NULL OR state = 'granted');
ALTER TABLE approvals ADD COLUMN stale_reason TEXT COLLATE "C"
    CHECK ((stale_reason IS NULL) = (stale_at IS NULL));
-- A begin reads its action's newest granted approval.
CREATE INDEX approvals_action ON approvals (action_id, id);
