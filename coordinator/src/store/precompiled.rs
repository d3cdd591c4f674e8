//! The `precompiled` table: modules compiled ahead of time for a target and
//! engine, kept so that each is compiled once, whatever the number of nodes
//! or attempts that need it.

use starling_proto::Digest;

use super::{corrupt, to_db, with_pool, Backend, Store, StoreError};

/// What the cache is keyed by: a module, and the target and engine it was
/// compiled for (a node's `Capability::wasm`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrecompiledKey<'a> {
    /// sha256 of the module.
    pub module: &'a Digest,
    /// The target triple.
    pub target: &'a str,
    /// The engine identity.
    pub engine: &'a str,
}

impl Store {
    /// The digest of `key`'s compiled code, if it has been compiled.
    pub async fn precompiled_digest(
        &self,
        key: &PrecompiledKey<'_>,
    ) -> Result<Option<Digest>, StoreError> {
        let sql =
            "SELECT digest FROM precompiled WHERE module = $1 AND target = $2 AND engine = $3";
        let row: Option<(String,)> = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(key.module.to_hex())
            .bind(key.target)
            .bind(key.engine)
            .fetch_optional(pool)
            .await)?;
        row.map(|(digest,)| Digest::parse(&digest).map_err(|e| corrupt("precompiled.digest", e)))
            .transpose()
    }

    /// Keeps `bytes` (whose sha256 is `digest`) as `key`'s compiled code,
    /// unless another compile got there first; returns the digest stored,
    /// which is then the one every assignment names.
    pub async fn put_precompiled(
        &self,
        key: &PrecompiledKey<'_>,
        digest: &Digest,
        bytes: &[u8],
        now_ms: u64,
    ) -> Result<Digest, StoreError> {
        let sql = "INSERT INTO precompiled (module, target, engine, digest, size_bytes, bytes, created_ms) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (module, target, engine) DO NOTHING";
        with_pool!(self, pool => sqlx::query(sql)
            .bind(key.module.to_hex())
            .bind(key.target)
            .bind(key.engine)
            .bind(digest.to_hex())
            .bind(to_db(bytes.len() as u64))
            .bind(bytes)
            .bind(to_db(now_ms))
            .execute(pool)
            .await
            .map(|_| ()))?;
        self.precompiled_digest(key)
            .await?
            .ok_or_else(|| corrupt("precompiled", "the row just written is missing"))
    }

    /// The compiled code with sha256 `digest`, if stored.
    pub async fn precompiled_bytes(&self, digest: &Digest) -> Result<Option<Vec<u8>>, StoreError> {
        let sql = "SELECT bytes FROM precompiled WHERE digest = $1 LIMIT 1";
        let bytes: Option<(Vec<u8>,)> = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(digest.to_hex())
            .fetch_optional(pool)
            .await)?;
        Ok(bytes.map(|(bytes,)| bytes))
    }
}
