//! The `artifacts` table: modules and kernels stored under their sha256, with
//! the runtime that runs them and an optional publisher signature.

use starling_proto::{Digest, PublisherSignature, Runtime};

use super::{corrupt, from_db, runtime_from_str, to_db, with_pool, Backend, Store, StoreError};

impl Store {
    /// Stores an artifact under its digest with the runtime that runs it,
    /// charged to `uploader` (the sha256 of the uploading token, '' when
    /// none is enforced); returns whether it was new. Storing the same
    /// bytes twice is harmless, and charges only the first uploader.
    pub async fn put_artifact(
        &self,
        digest: &Digest,
        bytes: &[u8],
        runtime: Runtime,
        uploader: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let sql =
            "INSERT INTO artifacts (digest, size_bytes, bytes, created_ms, runtime, uploader) \
                   VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (digest) DO NOTHING";
        let result = with_pool!(self, pool => sqlx::query(sql)
            .bind(digest.to_hex())
            .bind(to_db(bytes.len() as u64))
            .bind(bytes)
            .bind(to_db(now_ms))
            .bind(runtime.as_str())
            .bind(uploader)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(result == 1)
    }

    /// Bytes of the artifacts stored charged to `uploader`.
    pub async fn uploaded_bytes(&self, uploader: &str) -> Result<u64, StoreError> {
        // SUM over BIGINT is NUMERIC in PostgreSQL: cast back.
        let sql = "SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) FROM artifacts WHERE uploader = $1";
        let (bytes,): (i64,) = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(uploader)
            .fetch_one(pool)
            .await)?;
        Ok(from_db(bytes))
    }

    /// Deletes the artifacts stored before `stored_before_ms` that no task
    /// references, with the code compiled from them; returns how many and
    /// their bytes. A task keeps its artifact for as long as the task is
    /// kept; the grace period covers an upload whose tasks are not yet
    /// submitted (`starling publish`, then `run`).
    pub async fn collect_artifacts(&self, stored_before_ms: u64) -> Result<(u64, u64), StoreError> {
        let unreferenced = "created_ms < $1 AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.artifact = artifacts.digest)";
        let precompiled = format!(
            "DELETE FROM precompiled WHERE module IN (SELECT digest FROM artifacts WHERE {unreferenced})"
        );
        let artifacts = format!("DELETE FROM artifacts WHERE {unreferenced} RETURNING size_bytes");
        let before = to_db(stored_before_ms);
        let sizes: Vec<(i64,)> = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            sqlx::query(&precompiled).bind(before).execute(&mut *tx).await?;
            let sizes = sqlx::query_as(&artifacts).bind(before).fetch_all(&mut *tx).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(sizes)
        })?;
        let bytes = sizes.iter().map(|(size,)| from_db(*size)).sum();
        Ok((sizes.len() as u64, bytes))
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
