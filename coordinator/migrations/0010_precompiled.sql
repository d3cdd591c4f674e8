-- Modules compiled ahead of time for nodes without a compiler (issue 17): one
-- row per module, target and engine (the node's `Capability::wasm`), holding
-- the machine code and its sha256, which assignments name and agents fetch
-- from GET /api/v1/artifacts/{digest}.
CREATE TABLE precompiled (
    module TEXT NOT NULL REFERENCES artifacts (digest),
    target TEXT NOT NULL,
    engine TEXT NOT NULL,
    digest TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    bytes BYTEA NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (module, target, engine)
);
CREATE INDEX precompiled_digest ON precompiled (digest);
