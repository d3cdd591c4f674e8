-- Delivery that does not rest on the broker's memory, and signed assignments.

-- The coordinator's ed25519 signing key. Coordinators sharing one database
-- share one key (the first to start inserts it, the others read it back), so
-- agents pin a single key whichever replica placed their work.
CREATE TABLE coordinator_keys (
    name TEXT PRIMARY KEY,
    secret BYTEA NOT NULL,
    created_ms BIGINT NOT NULL
);

-- Assignments not yet acknowledged by their node (any event other than
-- `rejected` for the attempt acknowledges it). A row is written in the same
-- transaction as the placement, so a crash between placing and publishing
-- leaves a row that is sent after restart; the resend loop re-signs and
-- re-sends due rows with backoff.
CREATE TABLE outbox (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    attempt BIGINT NOT NULL,
    node_id TEXT NOT NULL,
    next_send_ms BIGINT NOT NULL,
    sends BIGINT NOT NULL,
    PRIMARY KEY (task_id, attempt)
);

CREATE INDEX outbox_by_due ON outbox (next_send_ms);
