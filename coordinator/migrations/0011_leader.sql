-- Coordinator replicas of one site on one PostgreSQL (issue 19). One row
-- names the replica that schedules and keeps house: its lease runs until
-- `expires_ms` (the holder's clock) and is renewed well before; another
-- replica takes it only once it has run out, under a higher `epoch`.
-- Every write a leader makes in its role (placements, sends, requeues,
-- ended attempts, forwards) first checks in its transaction that the row
-- still holds its epoch, so a deposed leader's writes fail instead of
-- landing (fencing). A single coordinator on SQLite never uses it.
CREATE TABLE leader_lease (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL
);
-- Every term, for operators and for the history checker of the replica
-- tests: who led from when.
CREATE TABLE leader_terms (
    epoch BIGINT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_ms BIGINT NOT NULL
);
-- The term under which each attempt was placed (NULL without replicas).
ALTER TABLE attempts ADD COLUMN epoch BIGINT;
