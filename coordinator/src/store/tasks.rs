//! The `tasks` table: submission, listing, the placement queue, assignment
//! (with its `attempts` and `outbox` rows), holds, requeues after a node was
//! lost, and cancels.

use std::str::FromStr;

use starling_proto::{Digest, Runtime};

use super::placements::Placement;
use super::{
    check_term, corrupt, from_db, to_db, with_pool, Backend, Store, StoreError, TaskRow,
    TASK_COLUMNS,
};
use crate::live::task_change;
use crate::task::{TaskDemand, TaskKind, TaskLimits, TaskStatus};
use starling_api::TaskChange;

/// A task as submitted, before the coordinator stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    /// The task's id.
    pub id: String,
    /// The module to run.
    pub artifact: Digest,
    /// The runtime that runs it.
    pub runtime: Runtime,
    /// Bytes given to the task on stdin.
    pub input: Vec<u8>,
    /// Arguments.
    pub args: Vec<String>,
    /// The task's dominant resource.
    pub class: TaskKind,
    /// Resources it needs.
    pub demand: TaskDemand,
    /// Limits the agent enforces.
    pub limits: TaskLimits,
    /// Estimated work, in seconds on one reference core.
    pub work_seconds: f64,
    /// Higher is more urgent.
    pub priority: u8,
    /// Absolute deadline, Unix milliseconds.
    pub deadline_unix_ms: Option<u64>,
    /// When it was submitted, Unix milliseconds.
    pub created_ms: u64,
}

/// A stored task with its current state.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    /// The submission.
    pub spec: NewTask,
    /// Its state.
    pub status: TaskStatus,
    /// When it last changed, Unix milliseconds.
    pub updated_ms: u64,
    /// The node of the current (or last) attempt.
    pub node_id: Option<String>,
    /// The current attempt number; 0 before the first assignment.
    pub attempt: u32,
    /// The power level chosen for the current attempt.
    pub power_level: Option<u8>,
    /// Output of a successful attempt.
    pub output: Option<Vec<u8>>,
    /// Exit code of the module, when it exited.
    pub exit_code: Option<i32>,
    /// Failure code, for failed tasks.
    pub failure_reason: Option<String>,
    /// Failure message for people.
    pub failure_message: Option<String>,
    /// The latest placement explanation, as JSON.
    pub explanation: Option<serde_json::Value>,
    /// Whether a cancel was requested while an attempt ran.
    pub cancel_requested: bool,
    /// The site the current attempt was forwarded to; `None` when it runs here.
    pub site: Option<String>,
    /// The node at that site that ran it, as the site reported.
    pub site_node: Option<String>,
    /// For a task forwarded here: the site it came from and its id there.
    pub origin: Option<(String, String)>,
}

#[cfg(test)]
impl TaskRecord {
    /// A task as unit tests start from: wasm, no input, default demand and
    /// limits, 0.1 s of work, pending and never placed, created at 1 ms.
    pub(crate) fn sample(id: &str) -> Self {
        Self {
            spec: NewTask {
                id: id.to_string(),
                artifact: Digest([7; 32]),
                runtime: Runtime::Wasm,
                input: Vec::new(),
                args: Vec::new(),
                class: TaskKind::Cpu,
                demand: TaskDemand::default(),
                limits: TaskLimits::default(),
                work_seconds: 0.1,
                priority: 0,
                deadline_unix_ms: None,
                created_ms: 1,
            },
            status: TaskStatus::Pending,
            updated_ms: 1,
            node_id: None,
            attempt: 0,
            power_level: None,
            output: None,
            exit_code: None,
            failure_reason: None,
            failure_message: None,
            explanation: None,
            cancel_requested: false,
            site: None,
            site_node: None,
            origin: None,
        }
    }
}

/// What a cancel request did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The task was pending and is now cancelled.
    Cancelled,
    /// An attempt runs on a node: the caller must send it a `Cancel`.
    SendCancel {
        /// The node running it.
        node_id: String,
        /// The attempt to stop.
        attempt: u32,
    },
    /// The task runs at another site: the forwarder passes the cancel on.
    Forwarded,
    /// The task had already ended in this state.
    AlreadyEnded(TaskStatus),
    /// No task has this id.
    NotFound,
}

/// A task put back in the queue or given up on after its node went offline.
#[derive(Debug, Clone, PartialEq)]
pub struct LostTask {
    /// The task.
    pub task_id: String,
    /// The attempt that was lost.
    pub attempt: u32,
    /// `Pending` when it will be retried, `Failed` when its attempts ran out,
    /// `Cancelled` when a cancel was requested.
    pub status: TaskStatus,
}

/// An attempt in flight on a node of this site, with what the attempt
/// rules (`domain::attempts`) look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightAttempt {
    /// The task.
    pub task_id: String,
    /// Its current attempt.
    pub attempt: u32,
    /// The node it was given to.
    pub node_id: String,
    /// When it was assigned, Unix ms.
    pub assigned_ms: u64,
    /// When its `running` event arrived, Unix ms.
    pub running_since_ms: Option<u64>,
    /// The task's wall-time limit, ms.
    pub wall_ms: u64,
    /// Whether the node sent any event for this attempt.
    pub answered: bool,
}

/// Inserts one new task; a task forwarded from the same origin twice is
/// inserted once (`$13`, `$14`: the origin site and task, NULL for a task
/// submitted here, which never conflict). `$15`: who submitted it (the
/// sha256 of its API token; '' for none and for forwarded tasks).
const INSERT_TASK: &str =
    "INSERT INTO tasks (id, artifact, runtime, input, args, class, demand, limits, \
     work_seconds, priority, deadline_unix_ms, created_ms, updated_ms, state, attempt, \
     cancel_requested, origin_site, origin_task, submitter) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, 'pending', 0, 0, $13, $14, $15) \
     ON CONFLICT (origin_site, origin_task) DO NOTHING";

/// A submitter's pending tasks: what its quota bounds.
const COUNT_PENDING_OF: &str =
    "SELECT COUNT(*) FROM tasks WHERE submitter = $1 AND state = 'pending'";

/// On PostgreSQL, one quota-checked submission of a submitter at a time
/// (until the transaction ends): two concurrent ones would each count
/// without the other's uncommitted rows and both pass. SQLite needs none:
/// the inserts take its one write lock before the count.
const LOCK_SUBMITTER_PG: &str = "SELECT pg_advisory_xact_lock(hashtext($1))";

/// Whether a quota-checked submission was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// All of its tasks are stored, pending.
    Stored,
    /// None is: with them its submitter would have more pending tasks than
    /// its quota. `pending`: how many it has without them.
    OverQuota {
        /// The submitter's pending tasks before this submission.
        pending: u64,
    },
}

/// The JSON columns of a new task's row.
struct TaskJson {
    args: String,
    demand: String,
    limits: String,
}

impl TaskJson {
    fn of(task: &NewTask) -> Result<TaskJson, StoreError> {
        Ok(TaskJson {
            args: serde_json::to_string(&task.args).map_err(|e| corrupt("tasks.args", e))?,
            demand: serde_json::to_string(&task.demand).map_err(|e| corrupt("tasks.demand", e))?,
            limits: serde_json::to_string(&task.limits).map_err(|e| corrupt("tasks.limits", e))?,
        })
    }
}

/// Binds [`INSERT_TASK`]'s parameters: written once, expanded inside each
/// backend's arm of `with_pool!` (the query types differ by backend).
macro_rules! bind_new_task {
    ($query:expr, $task:expr, $json:expr, $origin:expr, $submitter:expr) => {
        $query
            .bind(&$task.id)
            .bind($task.artifact.to_hex())
            .bind($task.runtime.as_str())
            .bind(&$task.input)
            .bind(&$json.args)
            .bind($task.class.as_str())
            .bind(&$json.demand)
            .bind(&$json.limits)
            .bind($task.work_seconds)
            .bind(i64::from($task.priority))
            .bind($task.deadline_unix_ms.map(to_db))
            .bind(to_db($task.created_ms))
            .bind($origin.map(|(site, _)| site))
            .bind($origin.map(|(_, id)| id))
            .bind($submitter)
    };
}

impl Store {
    /// Stores a new task in state `pending`.
    pub async fn insert_task(&self, task: &NewTask) -> Result<(), StoreError> {
        self.insert_task_from(task, None).await.map(|_| ())
    }

    /// Stores a new task in state `pending`, with the site and task it was
    /// forwarded from, if any; false when a task from that same origin is
    /// already stored (and nothing was inserted).
    pub(crate) async fn insert_task_from(
        &self,
        task: &NewTask,
        origin: Option<(&str, &str)>,
    ) -> Result<bool, StoreError> {
        let json = TaskJson::of(task)?;
        let inserted = with_pool!(self, pool => bind_new_task!(sqlx::query(INSERT_TASK), task, json, origin, "")
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        if inserted == 1 {
            self.announce(task_change(
                &task.id,
                TaskStatus::Pending,
                0,
                None,
                task.created_ms,
            ));
        }
        Ok(inserted == 1)
    }

    /// Stores new tasks in state `pending` in one transaction (one commit,
    /// one fsync on SQLite): all of them or, on an error, none. Each is
    /// announced on the live feed after the commit, in the given order.
    pub async fn insert_tasks(&self, tasks: &[NewTask]) -> Result<(), StoreError> {
        self.insert_tasks_as(tasks, "", None).await.map(|_| ())
    }

    /// Stores new tasks as [`Store::insert_tasks`] does, as `submitter`'s:
    /// with a `pending_quota`, only if the submitter then has at most that
    /// many pending tasks; otherwise none is stored
    /// ([`Admission::OverQuota`]). The count and the inserts are one
    /// transaction, so concurrent submissions of one submitter cannot pass
    /// it together.
    pub async fn insert_tasks_as(
        &self,
        tasks: &[NewTask],
        submitter: &str,
        pending_quota: Option<u64>,
    ) -> Result<Admission, StoreError> {
        let json = tasks
            .iter()
            .map(TaskJson::of)
            .collect::<Result<Vec<_>, _>>()?;
        let origin: Option<(&str, &str)> = None;
        let postgres = self.is_shared();
        let admission = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            if postgres && pending_quota.is_some() {
                sqlx::query(LOCK_SUBMITTER_PG).bind(submitter).execute(&mut *tx).await?;
            }
            // The inserts first: on SQLite they take the write lock the
            // count then holds.
            for (task, json) in tasks.iter().zip(&json) {
                bind_new_task!(sqlx::query(INSERT_TASK), task, json, origin, submitter)
                    .execute(&mut *tx)
                    .await?;
            }
            let over = match pending_quota {
                Some(quota) => {
                    let (pending,): (i64,) = sqlx::query_as(COUNT_PENDING_OF)
                        .bind(submitter)
                        .fetch_one(&mut *tx)
                        .await?;
                    let pending = u64::try_from(pending).unwrap_or(0);
                    (pending > quota).then(|| pending.saturating_sub(tasks.len() as u64))
                }
                None => None,
            };
            match over {
                Some(pending) => {
                    tx.rollback().await?;
                    Ok::<_, sqlx::Error>(Admission::OverQuota { pending })
                }
                None => {
                    tx.commit().await?;
                    Ok(Admission::Stored)
                }
            }
        })?;
        if admission == Admission::Stored {
            for task in tasks {
                self.announce(task_change(
                    &task.id,
                    TaskStatus::Pending,
                    0,
                    None,
                    task.created_ms,
                ));
            }
        }
        Ok(admission)
    }

    /// One task, if it exists.
    pub async fn task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1");
        let row: Option<TaskRow> = with_pool!(self, pool => sqlx::query_as(&sql)
            .bind(id)
            .fetch_optional(pool)
            .await)?;
        row.map(TaskRow::into_record).transpose()
    }

    /// Tasks, newest first, optionally only those in one state.
    pub async fn list_tasks(
        &self,
        status: Option<TaskStatus>,
        limit: u32,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE ($1 IS NULL OR state = $1) \
             ORDER BY created_ms DESC, id DESC LIMIT $2"
        );
        let rows: Vec<TaskRow> = with_pool!(self, pool => sqlx::query_as(&sql)
            .bind(status.map(TaskStatus::as_str))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await)?;
        rows.into_iter().map(TaskRow::into_record).collect()
    }

    /// Pending tasks, oldest first: the placement engine's queue.
    pub async fn pending_tasks(&self, limit: u32) -> Result<Vec<TaskRecord>, StoreError> {
        self.tasks_in_states(
            "state = 'pending'",
            "ORDER BY created_ms ASC, id ASC",
            limit,
        )
        .await
    }

    /// Pending tasks, oldest first, after `after` (the `created_ms` and id
    /// of the last one a previous call returned), leaving out those parked
    /// on the fleet whose fingerprint is `fleet`: the scheduler's queue,
    /// read a window at a time.
    pub async fn schedulable_tasks(
        &self,
        limit: u32,
        fleet: i64,
        after: Option<(u64, &str)>,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let (after_ms, after_id) = after.map_or((-1, ""), |(ms, id)| (to_db(ms), id));
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE state = 'pending' \
             AND (parked_fleet IS NULL OR parked_fleet <> $2) \
             AND (created_ms > $3 OR (created_ms = $3 AND id > $4)) \
             ORDER BY created_ms ASC, id ASC LIMIT $1"
        );
        let rows: Vec<TaskRow> = with_pool!(self, pool => sqlx::query_as(&sql)
            .bind(i64::from(limit))
            .bind(fleet)
            .bind(after_ms)
            .bind(after_id)
            .fetch_all(pool)
            .await)?;
        rows.into_iter().map(TaskRow::into_record).collect()
    }

    /// Parks pending tasks no online node could take on the fleet whose
    /// fingerprint is `fleet`, each with the explanation of why (what its
    /// detail shows), in one transaction. A task no longer pending is left.
    pub async fn park_tasks(
        &self,
        tasks: &[(String, serde_json::Value)],
        fleet: i64,
    ) -> Result<(), StoreError> {
        if tasks.is_empty() {
            return Ok(());
        }
        let sql = "UPDATE tasks SET parked_fleet = $2, explanation = $3 \
                   WHERE id = $1 AND state = 'pending'";
        with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            for (id, explanation) in tasks {
                sqlx::query(sql)
                    .bind(id)
                    .bind(fleet)
                    .bind(explanation.to_string())
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        })?;
        Ok(())
    }

    /// Tasks with an attempt out on a node.
    pub async fn in_flight_tasks(&self, limit: u32) -> Result<Vec<TaskRecord>, StoreError> {
        self.tasks_in_states(
            "state IN ('assigned', 'running')",
            "ORDER BY created_ms ASC, id ASC",
            limit,
        )
        .await
    }

    async fn tasks_in_states(
        &self,
        condition: &str,
        order: &str,
        limit: u32,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE {condition} {order} LIMIT $1");
        let rows: Vec<TaskRow> = with_pool!(self, pool => sqlx::query_as(&sql)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await)?;
        rows.into_iter().map(TaskRow::into_record).collect()
    }

    /// How many tasks are in each state (states with none are absent).
    pub async fn task_counts(&self) -> Result<Vec<(TaskStatus, u64)>, StoreError> {
        let sql = "SELECT state, COUNT(*) FROM tasks GROUP BY state";
        let rows: Vec<(String, i64)> =
            with_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)?;
        rows.into_iter()
            .map(|(state, count)| {
                let status = TaskStatus::from_str(&state).map_err(|e| corrupt("tasks.state", e))?;
                Ok((status, from_db(count)))
            })
            .collect()
    }

    /// The nodes that have an attempt in flight (tasks `assigned` or `running`).
    pub async fn in_flight_nodes(&self) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT DISTINCT node_id FROM tasks \
                   WHERE state IN ('assigned', 'running') AND node_id IS NOT NULL";
        let rows: Vec<(String,)> =
            with_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)?;
        Ok(rows.into_iter().map(|(node,)| node).collect())
    }

    /// Records a placement: the pending task gets attempt `attempt` on `node_id`,
    /// and the assignment enters the outbox (due now, never sent) in the same
    /// transaction. Returns false (and changes nothing) when the task is no longer pending at
    /// the expected attempt, for instance because it was cancelled meanwhile.
    /// One of [`Store::assign_tasks`]; the scheduler places a round at once.
    pub async fn assign_task(
        &self,
        task_id: &str,
        attempt: u32,
        node_id: &str,
        power_level: u8,
        explanation: &serde_json::Value,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let placement = Placement {
            task_id: task_id.to_owned(),
            attempt,
            node_id: node_id.to_owned(),
            power_level,
            explanation: explanation.clone(),
        };
        let placed = self.assign_tasks(&[placement], now_ms, None).await?;
        Ok(placed.assigned.first().copied().unwrap_or(false))
    }

    /// Records why a pending task stays pending (the policy held it), unless
    /// the same explanation is already stored.
    pub async fn hold_task(
        &self,
        task_id: &str,
        explanation: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE tasks SET explanation = $2 WHERE id = $1 AND state = 'pending' \
                   AND (explanation IS NULL OR explanation <> $2)";
        let text = explanation.to_string();
        with_pool!(self, pool => sqlx::query(sql).bind(task_id).bind(&text).execute(pool).await.map(|_| ()))?;
        Ok(())
    }

    /// Handles a node gone offline (its last will, or silence past the node
    /// timeout): each of its in-flight attempts is marked lost and leaves the
    /// outbox; the task goes back to `pending` for a new attempt, or to `failed`
    /// (reason `node_lost`) once `max_attempts` attempts were made, or to
    /// `cancelled` when a cancel was pending.
    pub async fn requeue_node_tasks(
        &self,
        node_id: &str,
        max_attempts: u32,
        now_ms: u64,
    ) -> Result<Vec<LostTask>, StoreError> {
        let mark_attempts = "UPDATE attempts SET state = 'lost', finished_ms = $2 \
                             WHERE node_id = $1 AND state IN ('assigned', 'accepted', 'running')";
        let select = "SELECT id, attempt, cancel_requested FROM tasks \
                      WHERE node_id = $1 AND state IN ('assigned', 'running')";
        let insert_event = "INSERT INTO events (task_id, attempt, state, node_id, received_ms, output_bytes) \
                            VALUES ($1, $2, 'lost', $3, $4, 0) ON CONFLICT (task_id, attempt, state) DO NOTHING";
        let retry = "UPDATE tasks SET state = 'pending', node_id = NULL, power_level = NULL, updated_ms = $2 \
                     WHERE id = $1";
        let cancel = "UPDATE tasks SET state = 'cancelled', updated_ms = $2 WHERE id = $1";
        let give_up = "UPDATE tasks SET state = 'failed', failure_reason = 'node_lost', failure_message = $3, \
                       updated_ms = $2 WHERE id = $1";
        let clear_outbox = "DELETE FROM outbox WHERE task_id = $1";
        let fence = self.fence()?;
        let lost = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            check_term!(tx, fence);
            sqlx::query(mark_attempts).bind(node_id).bind(to_db(now_ms)).execute(&mut *tx).await?;
            let rows: Vec<(String, i64, i64)> =
                sqlx::query_as(select).bind(node_id).fetch_all(&mut *tx).await?;
            let mut lost = Vec::with_capacity(rows.len());
            for (task_id, attempt, cancel_requested) in rows {
                let attempt = u32::try_from(attempt).unwrap_or(0);
                sqlx::query(insert_event)
                    .bind(&task_id)
                    .bind(i64::from(attempt))
                    .bind(node_id)
                    .bind(to_db(now_ms))
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(clear_outbox).bind(&task_id).execute(&mut *tx).await?;
                let status = if cancel_requested != 0 {
                    // Its submitter wanted it stopped; the node is gone, so it is.
                    sqlx::query(cancel).bind(&task_id).bind(to_db(now_ms)).execute(&mut *tx).await?;
                    TaskStatus::Cancelled
                } else if attempt < max_attempts {
                    sqlx::query(retry).bind(&task_id).bind(to_db(now_ms)).execute(&mut *tx).await?;
                    TaskStatus::Pending
                } else {
                    let message = format!(
                        "node {node_id} went offline during attempt {attempt}; no attempts left (limit {max_attempts})"
                    );
                    sqlx::query(give_up)
                        .bind(&task_id)
                        .bind(to_db(now_ms))
                        .bind(message)
                        .execute(&mut *tx)
                        .await?;
                    TaskStatus::Failed
                };
                lost.push(LostTask { task_id, attempt, status });
            }
            tx.commit().await?;
            Ok::<Vec<LostTask>, sqlx::Error>(lost)
        })?;
        for task in &lost {
            self.announce(lost_change(task, node_id, "node_lost", now_ms));
        }
        Ok(lost)
    }

    /// Up to `limit` attempts in flight on nodes of this site (forwarded ones
    /// excluded), oldest task first.
    pub async fn in_flight_attempts(&self, limit: u32) -> Result<Vec<InFlightAttempt>, StoreError> {
        let sql = "SELECT t.id, t.attempt, t.node_id, a.assigned_ms, e.received_ms, t.limits, \
                   EXISTS (SELECT 1 FROM events any_event \
                           WHERE any_event.task_id = t.id AND any_event.attempt = t.attempt) \
                   FROM tasks t \
                   JOIN attempts a ON a.task_id = t.id AND a.attempt = t.attempt \
                   LEFT JOIN events e ON e.task_id = t.id AND e.attempt = t.attempt AND e.state = 'running' \
                   WHERE t.state IN ('assigned', 'running') AND t.node_id IS NOT NULL \
                   ORDER BY t.created_ms ASC, t.id ASC LIMIT $1";
        type Row = (String, i64, String, i64, Option<i64>, String, bool);
        let rows: Vec<Row> = with_pool!(self, pool => sqlx::query_as(sql)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await)?;
        rows.into_iter()
            .map(
                |(task_id, attempt, node_id, assigned_ms, running_ms, limits, answered)| {
                    let limits: TaskLimits =
                        serde_json::from_str(&limits).map_err(|e| corrupt("tasks.limits", e))?;
                    Ok(InFlightAttempt {
                        task_id,
                        attempt: u32::try_from(attempt).unwrap_or(0),
                        node_id,
                        assigned_ms: from_db(assigned_ms),
                        running_since_ms: running_ms.map(from_db),
                        wall_ms: limits.wall_ms,
                        answered,
                    })
                },
            )
            .collect()
    }

    /// Ends one attempt the coordinator gave up on (`domain::attempts`): if
    /// it is still the task's current attempt on `node_id`, it is marked
    /// lost and leaves the outbox, and the task goes back to `pending` for a
    /// new attempt, or to `failed` with `reason` once `max_attempts` were
    /// made, or to `cancelled` when a cancel was pending. Returns `None`
    /// when the attempt had moved on meanwhile (nothing changes then).
    pub async fn end_attempt(
        &self,
        task_id: &str,
        attempt: u32,
        node_id: &str,
        reason: &str,
        max_attempts: u32,
        now_ms: u64,
    ) -> Result<Option<LostTask>, StoreError> {
        let select = "SELECT cancel_requested FROM tasks \
                      WHERE id = $1 AND attempt = $2 AND node_id = $3 AND state IN ('assigned', 'running')";
        let mark_attempt = "UPDATE attempts SET state = 'lost', finished_ms = $3 \
                            WHERE task_id = $1 AND attempt = $2";
        let insert_event = "INSERT INTO events (task_id, attempt, state, node_id, received_ms, output_bytes) \
                            VALUES ($1, $2, 'lost', $3, $4, 0) ON CONFLICT (task_id, attempt, state) DO NOTHING";
        let retry = "UPDATE tasks SET state = 'pending', node_id = NULL, power_level = NULL, updated_ms = $2 \
                     WHERE id = $1";
        let cancel = "UPDATE tasks SET state = 'cancelled', updated_ms = $2 WHERE id = $1";
        let give_up =
            "UPDATE tasks SET state = 'failed', failure_reason = $3, failure_message = $4, \
                       updated_ms = $2 WHERE id = $1";
        let clear_outbox = "DELETE FROM outbox WHERE task_id = $1";
        let fence = self.fence()?;
        let ended = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            check_term!(tx, fence);
            let row: Option<(i64,)> = sqlx::query_as(select)
                .bind(task_id)
                .bind(i64::from(attempt))
                .bind(node_id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((cancel_requested,)) = row else {
                tx.rollback().await?;
                return Ok(None);
            };
            sqlx::query(mark_attempt)
                .bind(task_id)
                .bind(i64::from(attempt))
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await?;
            sqlx::query(insert_event)
                .bind(task_id)
                .bind(i64::from(attempt))
                .bind(node_id)
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await?;
            sqlx::query(clear_outbox).bind(task_id).execute(&mut *tx).await?;
            let status = if cancel_requested != 0 {
                sqlx::query(cancel).bind(task_id).bind(to_db(now_ms)).execute(&mut *tx).await?;
                TaskStatus::Cancelled
            } else if attempt < max_attempts {
                sqlx::query(retry).bind(task_id).bind(to_db(now_ms)).execute(&mut *tx).await?;
                TaskStatus::Pending
            } else {
                let message = format!(
                    "the coordinator ended attempt {attempt} on node {node_id} ({reason}); \
                     no attempts left (limit {max_attempts})"
                );
                sqlx::query(give_up)
                    .bind(task_id)
                    .bind(to_db(now_ms))
                    .bind(reason)
                    .bind(message)
                    .execute(&mut *tx)
                    .await?;
                TaskStatus::Failed
            };
            tx.commit().await?;
            Ok::<Option<LostTask>, sqlx::Error>(Some(LostTask {
                task_id: task_id.to_owned(),
                attempt,
                status,
            }))
        })?;
        if let Some(task) = &ended {
            self.announce(lost_change(task, node_id, reason, now_ms));
        }
        Ok(ended)
    }

    /// Cancels a pending task at once, or marks a running one so the caller
    /// sends its node a `Cancel`.
    pub async fn request_cancel(
        &self,
        task_id: &str,
        now_ms: u64,
    ) -> Result<CancelOutcome, StoreError> {
        let cancel_pending =
            "UPDATE tasks SET state = 'cancelled', updated_ms = $2, cancel_requested = 1 \
                              WHERE id = $1 AND state = 'pending'";
        let mark_running = "UPDATE tasks SET cancel_requested = 1, updated_ms = $2 \
                            WHERE id = $1 AND state IN ('assigned', 'running')";
        let select = "SELECT state, node_id, attempt FROM tasks WHERE id = $1";
        // The node gets a Cancel instead; re-sending the assignment could only
        // start work that is to be stopped.
        let clear_outbox = "DELETE FROM outbox WHERE task_id = $1";
        let outcome = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let cancelled = sqlx::query(cancel_pending)
                .bind(task_id)
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if cancelled == 1 {
                sqlx::query(clear_outbox).bind(task_id).execute(&mut *tx).await?;
                tx.commit().await?;
                self.announce(task_change(task_id, TaskStatus::Cancelled, 0, None, now_ms));
                return Ok(CancelOutcome::Cancelled);
            }
            let marked = sqlx::query(mark_running)
                .bind(task_id)
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if marked == 1 {
                sqlx::query(clear_outbox).bind(task_id).execute(&mut *tx).await?;
            }
            let row: Option<(String, Option<String>, i64)> =
                sqlx::query_as(select).bind(task_id).fetch_optional(&mut *tx).await?;
            tx.commit().await?;
            let Some((state, node_id, attempt)) = row else {
                return Ok(CancelOutcome::NotFound);
            };
            let status = TaskStatus::from_str(&state).map_err(|e| corrupt("tasks.state", e))?;
            match (marked, node_id) {
                (1, Some(node_id)) => Ok(CancelOutcome::SendCancel {
                    node_id,
                    attempt: u32::try_from(attempt).unwrap_or(0),
                }),
                // In flight with no local node: forwarded to another site.
                (1, None) => Ok(CancelOutcome::Forwarded),
                _ => Ok::<CancelOutcome, StoreError>(CancelOutcome::AlreadyEnded(status)),
            }
        })?;
        Ok(outcome)
    }
}

/// The change a lost attempt made: back in the queue (no node), or ended on
/// the node that lost it (with `reason` when it failed).
fn lost_change(task: &LostTask, node_id: &str, reason: &str, now_ms: u64) -> TaskChange {
    let node = (task.status != TaskStatus::Pending).then_some(node_id);
    TaskChange {
        reason: (task.status == TaskStatus::Failed).then(|| reason.to_owned()),
        ..task_change(&task.task_id, task.status, task.attempt, node, now_ms)
    }
}
