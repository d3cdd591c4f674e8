//! The `coordinator_keys` table: the coordinator's signing keys, shared by
//! replicas on one database.

use super::{to_db, with_pool, Backend, Store, StoreError};

impl Store {
    /// The secret of the coordinator key `name`: the stored one, or `fresh`
    /// when none was stored yet. Replicas sharing the database race to insert
    /// and all read back the one that won, so they sign with the same key.
    pub async fn coordinator_key(
        &self,
        name: &str,
        fresh: &[u8],
        now_ms: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let insert = "INSERT INTO coordinator_keys (name, secret, created_ms) VALUES ($1, $2, $3) \
                      ON CONFLICT (name) DO NOTHING";
        let select = "SELECT secret FROM coordinator_keys WHERE name = $1";
        let (secret,): (Vec<u8>,) = with_pool!(self, pool => {
            sqlx::query(insert)
                .bind(name)
                .bind(fresh)
                .bind(to_db(now_ms))
                .execute(pool)
                .await?;
            sqlx::query_as(select).bind(name).fetch_one(pool).await
        })?;
        Ok(secret)
    }
}
