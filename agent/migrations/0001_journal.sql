-- The agent's durable journal (see agent/src/journal.rs for the policy).

-- Every attempt the agent remembers: the signed assignment while it is
-- unfinished (so a restart can run it again), and the last event, so a
-- redelivered assignment is answered instead of run twice.
CREATE TABLE attempts (
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    -- CBOR of the signed assignment; NULL once the attempt finished, and for
    -- attempts known only from a cancel.
    assignment BLOB,
    -- CBOR of the last event (its output dropped once the coordinator
    -- acknowledged a final event).
    last_event BLOB NOT NULL,
    state TEXT NOT NULL,
    -- Until when a copy of the assignment could still be accepted: the
    -- attempt is not pruned before, so a replay is still recognised.
    valid_until_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (task_id, attempt)
);

CREATE INDEX attempts_by_age ON attempts (updated_ms);

-- Task events the coordinator has not acknowledged yet, oldest first.
CREATE TABLE outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    state TEXT NOT NULL,
    event BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    UNIQUE (task_id, attempt, state)
);
