-- 0006: observations gain the source delivered: a front end that runs a
-- tool for a caller attached to it (the MCP gateway) records that the
-- recorded outcome of an attempt reached the caller, so a call repeated
-- after a crash joins an action whose outcome never did.

ALTER TABLE observations DROP CONSTRAINT observations_source_check;
ALTER TABLE observations ADD CONSTRAINT observations_source_check
    CHECK (source IN ('tool_result','tool_query','tool_cancel','person','late_outcome','stale_holder','delivered'));
