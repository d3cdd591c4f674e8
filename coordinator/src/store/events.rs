//! The `events` and `attempts` tables: agents' events, recorded once and
//! applied to their task as [`crate::domain::reconcile()`] decides, and each
//! task's history.

use starling_proto::{TaskEvent, TaskState};

use super::{from_db, to_db, with_pool, Backend, Store, StoreError, TaskRow, TASK_COLUMNS};
use crate::domain::{reconcile, EventFacts, NodeAfter, Reconciliation, ResultUpdate, TaskFacts};
use crate::task::TaskStatus;
use starling_api::TaskChange;

/// One stored task event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    /// Attempt number.
    pub attempt: u32,
    /// Event state (`accepted`, `running`, `succeeded`, `failed`, `cancelled`, `rejected` when the
    /// agent refused the assignment, or `lost` when the node vanished).
    pub state: String,
    /// The node that sent it; for a forwarded attempt, the node at `site`
    /// that ran it, when that site said.
    pub node_id: Option<String>,
    /// For an event of an attempt forwarded to another site: that site.
    pub site: Option<String>,
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
    pub metrics: Option<serde_json::Value>,
    /// The power level the attempt ran under, as the agent applied it.
    pub power: Option<serde_json::Value>,
}

/// One attempt of a task.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    /// Attempt number, from 1.
    pub attempt: u32,
    /// The node of this site it was sent to; `None` when it was forwarded.
    pub node_id: Option<String>,
    /// The site it was forwarded to; `None` when it ran here.
    pub site: Option<String>,
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

/// One event for [`Store::record_events`], with the report mark that came
/// with it (raised in the same transaction).
#[derive(Debug, Clone)]
pub struct EventToRecord<'a> {
    /// The event, as the node reported it.
    pub event: &'a TaskEvent,
    /// The signed report's counter to record as the node's highest on its
    /// channel, when the report was signed.
    pub mark: Option<ReportMark>,
}

/// A report counter to keep as a node's highest on one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportMark {
    /// The node.
    pub node_id: String,
    /// The channel's stored name (`crate::domain::reports::channel_name`).
    pub channel: &'static str,
    /// The counter.
    pub counter: u64,
}

/// An `events` row.
#[derive(sqlx::FromRow)]
struct EventRow {
    attempt: i64,
    state: String,
    node_id: Option<String>,
    site: Option<String>,
    received_ms: i64,
    reason: Option<String>,
    message: Option<String>,
    exit_code: Option<i64>,
    output_bytes: i64,
    metrics: Option<String>,
    power: Option<String>,
}

/// An `attempts` row.
#[derive(sqlx::FromRow)]
struct AttemptRow {
    attempt: i64,
    node_id: Option<String>,
    site: Option<String>,
    power_level: i64,
    assigned_ms: i64,
    state: String,
    finished_ms: Option<i64>,
}

/// The name an event's state is stored under.
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

impl EventRow {
    /// The event the row holds; unreadable metrics read as none.
    fn into_record(self) -> EventRecord {
        EventRecord {
            attempt: u32::try_from(self.attempt).unwrap_or(0),
            state: self.state,
            node_id: self.node_id,
            site: self.site,
            received_ms: from_db(self.received_ms),
            reason: self.reason,
            message: self.message,
            exit_code: self.exit_code.and_then(|code| i32::try_from(code).ok()),
            output_bytes: from_db(self.output_bytes),
            metrics: self
                .metrics
                .and_then(|text| serde_json::from_str(&text).ok()),
            power: self.power.and_then(|text| serde_json::from_str(&text).ok()),
        }
    }
}

impl Store {
    /// Records an agent's event once and applies it to the task's state:
    /// [`Store::record_events`] with a batch of one.
    pub async fn record_event(
        &self,
        event: &TaskEvent,
        now_ms: u64,
        max_attempts: u32,
    ) -> Result<EventOutcome, StoreError> {
        let mut outcomes = self
            .record_events(&[EventToRecord { event, mark: None }], now_ms, max_attempts)
            .await?;
        // `record_events` answers one outcome per event (or an error), so the
        // fallback is never taken.
        Ok(outcomes.pop().unwrap_or(EventOutcome::UnknownTask))
    }

    /// Records agents' events, each once, applies them to their tasks' states
    /// in order, and raises the report marks that came with them: all in one
    /// transaction (group commit), so a burst of events costs one commit
    /// rather than one each. Returns one outcome per event, in order; when
    /// the transaction fails, nothing of the batch is recorded.
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
    ///
    /// These rules are [`crate::domain::reconcile()`]'s; this reads the rows it
    /// looks at and applies its answer. Each event has its own savepoint, so
    /// one that records nothing leaves no trace while the others stand.
    pub async fn record_events(
        &self,
        batch: &[EventToRecord<'_>],
        now_ms: u64,
        max_attempts: u32,
    ) -> Result<Vec<EventOutcome>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mark_sql = "INSERT INTO report_marks (node_id, channel, counter) VALUES ($1, $2, $3) \
                        ON CONFLICT (node_id, channel) DO UPDATE SET counter = excluded.counter \
                        WHERE excluded.counter > report_marks.counter";
        let touch = "UPDATE tasks SET updated_ms = $2 WHERE id = $1";
        let insert = "INSERT INTO events (task_id, attempt, state, node_id, received_ms, reason, message, \
                      exit_code, output_bytes, metrics, power) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
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

        let mut outcomes = Vec::with_capacity(batch.len());
        let mut changes = Vec::new();
        with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            // The marks first: a write, so that SQLite takes its write lock
            // before any read (the events' own statements write first too).
            for mark in batch.iter().filter_map(|item| item.mark.as_ref()) {
                sqlx::query(mark_sql)
                    .bind(&mark.node_id)
                    .bind(mark.channel)
                    .bind(to_db(mark.counter))
                    .execute(&mut *tx)
                    .await?;
            }
            for EventToRecord { event, .. } in batch {
                let task_id = event.task_id.as_str();
                let node = event.node_id.as_str();
                let state_name = event_state_name(event.state);
                let reason = event.reason.map(failure_reason_name);
                let message = event.message.as_ref().map(|m| m.as_str().to_string());
                let metrics = event
                    .metrics
                    .as_ref()
                    .and_then(|metrics| serde_json::to_string(metrics).ok());
                let power = event
                    .power
                    .as_ref()
                    .and_then(|power| serde_json::to_string(power).ok());
                let event_facts = EventFacts {
                    node,
                    attempt: event.attempt,
                    state: event.state,
                    reason: event.reason,
                };
                let mut sp = sqlx::Connection::begin(&mut *tx).await?;
                // `(outcome, keep)`: whether the savepoint's writes stand.
                let (outcome, keep) = 'event: {
                    // The write first, so that SQLite takes its write lock before the reads.
                    let touched = sqlx::query(touch)
                        .bind(task_id)
                        .bind(to_db(now_ms))
                        .execute(&mut *sp)
                        .await?
                        .rows_affected();
                    if touched == 0 {
                        break 'event (EventOutcome::UnknownTask, false);
                    }
                    // A forwarded attempt has no node (NULL): no event of a node
                    // of this site is its owner's.
                    let assigned_to: Option<(Option<String>,)> = sqlx::query_as(attempt_node)
                        .bind(task_id)
                        .bind(i64::from(event.attempt))
                        .fetch_optional(&mut *sp)
                        .await?;
                    // Read before the event's own rows are written; those touch
                    // neither the task nor its attempts, so this is the task as it
                    // stands when the event arrives.
                    let row: TaskRow = sqlx::query_as(&select).bind(task_id).fetch_one(&mut *sp).await?;
                    let task = row.into_record()?;
                    let task_facts = TaskFacts {
                        status: task.status,
                        attempt: task.attempt,
                        node: task.node_id.as_deref(),
                        cancel_requested: task.cancel_requested,
                    };
                    let assigned = assigned_to.as_ref().and_then(|(assigned,)| assigned.as_deref());
                    let decision = reconcile(&task_facts, assigned, &event_facts, max_attempts);
                    if !decision.records_event() {
                        break 'event (EventOutcome::NotAssigned, false);
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
                        .bind(power.as_deref())
                        .execute(&mut *sp)
                        .await?
                        .rows_affected();
                    if inserted == 0 {
                        break 'event (EventOutcome::Duplicate, false);
                    }
                    if decision.acknowledges() {
                        sqlx::query(acknowledge)
                            .bind(task_id)
                            .bind(i64::from(event.attempt))
                            .bind(node)
                            .execute(&mut *sp)
                            .await?;
                    }
                    let Some(change) = decision.update() else {
                        break 'event (match decision {
                            Reconciliation::Stale { .. } => EventOutcome::Stale { status: task.status },
                            _ => EventOutcome::Recorded { status: task.status, changed: false },
                        }, true);
                    };
                    let (output, exit_code, failure_reason, failure_message) = match change.result {
                        ResultUpdate::Output => (Some(event.output.clone()), event.exit_code, None, None),
                        ResultUpdate::Failure => (None, event.exit_code, reason.clone(), message.clone()),
                        ResultUpdate::Keep => (task.output.clone(), task.exit_code, task.failure_reason.clone(), task.failure_message.clone()),
                    };
                    let node_id = match change.node {
                        NodeAfter::Sender => Some(node),
                        NodeAfter::Cleared => None,
                    };
                    sqlx::query(update)
                        .bind(task_id)
                        .bind(change.status.as_str())
                        .bind(output)
                        .bind(exit_code.map(i64::from))
                        .bind(failure_reason)
                        .bind(failure_message)
                        .bind(node_id)
                        .execute(&mut *sp)
                        .await?;
                    let finished = change.attempt_ended.then(|| to_db(now_ms));
                    sqlx::query(update_attempt)
                        .bind(task_id)
                        .bind(i64::from(event.attempt))
                        .bind(event_state_name(change.attempt_state))
                        .bind(finished)
                        .execute(&mut *sp)
                        .await?;
                    if change.attempt_ended {
                        // Nothing is left to deliver for an ended or requeued task.
                        sqlx::query(clear_outbox).bind(task_id).execute(&mut *sp).await?;
                    }
                    let changed = change.status != task.status;
                    if changed {
                        changes.push(TaskChange {
                            task_id: task_id.to_owned(),
                            status: change.status,
                            attempt: event.attempt,
                            node_id: node_id.map(str::to_owned),
                            site: None,
                            power_level: task.power_level,
                            reason: reason.clone().filter(|_| change.status == TaskStatus::Failed),
                            at_ms: now_ms,
                        });
                    }
                    (EventOutcome::Recorded { status: change.status, changed }, true)
                };
                if keep {
                    sp.commit().await?;
                } else {
                    sp.rollback().await?;
                }
                outcomes.push(outcome);
            }
            tx.commit().await?;
        });
        // Announced once committed: nothing a crash could take back.
        for change in changes {
            self.announce(change);
        }
        Ok(outcomes)
    }

    /// A task's events, oldest first; events received in the same millisecond
    /// come in lifecycle order.
    pub async fn events(&self, task_id: &str) -> Result<Vec<EventRecord>, StoreError> {
        let sql = "SELECT attempt, state, node_id, site, received_ms, reason, message, exit_code, output_bytes, metrics, power \
                   FROM events WHERE task_id = $1 ORDER BY received_ms ASC, attempt ASC, \
                   CASE state WHEN 'accepted' THEN 0 WHEN 'running' THEN 1 WHEN 'lost' THEN 3 ELSE 2 END ASC";
        let rows: Vec<EventRow> =
            with_pool!(self, pool => sqlx::query_as(sql).bind(task_id).fetch_all(pool).await)?;
        Ok(rows.into_iter().map(EventRow::into_record).collect())
    }

    /// A task's attempts, first first.
    pub async fn attempts(&self, task_id: &str) -> Result<Vec<AttemptRecord>, StoreError> {
        let sql = "SELECT attempt, node_id, site, power_level, assigned_ms, state, finished_ms \
                   FROM attempts WHERE task_id = $1 ORDER BY attempt ASC";
        let rows: Vec<AttemptRow> =
            with_pool!(self, pool => sqlx::query_as(sql).bind(task_id).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|row| AttemptRecord {
                attempt: u32::try_from(row.attempt).unwrap_or(0),
                node_id: row.node_id,
                site: row.site,
                power_level: u8::try_from(row.power_level).unwrap_or(0),
                assigned_ms: from_db(row.assigned_ms),
                state: row.state,
                finished_ms: row.finished_ms.map(from_db),
            })
            .collect())
    }
}
