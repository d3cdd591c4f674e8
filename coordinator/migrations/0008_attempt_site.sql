-- Forwarded attempts name their site in a column of its own.
--
-- Until now an attempt forwarded to site S was recorded under the node id
-- `site:S` (and its events under `site:S` or `S/NODE`), so a node enrolled
-- as `site:S` passed the attempt-owner check and could end the forwarded
-- attempt with a forged result (issue 15). Node ids can no longer hold `:`,
-- and an attempt forwarded away now has no node at all: `node_id` is NULL
-- and `site` names the peer. Exactly one of the two is set on an attempt.
--
-- SQLite cannot drop a NOT NULL constraint in place, so both tables are
-- rebuilt (create, copy, drop, rename), which reads the same on PostgreSQL.
-- Rows are told apart by the `forwards` table (one row per forwarded
-- attempt, written in the same transaction as the attempt), not by the
-- `site:` prefix, so a local node that an older version let enroll as
-- `site:NAME` keeps its own attempts.

CREATE TABLE attempts_with_site (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    attempt BIGINT NOT NULL,
    -- The node of this site it was sent to; NULL when it was forwarded.
    node_id TEXT,
    -- The site it was forwarded to; NULL when it ran here.
    site TEXT,
    power_level BIGINT NOT NULL,
    assigned_ms BIGINT NOT NULL,
    state TEXT NOT NULL,
    finished_ms BIGINT,
    explanation TEXT,
    PRIMARY KEY (task_id, attempt),
    CHECK ((node_id IS NULL) <> (site IS NULL))
);
INSERT INTO attempts_with_site
    (task_id, attempt, node_id, site, power_level, assigned_ms, state, finished_ms, explanation)
SELECT a.task_id, a.attempt,
       CASE WHEN f.site IS NULL THEN a.node_id ELSE NULL END,
       f.site,
       a.power_level, a.assigned_ms, a.state, a.finished_ms, a.explanation
FROM attempts a
LEFT JOIN forwards f ON f.task_id = a.task_id AND f.attempt = a.attempt;
DROP TABLE attempts;
ALTER TABLE attempts_with_site RENAME TO attempts;

-- Events of a forwarded attempt: `site` names the peer, and `node_id` is the
-- peer's node that ran it when the peer said (NULL otherwise), where older
-- versions wrote `SITE/NODE` or `site:SITE`.
CREATE TABLE events_with_site (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    attempt BIGINT NOT NULL,
    state TEXT NOT NULL,
    node_id TEXT,
    site TEXT,
    received_ms BIGINT NOT NULL,
    reason TEXT,
    message TEXT,
    exit_code BIGINT,
    output_bytes BIGINT NOT NULL,
    metrics TEXT,
    PRIMARY KEY (task_id, attempt, state)
);
INSERT INTO events_with_site
    (task_id, attempt, state, node_id, site, received_ms, reason, message, exit_code, output_bytes, metrics)
SELECT e.task_id, e.attempt, e.state,
       CASE
           WHEN f.site IS NULL THEN e.node_id
           WHEN e.node_id = 'site:' || f.site THEN NULL
           WHEN SUBSTR(e.node_id, 1, LENGTH(f.site) + 1) = f.site || '/'
               THEN SUBSTR(e.node_id, LENGTH(f.site) + 2)
           ELSE e.node_id
       END,
       f.site,
       e.received_ms, e.reason, e.message, e.exit_code, e.output_bytes, e.metrics
FROM events e
LEFT JOIN forwards f ON f.task_id = e.task_id AND f.attempt = e.attempt;
DROP TABLE events;
ALTER TABLE events_with_site RENAME TO events;
