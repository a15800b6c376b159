-- 0009: the store probe, a write that always writes.
--
-- While the store's writes fail (a full disk, say), a process with nothing
-- else to write proves that they succeed again with a probe write: it
-- raises probes in this table's one row. A write of unchanged bytes would
-- not reach the disk (SQLite skips a page whose content does not change),
-- so the probe changes a counter. The row is operational state, read by
-- nothing of the ledger.
CREATE TABLE store_probes (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    probes INTEGER NOT NULL CHECK (probes > 0)
);
