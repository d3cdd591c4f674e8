//! The `outbox` table: assignments waiting for their node's acknowledgement,
//! claimed send by send so that each due send happens once across replicas.

use super::{check_term, from_db, to_db, with_pool, Backend, Store, StoreError};

/// An assignment waiting for its node's acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The task.
    pub task_id: String,
    /// The attempt.
    pub attempt: u32,
    /// The node it is for.
    pub node_id: String,
    /// When it is due for its next send, Unix milliseconds.
    pub next_send_ms: u64,
    /// How many times it was sent.
    pub sends: u32,
}

/// An `outbox` row.
#[derive(sqlx::FromRow)]
struct OutboxRow {
    task_id: String,
    attempt: i64,
    node_id: String,
    next_send_ms: i64,
    sends: i64,
}

impl OutboxRow {
    /// The entry the row holds.
    fn into_entry(self) -> OutboxEntry {
        OutboxEntry {
            task_id: self.task_id,
            attempt: u32::try_from(self.attempt).unwrap_or(0),
            node_id: self.node_id,
            next_send_ms: from_db(self.next_send_ms),
            sends: u32::try_from(self.sends).unwrap_or(u32::MAX),
        }
    }
}

impl Store {
    /// Outbox rows due at `now_ms` (never sent, or unacknowledged past their
    /// resend time), soonest first.
    pub async fn due_outbox(
        &self,
        now_ms: u64,
        limit: u32,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let sql = "SELECT task_id, attempt, node_id, next_send_ms, sends FROM outbox \
                   WHERE next_send_ms <= $1 ORDER BY next_send_ms ASC, task_id ASC LIMIT $2";
        let rows: Vec<OutboxRow> = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(to_db(now_ms))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await)?;
        Ok(rows.into_iter().map(OutboxRow::into_entry).collect())
    }

    /// Makes every outbox row due by `now_ms` at the latest (keeping its send
    /// count, so backoff goes on where it was); returns how many moved.
    pub async fn outbox_due_by(&self, now_ms: u64) -> Result<u64, StoreError> {
        let sql = "UPDATE outbox SET next_send_ms = $1 WHERE next_send_ms > $1";
        let moved = with_pool!(self, pool => sqlx::query(sql)
            .bind(to_db(now_ms))
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(moved)
    }

    /// The outbox row of one attempt, if its assignment is unacknowledged.
    pub async fn outbox_entry(
        &self,
        task_id: &str,
        attempt: u32,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        let sql = "SELECT task_id, attempt, node_id, next_send_ms, sends FROM outbox \
                   WHERE task_id = $1 AND attempt = $2";
        let row: Option<OutboxRow> = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(task_id)
            .bind(i64::from(attempt))
            .fetch_optional(pool)
            .await)?;
        Ok(row.map(OutboxRow::into_entry))
    }

    /// Claims the next send of an outbox row as read in `seen`: counts the send
    /// and moves its resend time to `next_send_ms`. Returns false when the row
    /// is gone or another sender (a second replica, or the scheduler's first
    /// send) claimed it since it was read, so each due send happens once.
    /// Only a leader sends: with replicas, the claim is fenced by `term`
    /// (what [`Store::fence`] gave), so a deposed leader claims nothing.
    pub async fn claim_outbox_send(
        &self,
        seen: &OutboxEntry,
        next_send_ms: u64,
        term: Option<u64>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE outbox SET next_send_ms = $3, sends = sends + 1 \
                   WHERE task_id = $1 AND attempt = $2 AND next_send_ms = $4 AND sends = $5";
        let claimed = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            check_term!(tx, term);
            let claimed = sqlx::query(sql)
                .bind(&seen.task_id)
                .bind(i64::from(seen.attempt))
                .bind(to_db(next_send_ms))
                .bind(to_db(seen.next_send_ms))
                .bind(i64::from(seen.sends))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok::<u64, sqlx::Error>(claimed)
        })?;
        Ok(claimed == 1)
    }

    /// Drops one attempt's outbox row (its task moved on without an event).
    pub async fn drop_outbox(&self, task_id: &str, attempt: u32) -> Result<(), StoreError> {
        let sql = "DELETE FROM outbox WHERE task_id = $1 AND attempt = $2";
        with_pool!(self, pool => sqlx::query(sql)
            .bind(task_id)
            .bind(i64::from(attempt))
            .execute(pool)
            .await
            .map(|_| ()))?;
        Ok(())
    }
}
