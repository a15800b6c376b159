-- 0004: every row a report shows is bound into its run's hash chain, and a
-- run's chain head may be signed.
--
-- format is how an event's hash is computed: 1 for events written before
-- this migration (their data hashed inline, no rows bound), 2 from then on
-- (the data's digest and row_digests hashed instead). row_digests is the
-- canonical JSON object {"<entity>/<id>": "sha256:…"} of the rows the
-- event's write left changed, each with the digest of its content after
-- the write; NULL if it binds none.
ALTER TABLE events ADD COLUMN format INTEGER NOT NULL DEFAULT 1 CHECK (format IN (1, 2));
ALTER TABLE events ADD COLUMN row_digests TEXT;

-- The newest signature of each run's chain head, by the signing key a
-- process was given (the key itself is never stored). A write that moves a
-- head replaces its signature in the same transaction; a process without
-- the key leaves the older signature, which then covers fewer events than
-- the chain holds.
CREATE TABLE chain_signatures (
    run_id     TEXT    PRIMARY KEY REFERENCES runs (id),
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    hash       TEXT    NOT NULL CHECK (hash LIKE 'sha256:%'),
    signed_at  INTEGER NOT NULL,
    key_id     TEXT    NOT NULL,
    signature  TEXT    NOT NULL
);
