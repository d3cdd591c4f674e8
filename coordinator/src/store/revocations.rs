//! The `site_revocations` table: sites the federation's trust root revoked,
//! kept as the signed revocations that arrived (checked before they are
//! stored), one per site, the latest.

use starling_api::SiteRevocation;

use super::{from_db, to_db, with_pool, Backend, Store, StoreError};

impl Store {
    /// Keeps `revocation` unless a later one of the same site is stored;
    /// true when it was new here. The caller has checked its signature.
    pub async fn put_site_revocation(
        &self,
        revocation: &SiteRevocation,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let upsert = "INSERT INTO site_revocations (site, revoked_ms, signature, received_ms) \
                      VALUES ($1, $2, $3, $4) \
                      ON CONFLICT (site) DO UPDATE SET revoked_ms = excluded.revoked_ms, \
                      signature = excluded.signature, received_ms = excluded.received_ms \
                      WHERE site_revocations.revoked_ms < excluded.revoked_ms";
        let changed = with_pool!(self, pool => {
            sqlx::query(upsert)
                .bind(&revocation.site)
                .bind(to_db(revocation.revoked_ms))
                .bind(&revocation.signature)
                .bind(to_db(now_ms))
                .execute(pool)
                .await
                .map(|done| done.rows_affected())
        })?;
        Ok(changed == 1)
    }

    /// Every stored revocation, by site.
    pub async fn site_revocations(&self) -> Result<Vec<SiteRevocation>, StoreError> {
        let select = "SELECT site, revoked_ms, signature FROM site_revocations ORDER BY site";
        let rows: Vec<(String, i64, String)> = with_pool!(self, pool => {
            sqlx::query_as(select).fetch_all(pool).await
        })?;
        Ok(rows
            .into_iter()
            .map(|(site, revoked_ms, signature)| SiteRevocation {
                site,
                revoked_ms: from_db(revoked_ms),
                signature,
            })
            .collect())
    }
}
