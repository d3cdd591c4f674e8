-- Federation: work this site forwarded to others, and work it took from them.

-- For a task forwarded away: the site its current attempt went to, and the
-- node there that ran it (reported back). Its node_id stays NULL, so this
-- site's failure detection never mistakes a remote node for a lost local one.
ALTER TABLE tasks ADD COLUMN site TEXT;
ALTER TABLE tasks ADD COLUMN site_node TEXT;
-- For a task forwarded here: the site it came from and its id there. The
-- unique index makes a repeated forward (a retry after a lost answer) find
-- the task it created the first time instead of creating a second one.
ALTER TABLE tasks ADD COLUMN origin_site TEXT;
ALTER TABLE tasks ADD COLUMN origin_task TEXT;
CREATE UNIQUE INDEX tasks_by_origin ON tasks (origin_site, origin_task);

-- One row per attempt sent to another site: `sending` until the peer
-- stored it, `accepted` while it runs there, then `done` (its result is the
-- task's) or `abandoned` (the peer died or stopped answering; the task went
-- back to this site's queue, and a late answer from that peer is ignored).
CREATE TABLE forwards (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    attempt BIGINT NOT NULL,
    site TEXT NOT NULL,
    api_url TEXT NOT NULL,
    state TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    answered_ms BIGINT NOT NULL,
    reason TEXT,
    PRIMARY KEY (task_id, attempt)
);
CREATE INDEX forwards_by_state ON forwards (state);
