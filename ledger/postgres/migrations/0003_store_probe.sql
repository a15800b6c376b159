-- 0003_store_probe: the store probe, a write that always writes (SQLite's
-- 0009).
--
-- While the store's writes fail, a process with nothing else to write
-- proves that they succeed again with a probe write: it raises probes in
-- this table's one row, a new row version and a WAL record each time. The
-- row is operational state, read by nothing of the ledger.
CREATE TABLE store_probes (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    probes BIGINT NOT NULL CHECK (probes > 0)
);
