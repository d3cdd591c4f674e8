-- A publisher's ed25519 signature over an artifact's digest, added with
-- `starling sign` (POST /api/v1/artifacts/{digest}/signature) and sent in
-- every assignment of the artifact, so nodes that trust the publisher run it.
-- One signature per artifact: signing again replaces it.
ALTER TABLE artifacts ADD COLUMN publisher_key BYTEA;
ALTER TABLE artifacts ADD COLUMN publisher_signature BYTEA;
