-- Starling coordinator schema. One migration set serves SQLite and PostgreSQL,
-- so it sticks to portable SQL: TEXT, BIGINT, DOUBLE PRECISION and BYTEA
-- (SQLite accepts BYTEA as a column type and stores the bytes as a blob).

CREATE TABLE artifacts (
    digest TEXT PRIMARY KEY,
    size_bytes BIGINT NOT NULL,
    bytes BYTEA NOT NULL,
    created_ms BIGINT NOT NULL
);

CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    artifact TEXT NOT NULL REFERENCES artifacts (digest),
    runtime TEXT NOT NULL,
    input BYTEA NOT NULL,
    args TEXT NOT NULL,
    class TEXT NOT NULL,
    demand TEXT NOT NULL,
    limits TEXT NOT NULL,
    work_seconds DOUBLE PRECISION NOT NULL,
    priority BIGINT NOT NULL,
    deadline_unix_ms BIGINT,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    state TEXT NOT NULL,
    node_id TEXT,
    attempt BIGINT NOT NULL,
    power_level BIGINT,
    output BYTEA,
    exit_code BIGINT,
    failure_reason TEXT,
    failure_message TEXT,
    explanation TEXT,
    cancel_requested BIGINT NOT NULL
);

CREATE INDEX tasks_by_state ON tasks (state, created_ms);
CREATE INDEX tasks_by_created ON tasks (created_ms);

CREATE TABLE attempts (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    attempt BIGINT NOT NULL,
    node_id TEXT NOT NULL,
    power_level BIGINT NOT NULL,
    assigned_ms BIGINT NOT NULL,
    state TEXT NOT NULL,
    finished_ms BIGINT,
    explanation TEXT,
    PRIMARY KEY (task_id, attempt)
);

-- The primary key makes event recording idempotent: an agent's redelivered
-- event (QoS 1 delivers at least once) hits the key and changes nothing.
CREATE TABLE events (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    attempt BIGINT NOT NULL,
    state TEXT NOT NULL,
    node_id TEXT NOT NULL,
    received_ms BIGINT NOT NULL,
    reason TEXT,
    message TEXT,
    exit_code BIGINT,
    output_bytes BIGINT NOT NULL,
    metrics TEXT,
    PRIMARY KEY (task_id, attempt, state)
);
