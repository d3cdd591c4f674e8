//! The store's side of forwarding: the home site's forwards, and the tasks a
//! peer took from other sites. Same rules as the rest of the store: one query text for
//! both databases, every read-modify-write in one transaction that writes first.

use std::str::FromStr;

use crate::store::{
    check_term, corrupt, from_db, to_db, with_pool, Backend, NewTask, Store, StoreError, TaskRecord,
};
use crate::task::TaskStatus;
use starling_api::TaskChange;

/// An attempt forwarded to another site that has not ended yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenForward {
    /// The task (its id at home).
    pub task_id: String,
    /// The attempt that was forwarded.
    pub attempt: u32,
    /// The peer site.
    pub site: String,
    /// The peer's REST API.
    pub api_url: String,
    /// Whether the peer confirmed it stored the task.
    pub accepted: bool,
    /// When the peer last answered (or the forward was made), Unix ms.
    pub answered_ms: u64,
    /// Whether the task's submitter asked to cancel it.
    pub cancel_requested: bool,
}

/// A forwarded task's end, as its peer reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteResult {
    /// `succeeded`, `failed` or `cancelled`.
    pub status: TaskStatus,
    /// The peer's node that ran it.
    pub node: Option<String>,
    /// Output of a success.
    pub output: Option<Vec<u8>>,
    /// The module's exit code.
    pub exit_code: Option<i32>,
    /// Failure code.
    pub failure_reason: Option<String>,
    /// Failure message.
    pub failure_message: Option<String>,
}

/// What taking a forwarded attempt back did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakenBack {
    /// Back in this site's queue.
    Requeued,
    /// Its submitter had asked to cancel it: cancelled.
    Cancelled,
    /// Out of attempts: failed.
    Failed,
    /// The forward had already ended (answered or taken back): nothing changed.
    AlreadyEnded,
}

impl Store {
    /// Records a forward: the pending task's attempt `attempt` goes to `site`
    /// (state `assigned`, no local node), with an attempt row naming the site
    /// (and no node, so no node's event is ever its owner's) and a `sending`
    /// forward row, in one transaction. False (and nothing
    /// changed) when the task is no longer pending at the previous attempt.
    pub async fn forward_task(
        &self,
        task_id: &str,
        attempt: u32,
        site: &str,
        api_url: &str,
        explanation: &serde_json::Value,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let explanation = explanation.to_string();
        let update = "UPDATE tasks SET state = 'assigned', attempt = $2, node_id = NULL, power_level = NULL, \
                      site = $3, site_node = NULL, explanation = $4, updated_ms = $5 \
                      WHERE id = $1 AND state = 'pending' AND attempt = $6";
        let attempt_row = "INSERT INTO attempts (task_id, attempt, node_id, site, power_level, assigned_ms, state, explanation) \
                           VALUES ($1, $2, NULL, $3, 0, $4, 'assigned', $5)";
        let forward = "INSERT INTO forwards (task_id, attempt, site, api_url, state, created_ms, answered_ms) \
                       VALUES ($1, $2, $3, $4, 'sending', $5, $5)";
        let fence = self.fence()?;
        let forwarded = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            check_term!(tx, fence);
            let updated = sqlx::query(update)
                .bind(task_id)
                .bind(i64::from(attempt))
                .bind(site)
                .bind(&explanation)
                .bind(to_db(now_ms))
                .bind(i64::from(attempt.saturating_sub(1)))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if updated != 1 {
                tx.rollback().await?;
                return Ok(false);
            }
            sqlx::query(attempt_row)
                .bind(task_id)
                .bind(i64::from(attempt))
                .bind(site)
                .bind(to_db(now_ms))
                .bind(&explanation)
                .execute(&mut *tx)
                .await?;
            sqlx::query(forward)
                .bind(task_id)
                .bind(i64::from(attempt))
                .bind(site)
                .bind(api_url)
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<bool, sqlx::Error>(true)
        })?;
        if forwarded {
            self.announce(forwarded_change(
                task_id,
                TaskStatus::Assigned,
                attempt,
                site,
                None,
                now_ms,
            ));
        }
        Ok(forwarded)
    }

    /// Forwards not yet ended, oldest first.
    pub async fn open_forwards(&self, limit: u32) -> Result<Vec<OpenForward>, StoreError> {
        let sql = "SELECT f.task_id, f.attempt, f.site, f.api_url, f.state, f.answered_ms, t.cancel_requested \
                   FROM forwards f JOIN tasks t ON t.id = f.task_id \
                   WHERE f.state IN ('sending', 'accepted') ORDER BY f.created_ms ASC LIMIT $1";
        let rows: Vec<(String, i64, String, String, String, i64, i64)> = with_pool!(self, pool => sqlx::query_as(sql).bind(i64::from(limit)).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(
                |(task_id, attempt, site, api_url, state, answered, cancel)| OpenForward {
                    task_id,
                    attempt: u32::try_from(attempt).unwrap_or(0),
                    site,
                    api_url,
                    accepted: state == "accepted",
                    answered_ms: from_db(answered),
                    cancel_requested: cancel != 0,
                },
            )
            .collect())
    }

    /// The peer answered about an open forward: it holds the task (and, when
    /// `running_on` is given, runs it there on that node).
    pub async fn forward_answered(
        &self,
        task_id: &str,
        attempt: u32,
        running_on: Option<&str>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let forward = "UPDATE forwards SET state = 'accepted', answered_ms = $3 \
                       WHERE task_id = $1 AND attempt = $2 AND state IN ('sending', 'accepted')";
        let running = "UPDATE tasks SET state = 'running', site_node = $3, updated_ms = $4 \
                       WHERE id = $1 AND attempt = $2 AND state IN ('assigned', 'running') \
                       AND site IS NOT NULL AND (state <> 'running' OR site_node IS NULL OR site_node <> $3)";
        let attempt_running = "UPDATE attempts SET state = 'running' \
                               WHERE task_id = $1 AND attempt = $2 AND state = 'assigned'";
        let started = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            sqlx::query(forward).bind(task_id).bind(i64::from(attempt)).bind(to_db(now_ms)).execute(&mut *tx).await?;
            let mut started = None;
            if let Some(node) = running_on {
                let changed = sqlx::query(running).bind(task_id).bind(i64::from(attempt)).bind(node).bind(to_db(now_ms)).execute(&mut *tx).await?.rows_affected();
                sqlx::query(attempt_running).bind(task_id).bind(i64::from(attempt)).execute(&mut *tx).await?;
                if changed == 1 {
                    let site: Option<(Option<String>,)> = sqlx::query_as("SELECT site FROM tasks WHERE id = $1")
                        .bind(task_id).fetch_optional(&mut *tx).await?;
                    started = site.and_then(|(site,)| site);
                }
            }
            tx.commit().await?;
            Ok::<Option<String>, sqlx::Error>(started)
        })?;
        if let Some(site) = started {
            self.announce(forwarded_change(
                task_id,
                TaskStatus::Running,
                attempt,
                &site,
                None,
                now_ms,
            ));
        }
        Ok(())
    }

    /// Records a forwarded attempt's result as the task's: once, and only
    /// while that forward is open and that attempt is the task's current
    /// one. True when recorded.
    pub async fn finish_forward(
        &self,
        task_id: &str,
        attempt: u32,
        result: &RemoteResult,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let close = "UPDATE forwards SET state = 'done', answered_ms = $3 \
                     WHERE task_id = $1 AND attempt = $2 AND state IN ('sending', 'accepted')";
        let task = "UPDATE tasks SET state = $3, site_node = COALESCE($4, site_node), output = $5, exit_code = $6, \
                    failure_reason = $7, failure_message = $8, updated_ms = $9 \
                    WHERE id = $1 AND attempt = $2 AND state IN ('assigned', 'running')";
        let attempt_row =
            "UPDATE attempts SET state = $3, finished_ms = $4 WHERE task_id = $1 AND attempt = $2";
        let event = "INSERT INTO events (task_id, attempt, state, node_id, site, received_ms, reason, message, exit_code, output_bytes) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (task_id, attempt, state) DO NOTHING";
        let state = result.status.as_str();
        let recorded = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let closed = sqlx::query(close).bind(task_id).bind(i64::from(attempt)).bind(to_db(now_ms))
                .execute(&mut *tx).await?.rows_affected();
            if closed != 1 {
                tx.rollback().await?;
                // `with_pool!` is inline code: this returns from the method.
                return Ok(false);
            }
            let mut site = String::new();
            let updated = sqlx::query(task)
                .bind(task_id)
                .bind(i64::from(attempt))
                .bind(state)
                .bind(result.node.as_deref())
                .bind(result.output.as_deref())
                .bind(result.exit_code.map(i64::from))
                .bind(result.failure_reason.as_deref())
                .bind(result.failure_message.as_deref())
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if updated == 1 {
                sqlx::query(attempt_row).bind(task_id).bind(i64::from(attempt)).bind(state).bind(to_db(now_ms))
                    .execute(&mut *tx).await?;
                let site_row: Option<(Option<String>,)> = sqlx::query_as("SELECT site FROM tasks WHERE id = $1")
                    .bind(task_id).fetch_optional(&mut *tx).await?;
                site = site_row.and_then(|(site,)| site).unwrap_or_default();
                sqlx::query(event)
                    .bind(task_id)
                    .bind(i64::from(attempt))
                    .bind(state)
                    .bind(result.node.as_deref())
                    .bind(&site)
                    .bind(to_db(now_ms))
                    .bind(result.failure_reason.as_deref())
                    .bind(result.failure_message.as_deref())
                    .bind(result.exit_code.map(i64::from))
                    .bind(to_db(result.output.as_ref().map_or(0, |o| o.len() as u64)))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<Option<String>, sqlx::Error>((updated == 1).then_some(site))
        })?;
        if let Some(site) = &recorded {
            self.announce(forwarded_change(
                task_id,
                result.status,
                attempt,
                site,
                result.failure_reason.clone(),
                now_ms,
            ));
        }
        Ok(recorded.is_some())
    }

    /// Takes a forwarded attempt back after its peer died or stopped
    /// answering: the forward is abandoned (a late answer from that peer is
    /// ignored from now on), the attempt is lost, and the task goes back to
    /// this site's queue, unless it was to be cancelled or has no attempts left.
    pub async fn take_back_forward(
        &self,
        task_id: &str,
        attempt: u32,
        reason: &str,
        max_attempts: u32,
        now_ms: u64,
    ) -> Result<TakenBack, StoreError> {
        let abandon = "UPDATE forwards SET state = 'abandoned', reason = $3, answered_ms = $4 \
                       WHERE task_id = $1 AND attempt = $2 AND state IN ('sending', 'accepted')";
        let select =
            "SELECT state, cancel_requested, site FROM tasks WHERE id = $1 AND attempt = $2";
        let lose = "UPDATE attempts SET state = 'lost', finished_ms = $3 WHERE task_id = $1 AND attempt = $2";
        let event = "INSERT INTO events (task_id, attempt, state, node_id, site, received_ms, message, output_bytes) \
                     VALUES ($1, $2, 'lost', NULL, $3, $4, $5, 0) ON CONFLICT (task_id, attempt, state) DO NOTHING";
        let requeue = "UPDATE tasks SET state = 'pending', site = NULL, site_node = NULL, updated_ms = $2 WHERE id = $1";
        let cancel = "UPDATE tasks SET state = 'cancelled', updated_ms = $2 WHERE id = $1";
        let give_up = "UPDATE tasks SET state = 'failed', failure_reason = 'node_lost', failure_message = $3, \
                       updated_ms = $2 WHERE id = $1";
        let fence = self.fence()?;
        let outcome = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            check_term!(tx, fence);
            let abandoned = sqlx::query(abandon).bind(task_id).bind(i64::from(attempt)).bind(reason)
                .bind(to_db(now_ms)).execute(&mut *tx).await?.rows_affected();
            if abandoned != 1 {
                tx.rollback().await?;
                return Ok(TakenBack::AlreadyEnded);
            }
            let row: Option<(String, i64, Option<String>)> =
                sqlx::query_as(select).bind(task_id).bind(i64::from(attempt)).fetch_optional(&mut *tx).await?;
            let Some((state, cancel_requested, site)) = row else {
                tx.commit().await?;
                return Ok(TakenBack::AlreadyEnded);
            };
            let status = TaskStatus::from_str(&state).map_err(|e| corrupt("tasks.state", e))?;
            if !status.is_in_flight() {
                tx.commit().await?;
                return Ok(TakenBack::AlreadyEnded);
            }
            let site = site.unwrap_or_default();
            sqlx::query(lose).bind(task_id).bind(i64::from(attempt)).bind(to_db(now_ms)).execute(&mut *tx).await?;
            sqlx::query(event).bind(task_id).bind(i64::from(attempt)).bind(&site)
                .bind(to_db(now_ms)).bind(reason).execute(&mut *tx).await?;
            let outcome = if cancel_requested != 0 {
                sqlx::query(cancel).bind(task_id).bind(to_db(now_ms)).execute(&mut *tx).await?;
                TakenBack::Cancelled
            } else if attempt < max_attempts {
                sqlx::query(requeue).bind(task_id).bind(to_db(now_ms)).execute(&mut *tx).await?;
                TakenBack::Requeued
            } else {
                let message = format!("forwarded to site {site}, which {reason}; no attempts left (limit {max_attempts})");
                sqlx::query(give_up).bind(task_id).bind(to_db(now_ms)).bind(message).execute(&mut *tx).await?;
                TakenBack::Failed
            };
            tx.commit().await?;
            Ok::<TakenBack, StoreError>(outcome)
        })?;
        let status = match outcome {
            TakenBack::Requeued => Some(TaskStatus::Pending),
            TakenBack::Cancelled => Some(TaskStatus::Cancelled),
            TakenBack::Failed => Some(TaskStatus::Failed),
            TakenBack::AlreadyEnded => None,
        };
        if let Some(status) = status {
            let reason = (status == TaskStatus::Failed).then(|| "node_lost".to_owned());
            self.announce(TaskChange {
                reason,
                ..crate::live::task_change(task_id, status, attempt, None, now_ms)
            });
        }
        Ok(outcome)
    }

    /// Sites a task was forwarded to and taken back from: not to be tried
    /// again for it.
    pub async fn abandoned_sites(&self, task_id: &str) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT DISTINCT site FROM forwards WHERE task_id = $1 AND state = 'abandoned'";
        let rows: Vec<(String,)> =
            with_pool!(self, pool => sqlx::query_as(sql).bind(task_id).fetch_all(pool).await)?;
        Ok(rows.into_iter().map(|(site,)| site).collect())
    }

    /// Stores a task another site forwarded here, once: a repeated forward of
    /// the same origin task finds the first one. Returns the local task's id
    /// and whether it was created now.
    pub async fn insert_forwarded_task(
        &self,
        task: &NewTask,
        origin_site: &str,
        origin_task: &str,
    ) -> Result<(String, bool), StoreError> {
        if let Some(existing) = self.task_by_origin(origin_site, origin_task).await? {
            return Ok((existing.spec.id, false));
        }
        if self
            .insert_task_from(task, Some((origin_site, origin_task)))
            .await?
        {
            return Ok((task.id.clone(), true));
        }
        // Another request for the same origin task won the race.
        let existing = self
            .task_by_origin(origin_site, origin_task)
            .await?
            .ok_or_else(|| corrupt("tasks.origin_task", "a forwarded task vanished"))?;
        Ok((existing.spec.id, false))
    }

    /// The task forwarded here as `origin_task` of `origin_site`.
    pub async fn task_by_origin(
        &self,
        origin_site: &str,
        origin_task: &str,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let sql = format!(
            "SELECT {} FROM tasks WHERE origin_site = $1 AND origin_task = $2",
            crate::store::TASK_COLUMNS
        );
        let row: Option<crate::store::TaskRow> = with_pool!(self, pool => sqlx::query_as(&sql)
            .bind(origin_site)
            .bind(origin_task)
            .fetch_optional(pool)
            .await)?;
        row.map(crate::store::TaskRow::into_record).transpose()
    }

    /// Digests of the artifacts used most recently, for the site digest.
    pub async fn recent_artifacts(&self, limit: u32) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT digest FROM artifacts ORDER BY created_ms DESC LIMIT $1";
        let rows: Vec<(String,)> = with_pool!(self, pool => sqlx::query_as(sql).bind(i64::from(limit)).fetch_all(pool).await)?;
        Ok(rows.into_iter().map(|(digest,)| digest).collect())
    }
}

/// A change of a task whose attempt runs at another site.
fn forwarded_change(
    task_id: &str,
    status: TaskStatus,
    attempt: u32,
    site: &str,
    reason: Option<String>,
    now_ms: u64,
) -> TaskChange {
    TaskChange {
        site: Some(site.to_owned()),
        reason,
        ..crate::live::task_change(task_id, status, attempt, None, now_ms)
    }
}
