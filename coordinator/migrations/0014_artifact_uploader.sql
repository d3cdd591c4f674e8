-- Who stored each artifact (issue 33: 26 uploads of 32 MiB added 1.15 GB in
-- 7 s, with no bound): the sha256 (hex) of the API token that uploaded it,
-- '' when no token is enforced and for artifacts stored before this column.
-- Each token's stored bytes are bounded (artifact-quota-bytes), and
-- artifacts no task references are collected after a grace period.
ALTER TABLE artifacts ADD COLUMN uploader TEXT NOT NULL DEFAULT '';
CREATE INDEX artifacts_uploader ON artifacts (uploader);
