//! Durable state: artifacts (content-addressed by sha256), tasks, attempts and
//! events, in SQLite (the default) or PostgreSQL through sqlx.
//!
//! Both backends run the same migrations and the same query text: the schema
//! sticks to portable SQL and every query is written once with `$n`
//! placeholders, then expanded for each pool by [`with_pool!`]. Every
//! read-modify-write starts with a write so that SQLite takes its write lock
//! first (a deferred transaction that reads and then writes can fail with
//! `SQLITE_BUSY` when another writer got there in between).
//!
//! This file opens the store and holds what the tables share; each group of
//! tables has its own `impl Store` block: `tasks` (submission, queue,
//! placement, requeue, cancel), `events` (agents' events, attempts), `outbox`
//! (unacknowledged assignments), `artifacts`, `keys` (the coordinator key).
//! What an event does to its task is decided by the pure
//! [`crate::domain::reconcile()`]; `events` only reads and writes the rows.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::Connection as _;
use starling_proto::{Digest, Runtime};

use crate::task::{TaskKind, TaskStatus};

pub mod access;
mod artifacts;
mod events;
pub mod forwards;
mod keys;
mod lease;
mod outbox;
mod placements;
mod precompiled;
mod revocations;
mod tasks;

pub use events::{
    failure_reason_name, AttemptRecord, EventOutcome, EventRecord, EventToRecord, ReportMark,
};
pub use lease::LeaderTerm;
pub(crate) use lease::FENCE_SQL;
pub use outbox::OutboxEntry;
pub use placements::{Placed, Placement};
pub use precompiled::PrecompiledKey;
pub use tasks::{Admission, CancelOutcome, InFlightAttempt, LostTask, NewTask, TaskRecord};

/// The migrations, shared by both backends.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How long (ms) PostgreSQL lets one of our transactions sit idle before it
/// ends it: a paused replica's open transaction then stops blocking the
/// replica taking over its lease.
const IDLE_IN_TRANSACTION_TIMEOUT_MS: &str = "3000";

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
// Every `impl Store` block of the store's files shares the one query text rule.
pub(crate) use with_pool;

/// Inside a leader-only write's transaction `tx` (in a `with_pool!` body):
/// with replicas, checks that the lease still holds `term` (an
/// `Option<u64>` from [`Store::fence`]) and returns `StoreError::Deposed`
/// from the method when it does not; without replicas (`None`), nothing.
macro_rules! check_term {
    ($tx:ident, $term:expr) => {
        if let Some(term) = $term {
            let held = sqlx::query($crate::store::FENCE_SQL)
                .bind($crate::store::to_db(term))
                .execute(&mut *$tx)
                .await?;
            if held.rows_affected() != 1 {
                return Err($crate::store::StoreError::Deposed);
            }
        }
    };
}
pub(crate) use check_term;

/// The pool of whichever database the store opened.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The coordinator's database.
#[derive(Debug, Clone)]
pub struct Store {
    pub(crate) backend: Backend,
    /// Where every task state change is announced once committed, so no
    /// caller can change a task without watchers hearing of it.
    pub(crate) feed: Option<crate::live::Feed>,
    /// Whether this coordinator leads its site: the fence of the writes only
    /// a leader makes (placements, sends, requeues, ended attempts, forwards).
    pub(crate) leadership: crate::leader::Leadership,
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
    /// A leader-only write by a replica that no longer leads its site (its
    /// term is over, or it never led): nothing was written.
    #[error(
        "this coordinator replica does not lead its site (its term is over); the leader does this"
    )]
    Deposed,
    /// A row holds a value this build cannot read (a corrupt or newer database).
    #[error("database holds an unreadable value in {column}: {detail}")]
    Corrupt {
        /// The column.
        column: &'static str,
        /// What was wrong.
        detail: String,
    },
}

/// A `tasks` row as read with [`TASK_COLUMNS`] (here and by the federation's
/// store); [`TaskRow::into_record`] checks and converts it.
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

/// The columns of [`TaskRow`], in the order it reads them.
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

/// The error for an unreadable value in `column`.
pub(crate) fn corrupt(column: &'static str, detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        column,
        detail: detail.to_string(),
    }
}

/// The runtime stored under its name, if this build knows it.
fn runtime_from_str(s: &str) -> Option<Runtime> {
    match s {
        "wasm" => Some(Runtime::Wasm),
        "opencl" => Some(Runtime::Opencl),
        _ => None,
    }
}

impl TaskRow {
    /// The task the row holds, or [`StoreError::Corrupt`] for a value this
    /// build cannot read.
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
            // A replica stopped in the middle of a transaction (paused, its
            // host frozen) would hold the lease row's lock that fences its
            // writes, and no other replica could take over: the server ends
            // such a transaction after a while instead. Ours never wait on
            // anything but the database between statements.
            let options = PgConnectOptions::from_str(url)
                .map_err(|source| OpenStoreError::Connect {
                    url: shown.clone(),
                    source,
                })?
                .options([(
                    "idle_in_transaction_session_timeout",
                    IDLE_IN_TRANSACTION_TIMEOUT_MS,
                )]);
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(CONNECT_TIMEOUT)
                .connect_with(options)
                .await
                .map_err(|source| OpenStoreError::Connect {
                    url: shown.clone(),
                    source,
                })?;
            Backend::Postgres(pool)
        } else {
            return Err(OpenStoreError::UnsupportedUrl { url: shown });
        };
        let store = Store {
            backend,
            feed: None,
            leadership: crate::leader::Leadership::single(),
        };
        with_pool!(store, pool => MIGRATOR.run(pool).await).map_err(|source| {
            OpenStoreError::Migrate {
                url: shown.clone(),
                source,
            }
        })?;
        Ok(store)
    }

    /// The same store, announcing each task state change it commits on
    /// `feed`.
    pub(crate) fn with_feed(self, feed: crate::live::Feed) -> Store {
        Store {
            feed: Some(feed),
            ..self
        }
    }

    /// The store fencing leader-only writes with `leadership` (a replica).
    pub fn with_leadership(self, leadership: crate::leader::Leadership) -> Store {
        Store { leadership, ..self }
    }

    /// Whether the store is PostgreSQL, the one several replicas can share.
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// Announces a committed task change.
    pub(crate) fn announce(&self, change: starling_api::TaskChange) {
        if let Some(feed) = &self.feed {
            feed.task(change);
        }
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
