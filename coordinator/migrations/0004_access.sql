-- Who may do what: REST bearer tokens with roles, join tokens for enrolling
-- nodes, and each enrolled node's MQTT credentials. Secrets are never stored:
-- only their sha256 (and, for MQTT passwords, the Mosquitto `$7$` hash line
-- the password file needs), so a copy of the database lets nobody in.

CREATE TABLE api_tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_ms BIGINT NOT NULL,
    revoked_ms BIGINT
);

CREATE TABLE join_tokens (
    id TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    uses_left BIGINT NOT NULL
);

-- One row per node ever enrolled; revoking sets revoked_ms, and enrolling the
-- node again (with a new join token) replaces the row.
CREATE TABLE node_credentials (
    node_id TEXT PRIMARY KEY,
    password_sha256 TEXT NOT NULL,
    mosquitto_hash TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    revoked_ms BIGINT
);
