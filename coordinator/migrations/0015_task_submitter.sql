-- Who submitted each task (issue 33: 11,001 tasks from one batch call sat
-- pending with no bound): the sha256 (hex) of the API token that submitted
-- it, '' when no token is enforced, for tasks stored before this column and
-- for tasks another site forwarded. Each token's pending tasks are bounded
-- (pending-quota); the index answers that count.
ALTER TABLE tasks ADD COLUMN submitter TEXT NOT NULL DEFAULT '';
CREATE INDEX tasks_submitter_state ON tasks (submitter, state);
