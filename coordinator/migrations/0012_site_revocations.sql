-- Sites revoked by the federation's trust root (issue 20): the signed
-- revocation as it arrived, so a restart, or a replica on the same
-- PostgreSQL, refuses the site too and can pass the revocation on to peers.
-- One row per site: a later revocation of the same site replaces it.
CREATE TABLE site_revocations (
    site TEXT PRIMARY KEY,
    revoked_ms BIGINT NOT NULL,
    signature TEXT NOT NULL,
    received_ms BIGINT NOT NULL
);
