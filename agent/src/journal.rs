//! The agent's durable journal: `<data-dir>/journal.sqlite` (SQLite through
//! sqlx, WAL, `synchronous=FULL` because edge devices lose power).
//!
//! Two tables. `attempts` holds every attempt the agent remembers: the signed
//! assignment while the attempt is unfinished, so an agent restarted after a
//! crash runs it again, and the attempt's last event, so a redelivered
//! assignment re-publishes that event instead of running twice. `outbox`
//! holds every task event the coordinator has not acknowledged yet; an event
//! goes in before it is published and leaves when its `EventAck` arrives, and
//! what is left is sent again (oldest first) until it does.
//!
//! # Bounds and the policy when full
//!
//! The outbox holds at most `max_entries` events and `attempts` at most
//! `max_attempts` attempts. When either is reached, a **new** assignment is
//! refused: [`Journal::accept`] answers [`JournalError::Full`] and the agent
//! sends `failed/agent_busy` without journaling it, so the coordinator places
//! the task elsewhere. Unacknowledged events are never dropped: events of
//! attempts already accepted are always written, so the outbox can pass its
//! limit by the few events each running attempt still has to report. To make
//! room, finished attempts are pruned oldest first, but only once every one of
//! their events was acknowledged and their assignment can no longer be
//! accepted (its expiry plus the allowed clock skew has passed), so a replay
//! is always recognised.
//!
//! A finished attempt drops its assignment (input included), and its last
//! event drops its output once the coordinator acknowledged it, so the
//! `attempts` table stays small; the outbox keeps outputs in full until acknowledged.
//!
//! # Rows of another protocol version
//!
//! Rows are read with `decode_stored`: a row an older agent wrote is read
//! when its bytes still fit this version's fields (events are re-sent as
//! this version), so an upgrade does not orphan in-flight attempts. A row
//! that does not fit (an incompatible older version, or a downgrade) is
//! logged as an error and left; the coordinator ends such an attempt when
//! the node's telemetry does not list it. Across an incompatible version,
//! drain the node before upgrading (docs/operations.md, upgrades).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, SqliteConnection};
use starling_proto::{Assignment, DecodeError, EncodeError, TaskEvent, TaskId, TaskState};

/// The journal's file name inside the data directory.
pub const JOURNAL_FILE: &str = "journal.sqlite";

/// Default bound on unacknowledged events in the outbox.
pub const DEFAULT_MAX_ENTRIES: usize = 10_000;

/// Default bound on remembered attempts.
pub const DEFAULT_MAX_ATTEMPTS: usize = 4_096;

/// How long an attempt known only from a cancel (no assignment, so no expiry
/// to go by) is kept at least: the coordinator's default assignment validity
/// (60 s) plus the allowed clock skew (60 s).
pub const CANCEL_ONLY_RETENTION: Duration = Duration::from_secs(120);

/// SQLite's page cache for the journal's connection, in KiB (`PRAGMA
/// cache_size` with a negative value counts KiB, not pages).
const JOURNAL_CACHE_KIB: u32 = 256;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// An attempt: a task id and an attempt number.
pub type AttemptKey = (TaskId, u32);

/// The journal's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalLimits {
    /// Most unacknowledged events before new assignments are refused.
    pub max_entries: usize,
    /// Most remembered attempts before new assignments are refused.
    pub max_attempts: usize,
    /// Clock skew allowed when checking assignments: an attempt is kept until
    /// its assignment's expiry plus this has passed.
    pub skew: Duration,
}

impl Default for JournalLimits {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            skew: crate::verify::DEFAULT_CLOCK_SKEW,
        }
    }
}

/// Why the journal could not be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The database could not be opened or migrated.
    #[error("cannot open the agent journal {path}: {detail}; check --data-dir")]
    Open {
        /// The journal file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// A query failed (a full or failing disk, usually).
    #[error("the agent journal {path} failed: {source}")]
    Query {
        /// The journal file.
        path: PathBuf,
        /// The database error.
        source: sqlx::Error,
    },
    /// The journal is at one of its bounds and nothing can be pruned yet.
    #[error("the agent journal is full ({what}: limit {limit}); new work is refused until the coordinator acknowledges events")]
    Full {
        /// Which bound: `unacknowledged events` or `remembered attempts`.
        what: &'static str,
        /// The bound.
        limit: usize,
    },
    /// A message could not be encoded for storage.
    #[error("cannot encode a journal entry: {0}")]
    Encode(#[from] EncodeError),
}

/// An attempt read back from the journal at start.
#[derive(Debug, Clone, PartialEq)]
pub struct JournaledAttempt {
    /// The signed assignment, while the attempt is unfinished.
    pub assignment: Option<Assignment>,
    /// The attempt's last event.
    pub last_event: TaskEvent,
}

/// An unacknowledged event.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    /// Its place in the outbox (increasing with age).
    pub seq: i64,
    /// When it was journaled (Unix ms).
    pub created_ms: u64,
    /// The event.
    pub event: TaskEvent,
}

/// The open journal. Cheap to clone: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct Journal {
    pool: SqlitePool,
    path: PathBuf,
    limits: JournalLimits,
    /// Whether this open created the file (see [`Journal::is_fresh`]).
    fresh: bool,
}

/// The wire name of a state, as stored.
pub fn state_name(state: TaskState) -> &'static str {
    match state {
        TaskState::Accepted => "accepted",
        TaskState::Running => "running",
        TaskState::Succeeded => "succeeded",
        TaskState::Failed => "failed",
        TaskState::Cancelled => "cancelled",
        TaskState::Rejected => "rejected",
    }
}

const TERMINAL: &str = "('succeeded', 'failed', 'cancelled', 'rejected')";

fn to_db(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn from_db(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl Journal {
    /// Opens (creating it if needed) the journal in `data_dir` and returns it
    /// with every remembered attempt, least recently updated first. Rows that
    /// do not decode even as an older version are left out, logged as errors
    /// (see the module documentation).
    pub async fn open(
        data_dir: &Path,
        limits: JournalLimits,
    ) -> Result<(Self, Vec<JournaledAttempt>), JournalError> {
        let path = data_dir.join(JOURNAL_FILE);
        let open_error = |detail: String| JournalError::Open {
            path: path.clone(),
            detail,
        };
        std::fs::create_dir_all(data_dir).map_err(|e| open_error(e.to_string()))?;
        let fresh = !path.exists();
        let options = SqliteConnectOptions::from_str("sqlite:")
            .map_err(|e| open_error(e.to_string()))?
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // A committed write survives a power cut: the agent acknowledges
            // assignments to the broker only after they are committed here.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            // SQLite's default page cache grows to 2 MB per connection; the
            // journal's queries are point lookups, inserts and counts, and
            // pages that fall out are in the OS page cache anyway. A bound
            // of 256 KiB keeps a full journal from holding megabytes
            // (issue 17).
            .pragma("cache_size", format!("-{JOURNAL_CACHE_KIB}"));
        // One connection: each is a thread of sqlx's and a page cache, and
        // SQLite takes one writer at a time whatever the pool holds. The
        // main loop's writes and the outbound task's reads take turns (no
        // query holds the connection while it waits for another).
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(|e| open_error(e.to_string()))?;
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| open_error(e.to_string()))?;
        let journal = Self {
            pool,
            path,
            limits,
            fresh,
        };
        let attempts = journal.attempts().await?;
        Ok((journal, attempts))
    }

    fn query_error(&self) -> impl Fn(sqlx::Error) -> JournalError + '_ {
        move |source| JournalError::Query {
            path: self.path.clone(),
            source,
        }
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file did not exist before this open: a new node, or one
    /// that lost its journal (a wiped or replaced disk). Such an agent cannot
    /// tell a replayed assignment from one it never ran, so the session
    /// refuses assignments issued before it started
    /// ([`crate::session::Session::refuse_issued_before`]).
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// Every remembered attempt, least recently updated first.
    pub async fn attempts(&self) -> Result<Vec<JournaledAttempt>, JournalError> {
        let rows = sqlx::query(
            "SELECT task_id, attempt, assignment, last_event FROM attempts ORDER BY updated_ms, rowid",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(self.query_error())?;
        let mut attempts = Vec::with_capacity(rows.len());
        for row in rows {
            let task: String = row.get(0);
            let attempt: i64 = row.get(1);
            let assignment: Option<Vec<u8>> = row.get(2);
            let last_event: Vec<u8> = row.get(3);
            let decoded = (|| -> Result<JournaledAttempt, DecodeError> {
                Ok(JournaledAttempt {
                    assignment: assignment
                        .as_deref()
                        .map(starling_proto::decode_stored)
                        .transpose()?,
                    last_event: stored_event(&last_event)?,
                })
            })();
            match decoded {
                Ok(entry) => attempts.push(entry),
                // Not written by this protocol version nor an older one whose
                // fields still fit: this agent cannot run or report it. The
                // coordinator's reconcile ends such an attempt (the node's
                // telemetry does not list it); see docs/operations.md, upgrades.
                Err(error) => tracing::error!(task, attempt, %error,
                    "a journaled attempt does not decode; it is left to the coordinator to place again"),
            }
        }
        Ok(attempts)
    }

    /// Journals a new attempt: its signed assignment and its `accepted`
    /// event, in one transaction. Returns the attempts pruned to make room
    /// (the session forgets them too), or [`JournalError::Full`] when the
    /// attempt must be refused; nothing is written then.
    pub async fn accept(
        &self,
        assignment: &Assignment,
        accepted: &TaskEvent,
        now_ms: u64,
    ) -> Result<Vec<AttemptKey>, JournalError> {
        let assignment_bytes = starling_proto::encode(assignment)?;
        let event_bytes = starling_proto::encode(accepted)?;
        let valid_until = assignment
            .expires_unix_ms
            .saturating_add(duration_ms(self.limits.skew))
            .max(now_ms);
        let mut tx = self.pool.begin().await.map_err(self.query_error())?;
        let pruned = self.make_room(&mut tx, now_ms).await?;
        sqlx::query(
            "INSERT INTO attempts (task_id, attempt, assignment, last_event, state, valid_until_ms, updated_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (task_id, attempt) DO NOTHING",
        )
        .bind(assignment.task_id.as_str())
        .bind(i64::from(assignment.attempt))
        .bind(&assignment_bytes)
        .bind(&event_bytes)
        .bind(state_name(accepted.state))
        .bind(to_db(valid_until))
        .bind(to_db(now_ms))
        .execute(&mut *tx)
        .await
        .map_err(self.query_error())?;
        insert_outbox(&mut tx, accepted, &event_bytes, now_ms)
            .await
            .map_err(self.query_error())?;
        tx.commit().await.map_err(self.query_error())?;
        Ok(pruned)
    }

    /// Journals an event: it becomes the attempt's last event (unless the
    /// attempt already finished) and enters the outbox. An event for an
    /// attempt the journal does not know yet (a cancel that came before its
    /// assignment, a refusal of an unsupported runtime) creates the attempt,
    /// and only then can the journal be [`JournalError::Full`].
    pub async fn record(
        &self,
        event: &TaskEvent,
        now_ms: u64,
    ) -> Result<Vec<AttemptKey>, JournalError> {
        let event_bytes = starling_proto::encode(event)?;
        let task = event.task_id.as_str();
        let attempt = i64::from(event.attempt);
        let mut tx = self.pool.begin().await.map_err(self.query_error())?;
        let known: Option<String> =
            sqlx::query_scalar("SELECT state FROM attempts WHERE task_id = ? AND attempt = ?")
                .bind(task)
                .bind(attempt)
                .fetch_optional(&mut *tx)
                .await
                .map_err(self.query_error())?;
        let mut pruned = Vec::new();
        match known {
            Some(_) => {
                // A finished attempt drops its assignment: it will not run
                // again, and the input may be large.
                let finished_sql = format!(
                    "UPDATE attempts SET last_event = ?, state = ?, updated_ms = ?,
                         assignment = CASE WHEN ? THEN NULL ELSE assignment END
                     WHERE task_id = ? AND attempt = ? AND state NOT IN {TERMINAL}"
                );
                sqlx::query(&finished_sql)
                    .bind(&event_bytes)
                    .bind(state_name(event.state))
                    .bind(to_db(now_ms))
                    .bind(event.state.is_terminal())
                    .bind(task)
                    .bind(attempt)
                    .execute(&mut *tx)
                    .await
                    .map_err(self.query_error())?;
            }
            None => {
                pruned = self.make_room(&mut tx, now_ms).await?;
                sqlx::query(
                    "INSERT INTO attempts (task_id, attempt, assignment, last_event, state, valid_until_ms, updated_ms)
                     VALUES (?, ?, NULL, ?, ?, ?, ?)",
                )
                .bind(task)
                .bind(attempt)
                .bind(&event_bytes)
                .bind(state_name(event.state))
                .bind(to_db(
                    now_ms.saturating_add(duration_ms(CANCEL_ONLY_RETENTION)),
                ))
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await
                .map_err(self.query_error())?;
            }
        }
        insert_outbox(&mut tx, event, &event_bytes, now_ms)
            .await
            .map_err(self.query_error())?;
        tx.commit().await.map_err(self.query_error())?;
        Ok(pruned)
    }

    /// Drops an acknowledged event from the outbox. Once a final event is
    /// acknowledged, the attempt's remembered copy drops its output: a
    /// redelivery then re-publishes the state alone, which the coordinator,
    /// holding the result already, records as a duplicate. Returns whether
    /// the event was waiting.
    pub async fn ack(
        &self,
        task_id: &TaskId,
        attempt: u32,
        state: TaskState,
    ) -> Result<bool, JournalError> {
        let mut tx = self.pool.begin().await.map_err(self.query_error())?;
        let deleted =
            sqlx::query("DELETE FROM outbox WHERE task_id = ? AND attempt = ? AND state = ?")
                .bind(task_id.as_str())
                .bind(i64::from(attempt))
                .bind(state_name(state))
                .execute(&mut *tx)
                .await
                .map_err(self.query_error())?
                .rows_affected();
        if state.is_terminal() {
            let last: Option<Vec<u8>> = sqlx::query_scalar(
                "SELECT last_event FROM attempts WHERE task_id = ? AND attempt = ? AND state = ?",
            )
            .bind(task_id.as_str())
            .bind(i64::from(attempt))
            .bind(state_name(state))
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.query_error())?;
            if let Some(Ok(mut event)) = last.map(|bytes| stored_event(&bytes)) {
                if !event.output.is_empty() {
                    event.output.clear();
                    sqlx::query(
                        "UPDATE attempts SET last_event = ? WHERE task_id = ? AND attempt = ?",
                    )
                    .bind(starling_proto::encode(&event)?)
                    .bind(task_id.as_str())
                    .bind(i64::from(attempt))
                    .execute(&mut *tx)
                    .await
                    .map_err(self.query_error())?;
                }
            }
        }
        tx.commit().await.map_err(self.query_error())?;
        Ok(deleted > 0)
    }

    /// Up to `limit` unacknowledged events after `after_seq`, oldest first,
    /// journaled no later than `created_before_ms` (Unix ms). Rows that do
    /// not decode even as an older version are left out (and stay).
    pub async fn unacked(
        &self,
        after_seq: i64,
        created_before_ms: u64,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, JournalError> {
        let rows = sqlx::query(
            "SELECT seq, created_ms, event FROM outbox
             WHERE seq > ? AND created_ms <= ? ORDER BY seq LIMIT ?",
        )
        .bind(after_seq)
        .bind(to_db(created_before_ms))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(self.query_error())?;
        let mut entries = Vec::with_capacity(rows.len());
        for row in rows {
            let seq: i64 = row.get(0);
            let created: i64 = row.get(1);
            let bytes: Vec<u8> = row.get(2);
            match stored_event(&bytes) {
                Ok(event) => entries.push(OutboxEntry {
                    seq,
                    created_ms: from_db(created),
                    event,
                }),
                Err(error) => {
                    tracing::warn!(seq, %error, "skipping an outbox event that does not decode")
                }
            }
        }
        Ok(entries)
    }

    /// How many events await acknowledgement and how many attempts are
    /// remembered.
    pub async fn counts(&self) -> Result<(usize, usize), JournalError> {
        let outbox: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(&self.pool)
            .await
            .map_err(self.query_error())?;
        let attempts: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM attempts")
            .fetch_one(&self.pool)
            .await
            .map_err(self.query_error())?;
        Ok((
            usize::try_from(outbox).unwrap_or(0),
            usize::try_from(attempts).unwrap_or(0),
        ))
    }

    /// Closes the connections, waiting for them to finish.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Checks the bounds before a new attempt is added, pruning finished
    /// attempts when that makes room (see the module documentation).
    async fn make_room(
        &self,
        tx: &mut SqliteConnection,
        now_ms: u64,
    ) -> Result<Vec<AttemptKey>, JournalError> {
        let outbox: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(&mut *tx)
            .await
            .map_err(self.query_error())?;
        if usize::try_from(outbox).unwrap_or(usize::MAX) >= self.limits.max_entries {
            return Err(JournalError::Full {
                what: "unacknowledged events",
                limit: self.limits.max_entries,
            });
        }
        let attempts: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM attempts")
            .fetch_one(&mut *tx)
            .await
            .map_err(self.query_error())?;
        let attempts = usize::try_from(attempts).unwrap_or(usize::MAX);
        if attempts < self.limits.max_attempts {
            return Ok(Vec::new());
        }
        let excess = attempts + 1 - self.limits.max_attempts;
        let prunable_sql = format!(
            "SELECT task_id, attempt FROM attempts a
             WHERE state IN {TERMINAL} AND valid_until_ms <= ?
               AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task_id = a.task_id AND o.attempt = a.attempt)
             ORDER BY updated_ms, rowid LIMIT ?"
        );
        let rows = sqlx::query(&prunable_sql)
            .bind(to_db(now_ms))
            .bind(i64::try_from(excess).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(self.query_error())?;
        if rows.len() < excess {
            return Err(JournalError::Full {
                what: "remembered attempts",
                limit: self.limits.max_attempts,
            });
        }
        let mut pruned = Vec::with_capacity(rows.len());
        for row in rows {
            let task: String = row.get(0);
            let attempt: i64 = row.get(1);
            sqlx::query("DELETE FROM attempts WHERE task_id = ? AND attempt = ?")
                .bind(&task)
                .bind(attempt)
                .execute(&mut *tx)
                .await
                .map_err(self.query_error())?;
            if let (Ok(task), Ok(attempt)) = (TaskId::new(&task), u32::try_from(attempt)) {
                pruned.push((task, attempt));
            }
        }
        Ok(pruned)
    }
}

async fn insert_outbox(
    tx: &mut SqliteConnection,
    event: &TaskEvent,
    bytes: &[u8],
    now_ms: u64,
) -> Result<(), sqlx::Error> {
    // The same state twice (a re-run after a restart reports `running`
    // again) keeps the first: the coordinator records each state once.
    sqlx::query(
        "INSERT INTO outbox (task_id, attempt, state, event, created_ms) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (task_id, attempt, state) DO NOTHING",
    )
    .bind(event.task_id.as_str())
    .bind(i64::from(event.attempt))
    .bind(state_name(event.state))
    .bind(bytes)
    .bind(to_db(now_ms))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A journaled event, of this protocol version or an older one whose fields
/// still fit, as this version sends it: a row an older agent wrote before an
/// upgrade is re-sent, not orphaned. (Assignments keep their version: it is
/// under the coordinator's signature, and a restored attempt is only run.)
fn stored_event(bytes: &[u8]) -> Result<TaskEvent, DecodeError> {
    let mut event: TaskEvent = starling_proto::decode_stored(bytes)?;
    event.v = starling_proto::PROTOCOL_VERSION;
    Ok(event)
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use starling_proto::{NodeId, PROTOCOL_VERSION};

    fn event_of_version(v: u16) -> Vec<u8> {
        let mut event = TaskEvent::state(
            TaskId::new("t").unwrap(),
            1,
            NodeId::new("n").unwrap(),
            TaskState::Running,
        );
        event.v = v;
        starling_proto::encode(&event).unwrap()
    }

    #[test]
    fn rows_of_an_older_version_are_read_and_sent_as_this_one() {
        // They were skipped before, orphaning in-flight attempts after an upgrade.
        let older = event_of_version(PROTOCOL_VERSION - 1);
        assert!(starling_proto::decode::<TaskEvent>(&older).is_err());
        let event = stored_event(&older).unwrap();
        assert_eq!(event.v, PROTOCOL_VERSION);
        assert_eq!(event.state, TaskState::Running);
        // A newer version (a downgrade) is not guessed at.
        let newer = event_of_version(PROTOCOL_VERSION + 1);
        assert!(matches!(
            stored_event(&newer),
            Err(DecodeError::UnsupportedVersion { .. })
        ));
    }
}
