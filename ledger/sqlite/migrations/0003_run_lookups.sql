-- 0003: evidence reads a run's approvals; without an index on run_id that read
-- scanned every approval of the ledger. (A run's observations are found
-- through its actions and observations_action, without a new index on the
-- table every action writes.)
CREATE INDEX approvals_run ON approvals (run_id, id);
