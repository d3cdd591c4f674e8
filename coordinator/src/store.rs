//! Durable state: artifacts (content-addressed by sha256), tasks, attempts and
//! events, in SQLite (the default) or PostgreSQL through sqlx.
//!
//! Both backends run the same migrations and the same query text: the schema
//! sticks to portable SQL and every query is written once with `$n`
//! placeholders, then expanded for each pool by [`with_pool!`]. Every
//! read-modify-write starts with a write so that SQLite takes its write lock
//! first (a deferred transaction that reads and then writes can fail with
//! `SQLITE_BUSY` when another writer got there in between).

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::Connection as _;
use starling_proto::{Digest, PublisherSignature, Runtime, TaskEvent, TaskState};

use crate::task::{TaskDemand, TaskKind, TaskLimits, TaskStatus};

/// The migrations, shared by both backends.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How long a connection attempt may take before opening the store fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs one expression against whichever pool the store holds. The expression
/// is written once and compiled once per backend, so query text never diverges.
macro_rules! with_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.backend {
            Backend::Sqlite($pool) => $body,
            Backend::Postgres($pool) => $body,
        }
    };
}
// Other `impl Store` blocks of the crate (access_store.rs) share the one query text rule.
pub(crate) use with_pool;

#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The coordinator's database.
#[derive(Debug, Clone)]
pub struct Store {
    pub(crate) backend: Backend,
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenStoreError {
    /// The URL names no supported database.
    #[error("database URL {url:?} is not supported; pass --db sqlite://PATH or --db postgres://USER@HOST/DB")]
    UnsupportedUrl {
        /// The URL given.
        url: String,
    },
    /// The database could not be opened or reached.
    #[error("cannot open database {url}: {source}; check that it exists and is reachable, or pass another --db")]
    Connect {
        /// The URL given, without its password.
        url: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The schema could not be brought up to date.
    #[error("cannot migrate database {url}: {source}")]
    Migrate {
        /// The URL given, without its password.
        url: String,
        /// The migrator's error.
        #[source]
        source: sqlx::migrate::MigrateError,
    },
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed the query.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A row holds a value this build cannot read (a corrupt or newer database).
    #[error("database holds an unreadable value in {column}: {detail}")]
    Corrupt {
        /// The column.
        column: &'static str,
        /// What was wrong.
        detail: String,
    },
}

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

/// One stored task event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventRecord {
    /// Attempt number.
    pub attempt: u32,
    /// Event state (`accepted`, `running`, `succeeded`, `failed`, `cancelled`, `rejected` when the
    /// agent refused the assignment, or `lost` when the node vanished).
    pub state: String,
    /// The node that sent it.
    pub node_id: String,
    /// When the coordinator received it, Unix milliseconds.
    pub received_ms: u64,
    /// Failure code.
    pub reason: Option<String>,
    /// Failure message.
    pub message: Option<String>,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Size of the output carried.
    pub output_bytes: u64,
    /// Execution measurements, as the agent sent them.
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<serde_json::Value>,
}

/// One attempt of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AttemptRecord {
    /// Attempt number, from 1.
    pub attempt: u32,
    /// The node it was sent to.
    pub node_id: String,
    /// The power level chosen.
    pub power_level: u8,
    /// When it was assigned, Unix milliseconds.
    pub assigned_ms: u64,
    /// Its state (`assigned`, `running`, `succeeded`, `failed`, `cancelled`, `lost`).
    pub state: String,
    /// When it ended, Unix milliseconds.
    pub finished_ms: Option<u64>,
}

/// What recording an agent's event did.
#[derive(Debug, Clone, PartialEq)]
pub enum EventOutcome {
    /// The event was new; the task is now in this state.
    Recorded {
        /// The task's state after the event.
        status: TaskStatus,
        /// Whether the event changed the task's state.
        changed: bool,
    },
    /// The event belongs to an attempt that is no longer the task's current
    /// one (the task moved to another attempt, or its node was suspected and
    /// the task went back to the queue): kept as history, the task unchanged.
    Stale {
        /// The task's state, which the event did not change.
        status: TaskStatus,
    },
    /// The sender was never assigned this attempt (another node's attempt, or
    /// one never made): nothing recorded, so such an event cannot take the
    /// place of the real node's event in the history or the task.
    NotAssigned,
    /// The same task, attempt and state was recorded before: nothing changed.
    Duplicate,
    /// No task has this id: nothing changed.
    UnknownTask,
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

#[derive(sqlx::FromRow)]
struct OutboxRow {
    task_id: String,
    attempt: i64,
    node_id: String,
    next_send_ms: i64,
    sends: i64,
}

impl OutboxRow {
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

#[derive(sqlx::FromRow)]
pub(crate) struct TaskRow {
    id: String,
    artifact: String,
    runtime: String,
    input: Vec<u8>,
    args: String,
    class: String,
    demand: String,
    limits: String,
    work_seconds: f64,
    priority: i64,
    deadline_unix_ms: Option<i64>,
    created_ms: i64,
    updated_ms: i64,
    state: String,
    node_id: Option<String>,
    attempt: i64,
    power_level: Option<i64>,
    output: Option<Vec<u8>>,
    exit_code: Option<i64>,
    failure_reason: Option<String>,
    failure_message: Option<String>,
    explanation: Option<String>,
    cancel_requested: i64,
    site: Option<String>,
    site_node: Option<String>,
    origin_site: Option<String>,
    origin_task: Option<String>,
}

#[derive(sqlx::FromRow)]
struct EventRow {
    attempt: i64,
    state: String,
    node_id: String,
    received_ms: i64,
    reason: Option<String>,
    message: Option<String>,
    exit_code: Option<i64>,
    output_bytes: i64,
    metrics: Option<String>,
}

#[derive(sqlx::FromRow)]
struct AttemptRow {
    attempt: i64,
    node_id: String,
    power_level: i64,
    assigned_ms: i64,
    state: String,
    finished_ms: Option<i64>,
}

pub(crate) const TASK_COLUMNS: &str = "id, artifact, runtime, input, args, class, demand, limits, work_seconds, \
     priority, deadline_unix_ms, created_ms, updated_ms, state, node_id, attempt, power_level, output, \
     exit_code, failure_reason, failure_message, explanation, cancel_requested, site, site_node, \
     origin_site, origin_task";

/// Stores a u64 in a BIGINT column; values past i64::MAX (far beyond any
/// timestamp or size the coordinator handles) saturate.
pub(crate) fn to_db(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Reads a BIGINT column back as u64; negative values cannot be written by
/// [`to_db`] and read as 0.
pub(crate) fn from_db(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(crate) fn corrupt(column: &'static str, detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        column,
        detail: detail.to_string(),
    }
}

fn runtime_from_str(s: &str) -> Option<Runtime> {
    match s {
        "wasm" => Some(Runtime::Wasm),
        "opencl" => Some(Runtime::Opencl),
        _ => None,
    }
}

fn event_state_name(state: TaskState) -> &'static str {
    match state {
        TaskState::Accepted => "accepted",
        TaskState::Running => "running",
        TaskState::Succeeded => "succeeded",
        TaskState::Failed => "failed",
        TaskState::Cancelled => "cancelled",
        TaskState::Rejected => "rejected",
    }
}

/// The wire name of a failure reason (its serde name).
pub fn failure_reason_name(reason: starling_proto::FailureReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{reason:?}"))
}

impl TaskRow {
    pub(crate) fn into_record(self) -> Result<TaskRecord, StoreError> {
        let spec = NewTask {
            artifact: Digest::parse(&self.artifact).map_err(|e| corrupt("tasks.artifact", e))?,
            runtime: runtime_from_str(&self.runtime)
                .ok_or_else(|| corrupt("tasks.runtime", &self.runtime))?,
            input: self.input,
            args: serde_json::from_str(&self.args).map_err(|e| corrupt("tasks.args", e))?,
            class: TaskKind::from_str(&self.class).map_err(|e| corrupt("tasks.class", e))?,
            demand: serde_json::from_str(&self.demand).map_err(|e| corrupt("tasks.demand", e))?,
            limits: serde_json::from_str(&self.limits).map_err(|e| corrupt("tasks.limits", e))?,
            work_seconds: self.work_seconds,
            priority: u8::try_from(self.priority).unwrap_or(u8::MAX),
            deadline_unix_ms: self.deadline_unix_ms.map(from_db),
            created_ms: from_db(self.created_ms),
            id: self.id,
        };
        Ok(TaskRecord {
            spec,
            status: TaskStatus::from_str(&self.state).map_err(|e| corrupt("tasks.state", e))?,
            updated_ms: from_db(self.updated_ms),
            node_id: self.node_id,
            attempt: u32::try_from(self.attempt).unwrap_or(0),
            power_level: self
                .power_level
                .map(|level| u8::try_from(level).unwrap_or(0)),
            output: self.output,
            exit_code: self.exit_code.and_then(|code| i32::try_from(code).ok()),
            failure_reason: self.failure_reason,
            failure_message: self.failure_message,
            explanation: match self.explanation {
                Some(text) => {
                    Some(serde_json::from_str(&text).map_err(|e| corrupt("tasks.explanation", e))?)
                }
                None => None,
            },
            cancel_requested: self.cancel_requested != 0,
            site: self.site,
            site_node: self.site_node,
            origin: self.origin_site.zip(self.origin_task),
        })
    }
}

impl EventRow {
    fn into_record(self) -> EventRecord {
        EventRecord {
            attempt: u32::try_from(self.attempt).unwrap_or(0),
            state: self.state,
            node_id: self.node_id,
            received_ms: from_db(self.received_ms),
            reason: self.reason,
            message: self.message,
            exit_code: self.exit_code.and_then(|code| i32::try_from(code).ok()),
            output_bytes: from_db(self.output_bytes),
            metrics: self
                .metrics
                .and_then(|text| serde_json::from_str(&text).ok()),
        }
    }
}

/// Removes the password from a database URL before it appears in messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _password)) => {
                    format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..])
                }
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

impl Store {
    /// Opens (creating a SQLite file if missing) and migrates the database at `url`:
    /// `sqlite://PATH` (WAL mode) or `postgres://…`.
    pub async fn open(url: &str) -> Result<Store, OpenStoreError> {
        let shown = redact(url);
        let backend = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(|source| OpenStoreError::Connect {
                    url: shown.clone(),
                    source,
                })?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(10));
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(CONNECT_TIMEOUT)
                .connect_with(options)
                .await
                .map_err(|source| OpenStoreError::Connect {
                    url: shown.clone(),
                    source,
                })?;
            Backend::Sqlite(pool)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            // The pool reports an unreachable server only as "pool timed out";
            // one direct connection first gives the driver's real reason.
            let probe = tokio::time::timeout(CONNECT_TIMEOUT, sqlx::PgConnection::connect(url))
                .await
                .map_err(|_| OpenStoreError::Connect {
                    url: shown.clone(),
                    source: sqlx::Error::PoolTimedOut,
                })?
                .map_err(|source| OpenStoreError::Connect {
                    url: shown.clone(),
                    source,
                })?;
            let _ = probe.close().await;
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(CONNECT_TIMEOUT)
                .connect(url)
                .await
                .map_err(|source| OpenStoreError::Connect {
                    url: shown.clone(),
                    source,
                })?;
            Backend::Postgres(pool)
        } else {
            return Err(OpenStoreError::UnsupportedUrl { url: shown });
        };
        let store = Store { backend };
        with_pool!(store, pool => MIGRATOR.run(pool).await).map_err(|source| {
            OpenStoreError::Migrate {
                url: shown.clone(),
                source,
            }
        })?;
        Ok(store)
    }

    /// The backend's name: `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Closes every connection.
    pub async fn close(&self) {
        with_pool!(self, pool => pool.close().await)
    }

    /// Answers when the database answers a trivial query.
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_pool!(self, pool => sqlx::query("SELECT 1").execute(pool).await.map(|_| ()))?;
        Ok(())
    }

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
        let sql = "INSERT INTO tasks (id, artifact, runtime, input, args, class, demand, limits, \
                   work_seconds, priority, deadline_unix_ms, created_ms, updated_ms, state, attempt, \
                   cancel_requested, origin_site, origin_task) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, 'pending', 0, 0, $13, $14) \
                   ON CONFLICT (origin_site, origin_task) DO NOTHING";
        let args = serde_json::to_string(&task.args).map_err(|e| corrupt("tasks.args", e))?;
        let demand = serde_json::to_string(&task.demand).map_err(|e| corrupt("tasks.demand", e))?;
        let limits = serde_json::to_string(&task.limits).map_err(|e| corrupt("tasks.limits", e))?;
        let inserted = with_pool!(self, pool => sqlx::query(sql)
            .bind(&task.id)
            .bind(task.artifact.to_hex())
            .bind(task.runtime.as_str())
            .bind(&task.input)
            .bind(&args)
            .bind(task.class.as_str())
            .bind(&demand)
            .bind(&limits)
            .bind(task.work_seconds)
            .bind(i64::from(task.priority))
            .bind(task.deadline_unix_ms.map(to_db))
            .bind(to_db(task.created_ms))
            .bind(origin.map(|(site, _)| site))
            .bind(origin.map(|(_, id)| id))
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(inserted == 1)
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

    /// Records a placement: the pending task gets attempt `attempt` on `node_id`,
    /// and the assignment enters the outbox (due now, never sent) in the same
    /// transaction. Returns false (and changes nothing) when the task is no longer pending at
    /// the expected attempt, for instance because it was cancelled meanwhile.
    pub async fn assign_task(
        &self,
        task_id: &str,
        attempt: u32,
        node_id: &str,
        power_level: u8,
        explanation: &serde_json::Value,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let explanation = explanation.to_string();
        let update =
            "UPDATE tasks SET state = 'assigned', attempt = $2, node_id = $3, power_level = $4, \
                      explanation = $5, updated_ms = $6 \
                      WHERE id = $1 AND state = 'pending' AND attempt = $7";
        let insert = "INSERT INTO attempts (task_id, attempt, node_id, power_level, assigned_ms, state, explanation) \
                      VALUES ($1, $2, $3, $4, $5, 'assigned', $6)";
        // Due at once and never sent: the scheduler claims the first send right
        // after the commit, and if the process dies before it does, the resend
        // loop of the next start sends it.
        let outbox = "INSERT INTO outbox (task_id, attempt, node_id, next_send_ms, sends) \
                      VALUES ($1, $2, $3, $4, 0)";
        let assigned = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let updated = sqlx::query(update)
                .bind(task_id)
                .bind(i64::from(attempt))
                .bind(node_id)
                .bind(i64::from(power_level))
                .bind(&explanation)
                .bind(to_db(now_ms))
                .bind(i64::from(attempt.saturating_sub(1)))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if updated == 1 {
                sqlx::query(insert)
                    .bind(task_id)
                    .bind(i64::from(attempt))
                    .bind(node_id)
                    .bind(i64::from(power_level))
                    .bind(to_db(now_ms))
                    .bind(&explanation)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(outbox)
                    .bind(task_id)
                    .bind(i64::from(attempt))
                    .bind(node_id)
                    .bind(to_db(now_ms))
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok::<bool, sqlx::Error>(true)
            } else {
                tx.rollback().await?;
                Ok(false)
            }
        })?;
        Ok(assigned)
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

    /// Records an agent's event once and applies it to the task's state.
    ///
    /// Redeliveries of the same task, attempt and state are recognised by the
    /// events table's key and change nothing. Any event other than `rejected`
    /// from the assigned node acknowledges the attempt's assignment (its
    /// outbox row goes). A `rejected` event is history only: a forged
    /// assignment must not be able to change a real task. An event from a
    /// node that was never assigned the attempt is not recorded at all
    /// ([`EventOutcome::NotAssigned`]). An event for an attempt of the node's
    /// that is no longer the current one is kept as history
    /// ([`EventOutcome::Stale`]) and does not change the task, with one
    /// exception: a `succeeded` or `failed` of the task's latest attempt from
    /// the node that ran it while the task waits in the queue (the node was
    /// suspected, came back, and nothing else ran the task yet) is accepted,
    /// so the task completes once without a rerun. A `failed` with reason
    /// `agent_busy` puts the task back in the queue while attempts remain
    /// (`max_attempts`). States only move forward: a task that ended stays ended.
    pub async fn record_event(
        &self,
        event: &TaskEvent,
        now_ms: u64,
        max_attempts: u32,
    ) -> Result<EventOutcome, StoreError> {
        let touch = "UPDATE tasks SET updated_ms = $2 WHERE id = $1";
        let insert = "INSERT INTO events (task_id, attempt, state, node_id, received_ms, reason, message, \
                      exit_code, output_bytes, metrics) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                      ON CONFLICT (task_id, attempt, state) DO NOTHING";
        let acknowledge = "DELETE FROM outbox WHERE task_id = $1 AND attempt = $2 AND node_id = $3";
        let select = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1");
        let attempt_node = "SELECT node_id FROM attempts WHERE task_id = $1 AND attempt = $2";
        let update =
            "UPDATE tasks SET state = $2, output = $3, exit_code = $4, failure_reason = $5, \
                      failure_message = $6, node_id = $7 WHERE id = $1";
        let update_attempt =
            "UPDATE attempts SET state = $3, finished_ms = $4 WHERE task_id = $1 AND attempt = $2";
        let clear_outbox = "DELETE FROM outbox WHERE task_id = $1";

        let task_id = event.task_id.as_str();
        let node = event.node_id.as_str();
        let state_name = event_state_name(event.state);
        let reason = event.reason.map(failure_reason_name);
        let message = event.message.as_ref().map(|m| m.as_str().to_string());
        let metrics = event
            .metrics
            .as_ref()
            .and_then(|metrics| serde_json::to_string(metrics).ok());

        let outcome = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let touched = sqlx::query(touch)
                .bind(task_id)
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if touched == 0 {
                tx.rollback().await?;
                return Ok(EventOutcome::UnknownTask);
            }
            let assigned_to: Option<(String,)> = sqlx::query_as(attempt_node)
                .bind(task_id)
                .bind(i64::from(event.attempt))
                .fetch_optional(&mut *tx)
                .await?;
            if assigned_to.is_none_or(|(assigned,)| assigned != node) {
                tx.rollback().await?;
                return Ok(EventOutcome::NotAssigned);
            }
            let inserted = sqlx::query(insert)
                .bind(task_id)
                .bind(i64::from(event.attempt))
                .bind(state_name)
                .bind(node)
                .bind(to_db(now_ms))
                .bind(reason.as_deref())
                .bind(message.as_deref())
                .bind(event.exit_code.map(i64::from))
                .bind(to_db(event.output.len() as u64))
                .bind(metrics.as_deref())
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if inserted == 0 {
                tx.rollback().await?;
                return Ok(EventOutcome::Duplicate);
            }
            if event.state != TaskState::Rejected {
                sqlx::query(acknowledge)
                    .bind(task_id)
                    .bind(i64::from(event.attempt))
                    .bind(node)
                    .execute(&mut *tx)
                    .await?;
            }
            let row: TaskRow = sqlx::query_as(&select).bind(task_id).fetch_one(&mut *tx).await?;
            let task = row.into_record()?;
            let current_attempt = task.attempt == event.attempt
                && task.node_id.as_deref() == Some(node);
            if event.state == TaskState::Rejected {
                tx.commit().await?;
                return Ok(if current_attempt {
                    EventOutcome::Recorded { status: task.status, changed: false }
                } else {
                    EventOutcome::Stale { status: task.status }
                });
            }
            let next = if current_attempt {
                next_status(&task, event, max_attempts)
            } else {
                // The sender ran this attempt (checked above); it is the
                // latest one and nothing replaced it yet.
                let ran_it = task.status == TaskStatus::Pending
                    && task.attempt == event.attempt
                    && matches!(event.state, TaskState::Succeeded | TaskState::Failed);
                // Judged as if the attempt were still running; a late
                // `agent_busy` would only put it back where it already is.
                let as_running = TaskRecord { status: TaskStatus::Running, ..task.clone() };
                match ran_it.then(|| next_status(&as_running, event, max_attempts)).flatten() {
                    Some(next) if next.is_terminal() => Some(next),
                    _ => {
                        tx.commit().await?;
                        return Ok(EventOutcome::Stale { status: task.status });
                    }
                }
            };
            let Some(next) = next else {
                tx.commit().await?;
                return Ok(EventOutcome::Recorded { status: task.status, changed: false });
            };
            let attempt_state = match (next, event.state) {
                (TaskStatus::Pending, _) => "failed",
                (_, state) => event_state_name(state),
            };
            let (output, exit_code, failure_reason, failure_message) = match next {
                TaskStatus::Succeeded => (Some(event.output.clone()), event.exit_code, None, None),
                TaskStatus::Failed => (None, event.exit_code, reason.clone(), message.clone()),
                _ => (task.output.clone(), task.exit_code, task.failure_reason.clone(), task.failure_message.clone()),
            };
            let node_id = if next == TaskStatus::Pending { None } else { Some(node) };
            sqlx::query(update)
                .bind(task_id)
                .bind(next.as_str())
                .bind(output)
                .bind(exit_code.map(i64::from))
                .bind(failure_reason)
                .bind(failure_message)
                .bind(node_id)
                .execute(&mut *tx)
                .await?;
            let finished = (next.is_terminal() || next == TaskStatus::Pending).then(|| to_db(now_ms));
            sqlx::query(update_attempt)
                .bind(task_id)
                .bind(i64::from(event.attempt))
                .bind(attempt_state)
                .bind(finished)
                .execute(&mut *tx)
                .await?;
            if finished.is_some() {
                // Nothing is left to deliver for an ended or requeued task.
                sqlx::query(clear_outbox).bind(task_id).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok::<EventOutcome, StoreError>(EventOutcome::Recorded { status: next, changed: next != task.status })
        })?;
        Ok(outcome)
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
        let lost = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
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
        Ok(lost)
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
    pub async fn claim_outbox_send(
        &self,
        seen: &OutboxEntry,
        next_send_ms: u64,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE outbox SET next_send_ms = $3, sends = sends + 1 \
                   WHERE task_id = $1 AND attempt = $2 AND next_send_ms = $4 AND sends = $5";
        let claimed = with_pool!(self, pool => sqlx::query(sql)
            .bind(&seen.task_id)
            .bind(i64::from(seen.attempt))
            .bind(to_db(next_send_ms))
            .bind(to_db(seen.next_send_ms))
            .bind(i64::from(seen.sends))
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
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

    /// The nodes that have an attempt in flight (tasks `assigned` or `running`).
    pub async fn in_flight_nodes(&self) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT DISTINCT node_id FROM tasks \
                   WHERE state IN ('assigned', 'running') AND node_id IS NOT NULL";
        let rows: Vec<(String,)> =
            with_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)?;
        Ok(rows.into_iter().map(|(node,)| node).collect())
    }

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

    /// A task's events, oldest first; events received in the same millisecond
    /// come in lifecycle order.
    pub async fn events(&self, task_id: &str) -> Result<Vec<EventRecord>, StoreError> {
        let sql = "SELECT attempt, state, node_id, received_ms, reason, message, exit_code, output_bytes, metrics \
                   FROM events WHERE task_id = $1 ORDER BY received_ms ASC, attempt ASC, \
                   CASE state WHEN 'accepted' THEN 0 WHEN 'running' THEN 1 WHEN 'lost' THEN 3 ELSE 2 END ASC";
        let rows: Vec<EventRow> =
            with_pool!(self, pool => sqlx::query_as(sql).bind(task_id).fetch_all(pool).await)?;
        Ok(rows.into_iter().map(EventRow::into_record).collect())
    }

    /// A task's attempts, first first.
    pub async fn attempts(&self, task_id: &str) -> Result<Vec<AttemptRecord>, StoreError> {
        let sql = "SELECT attempt, node_id, power_level, assigned_ms, state, finished_ms \
                   FROM attempts WHERE task_id = $1 ORDER BY attempt ASC";
        let rows: Vec<AttemptRow> =
            with_pool!(self, pool => sqlx::query_as(sql).bind(task_id).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|row| AttemptRecord {
                attempt: u32::try_from(row.attempt).unwrap_or(0),
                node_id: row.node_id,
                power_level: u8::try_from(row.power_level).unwrap_or(0),
                assigned_ms: from_db(row.assigned_ms),
                state: row.state,
                finished_ms: row.finished_ms.map(from_db),
            })
            .collect())
    }
}

/// The task's next state after an event of its current attempt, or `None`
/// when the event changes nothing (a task already ended stays ended).
fn next_status(task: &TaskRecord, event: &TaskEvent, max_attempts: u32) -> Option<TaskStatus> {
    if task.status.is_terminal() || task.status == TaskStatus::Pending {
        return None;
    }
    let next = match event.state {
        TaskState::Accepted | TaskState::Running => TaskStatus::Running,
        TaskState::Succeeded => TaskStatus::Succeeded,
        TaskState::Failed => {
            let busy = event.reason == Some(starling_proto::FailureReason::AgentBusy);
            if busy && event.attempt < max_attempts && !task.cancel_requested {
                TaskStatus::Pending
            } else {
                TaskStatus::Failed
            }
        }
        TaskState::Cancelled => TaskStatus::Cancelled,
        // Handled before: a refusal never changes the task.
        TaskState::Rejected => return None,
    };
    (next != task.status || next == TaskStatus::Pending).then_some(next)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(
            redact("postgres://user:secret@host/db"),
            "postgres://user:***@host/db"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1/test"),
            "postgres://postgres@127.0.0.1/test"
        );
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
    }
}
