//! The `leader_lease` and `leader_terms` tables: which replica of this site
//! leads, under which term, and the fence every leader-only write checks.

use super::{from_db, to_db, with_pool, Backend, Store, StoreError};
use crate::leader::Fence;

/// The one lease row's name.
const LEASE: &str = "site";

/// Checks, inside a leader-only write's transaction, that the lease still
/// holds the writer's term. PostgreSQL locks the row until the commit, so a
/// replica taking the lease waits for writes under the old term to finish,
/// and every write after that finds a new term and fails.
pub(crate) const FENCE_SQL: &str =
    "UPDATE leader_lease SET epoch = epoch WHERE name = 'site' AND epoch = $1";

/// A term as the `leader_terms` table remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderTerm {
    /// The term's epoch, from 1.
    pub epoch: u64,
    /// The replica that held it.
    pub holder: String,
    /// When it began, on the holder's clock (Unix ms).
    pub acquired_ms: u64,
}

impl Store {
    /// Whether this coordinator leads its site now (always, without replicas):
    /// the loops only a leader runs ask before each pass.
    pub fn leads(&self) -> bool {
        self.leadership.is_leader()
    }

    /// The term this replica leads under (none for a single coordinator).
    pub fn leader_term(&self) -> Option<u64> {
        self.leadership.term()
    }

    /// What a leader-only write must check: `Err(Deposed)` at once when this
    /// replica does not lead, else the term to check in the transaction.
    pub(crate) fn fence(&self) -> Result<Option<u64>, StoreError> {
        match self.leadership.fence() {
            Fence::None => Ok(None),
            Fence::Term(term) => Ok(Some(term)),
            Fence::NotLeader => Err(StoreError::Deposed),
        }
    }

    /// Takes the site's lease for `holder` until `now_ms + ttl_ms` when it is
    /// free or has run out by `now_ms`, under a new term; returns the term,
    /// or `None` while another replica's lease runs.
    pub async fn acquire_lease(
        &self,
        holder: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let seed = "INSERT INTO leader_lease (name, holder, epoch, expires_ms) \
                    VALUES ($1, '', 0, 0) ON CONFLICT (name) DO NOTHING";
        let take = "UPDATE leader_lease SET holder = $2, epoch = epoch + 1, expires_ms = $3 \
                    WHERE name = $1 AND expires_ms <= $4 RETURNING epoch";
        let remember = "INSERT INTO leader_terms (epoch, holder, acquired_ms) VALUES ($1, $2, $3)";
        let term = with_pool!(self, pool => {
            sqlx::query(seed).bind(LEASE).execute(pool).await?;
            let mut tx = pool.begin().await?;
            let taken: Option<(i64,)> = sqlx::query_as(take)
                .bind(LEASE)
                .bind(holder)
                .bind(to_db(now_ms.saturating_add(ttl_ms)))
                .bind(to_db(now_ms))
                .fetch_optional(&mut *tx)
                .await?;
            if let Some((epoch,)) = taken {
                sqlx::query(remember)
                    .bind(epoch)
                    .bind(holder)
                    .bind(to_db(now_ms))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<Option<i64>, sqlx::Error>(taken.map(|(epoch,)| epoch))
        })?;
        Ok(term.map(from_db))
    }

    /// Extends `holder`'s lease of term `epoch` to `now_ms + ttl_ms`; false
    /// when the term is over (another replica took the lease).
    pub async fn renew_lease(
        &self,
        holder: &str,
        epoch: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE leader_lease SET expires_ms = $4 \
                   WHERE name = $1 AND holder = $2 AND epoch = $3";
        let renewed = with_pool!(self, pool => sqlx::query(sql)
            .bind(LEASE)
            .bind(holder)
            .bind(to_db(epoch))
            .bind(to_db(now_ms.saturating_add(ttl_ms)))
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(renewed == 1)
    }

    /// Ends `holder`'s term `epoch` now, so another replica takes over at
    /// once instead of waiting for the lease to run out (a clean stop).
    pub async fn release_lease(&self, holder: &str, epoch: u64) -> Result<(), StoreError> {
        let sql = "UPDATE leader_lease SET expires_ms = 0 \
                   WHERE name = $1 AND holder = $2 AND epoch = $3";
        with_pool!(self, pool => sqlx::query(sql)
            .bind(LEASE)
            .bind(holder)
            .bind(to_db(epoch))
            .execute(pool)
            .await
            .map(|_| ()))?;
        Ok(())
    }

    /// Every term so far, oldest first.
    pub async fn leader_terms(&self) -> Result<Vec<LeaderTerm>, StoreError> {
        let sql = "SELECT epoch, holder, acquired_ms FROM leader_terms ORDER BY epoch";
        let rows: Vec<(i64, String, i64)> =
            with_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|(epoch, holder, acquired_ms)| LeaderTerm {
                epoch: from_db(epoch),
                holder,
                acquired_ms: from_db(acquired_ms),
            })
            .collect())
    }
}
