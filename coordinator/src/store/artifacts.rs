//! The `artifacts` table: modules and kernels stored under their sha256, with
//! the runtime that runs them and an optional publisher signature.

use starling_proto::{Digest, PublisherSignature, Runtime};

use super::{corrupt, from_db, runtime_from_str, to_db, with_pool, Backend, Store, StoreError};

impl Store {
    /// Stores an artifact under its digest with the runtime that runs it;
    /// returns whether it was new. Storing the same bytes twice is harmless.
    pub async fn put_artifact(
        &self,
        digest: &Digest,
        bytes: &[u8],
        runtime: Runtime,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let sql = "INSERT INTO artifacts (digest, size_bytes, bytes, created_ms, runtime) VALUES ($1, $2, $3, $4, $5) \
                   ON CONFLICT (digest) DO NOTHING";
        let result = with_pool!(self, pool => sqlx::query(sql)
            .bind(digest.to_hex())
            .bind(to_db(bytes.len() as u64))
            .bind(bytes)
            .bind(to_db(now_ms))
            .bind(runtime.as_str())
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(result == 1)
    }

    /// The bytes of an artifact, if stored.
    pub async fn artifact(&self, digest: &Digest) -> Result<Option<Vec<u8>>, StoreError> {
        let sql = "SELECT bytes FROM artifacts WHERE digest = $1";
        let bytes: Option<(Vec<u8>,)> = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(digest.to_hex())
            .fetch_optional(pool)
            .await)?;
        Ok(bytes.map(|(bytes,)| bytes))
    }

    /// Records a publisher's signature over a stored artifact's digest
    /// (replacing any earlier one); returns false when there is no such
    /// artifact. The caller has verified the signature.
    pub async fn set_artifact_publisher(
        &self,
        digest: &Digest,
        publisher: &PublisherSignature,
    ) -> Result<bool, StoreError> {
        let sql =
            "UPDATE artifacts SET publisher_key = $1, publisher_signature = $2 WHERE digest = $3";
        let updated = with_pool!(self, pool => sqlx::query(sql)
            .bind(&publisher.key)
            .bind(&publisher.signature)
            .bind(digest.to_hex())
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(updated == 1)
    }

    /// The publisher signature recorded for an artifact, if any.
    pub async fn artifact_publisher(
        &self,
        digest: &Digest,
    ) -> Result<Option<PublisherSignature>, StoreError> {
        let sql = "SELECT publisher_key, publisher_signature FROM artifacts WHERE digest = $1";
        // Both NULL until someone signs the artifact.
        type Row = (Option<Vec<u8>>, Option<Vec<u8>>);
        let row: Option<Row> = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(digest.to_hex())
            .fetch_optional(pool)
            .await)?;
        Ok(match row {
            Some((Some(key), Some(signature))) => Some(PublisherSignature { key, signature }),
            _ => None,
        })
    }

    /// The size and runtime of an artifact, if stored.
    pub async fn artifact_info(
        &self,
        digest: &Digest,
    ) -> Result<Option<(u64, Runtime)>, StoreError> {
        let sql = "SELECT size_bytes, runtime FROM artifacts WHERE digest = $1";
        let row: Option<(i64, String)> = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(digest.to_hex())
            .fetch_optional(pool)
            .await)?;
        row.map(|(size, runtime)| {
            let runtime =
                runtime_from_str(&runtime).ok_or_else(|| corrupt("artifacts.runtime", &runtime))?;
            Ok((from_db(size), runtime))
        })
        .transpose()
    }
}
