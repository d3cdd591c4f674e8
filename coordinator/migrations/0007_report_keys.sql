-- Reports that prove their sender: each node's ed25519 public key, made on the
-- node at enrollment (NULL for a node enrolled before reports were signed),
-- and the highest report counter accepted per node and report channel, so a
-- report replayed after a restart of the coordinator is still refused.

ALTER TABLE node_credentials ADD COLUMN report_key TEXT;

CREATE TABLE report_marks (
    node_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    counter BIGINT NOT NULL,
    PRIMARY KEY (node_id, channel)
);
