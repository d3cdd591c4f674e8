//! Assignment delivery that does not rest on the broker's memory.
//!
//! Every placement writes an outbox row in the same transaction (see
//! `Store::assign_task`). The scheduler claims and makes the first send at
//! once; this loop re-sends rows that stay unacknowledged, rebuilt from the
//! stored task and signed anew, with backoff from `resend_interval` doubling
//! up to [`MAX_BACKOFF`]. Any event other than `rejected` from the assigned
//! node for the attempt deletes the row (`Store::record_event`), as do a
//! requeue, a cancel and the task's end. After a crash, rows left
//! unacknowledged are due and go out on the next start.
//!
//! Each send is claimed in the store first (`Store::claim_outbox_send`), so
//! two replicas on one database, or the scheduler and this loop, never send
//! the same due row twice; a duplicate would be harmless anyway, since an
//! agent answers an attempt it knows with that attempt's last event.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::QoS;
use starling_proto::{encode, Channel, NodeId};
use tokio::sync::watch;

use crate::scheduler::assignment;
use crate::store::{OutboxEntry, StoreError, TaskRecord};
use crate::task::{unix_now_ms, TaskStatus};
use crate::{Counters, Shared};

/// The longest wait between two sends of an unacknowledged assignment (unless
/// the configured first interval is longer still).
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Most due rows handled in one pass of the loop.
const BATCH: u32 = 256;

/// The wait after the `sends_before`-th send: `interval`, doubling with each
/// send, capped at [`MAX_BACKOFF`] (or at `interval` when that is longer).
pub fn backoff(interval: Duration, sends_before: u32) -> Duration {
    let cap = MAX_BACKOFF.max(interval);
    let factor = 2u32.saturating_pow(sends_before.min(16));
    interval.saturating_mul(factor).min(cap)
}

fn to_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Re-sends due outbox rows until told to stop.
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    // Often enough that a row is re-sent close to its due time, rarely enough
    // that an idle coordinator barely touches the database.
    let tick =
        (shared.resend_interval / 5).clamp(Duration::from_millis(100), Duration::from_secs(1));
    // What an earlier run sent and never saw acknowledged is due at once: its
    // node may have missed it while this coordinator was down, and a crash
    // between claiming a send and publishing it leaves a row that says sent.
    match shared.store.outbox_due_by(unix_now_ms()).await {
        Ok(0) => {}
        Ok(rows) => tracing::info!(
            rows,
            "re-sending assignments left unacknowledged by an earlier run"
        ),
        Err(error) => {
            tracing::warn!(%error, "cannot reschedule the outbox; rows go out at their due times")
        }
    }
    loop {
        if let Err(error) = resend_due(&shared).await {
            tracing::warn!(%error, "cannot re-send unacknowledged assignments; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
}

/// One pass: every due row whose task still waits on that attempt is claimed
/// and sent; rows whose task moved on are dropped.
pub(crate) async fn resend_due(shared: &Shared) -> Result<usize, StoreError> {
    let now_ms = unix_now_ms();
    let mut sent = 0;
    for entry in shared.store.due_outbox(now_ms, BATCH).await? {
        let task = shared.store.task(&entry.task_id).await?;
        let Some(task) = task.filter(|task| {
            task.attempt == entry.attempt
                && task.node_id.as_deref() == Some(entry.node_id.as_str())
                && matches!(task.status, TaskStatus::Assigned | TaskStatus::Running)
        }) else {
            shared
                .store
                .drop_outbox(&entry.task_id, entry.attempt)
                .await?;
            continue;
        };
        if send(shared, &entry, &task, now_ms).await? {
            if entry.sends > 0 {
                Counters::increment(&shared.counters.assignments_resent);
                tracing::info!(
                    task = %entry.task_id,
                    attempt = entry.attempt,
                    node = %entry.node_id,
                    sends = entry.sends + 1,
                    "assignment not acknowledged; sent again"
                );
            }
            sent += 1;
        }
    }
    Ok(sent)
}

/// Claims the send of `entry` (as read) and publishes the assignment of
/// `task`'s attempt, freshly signed. Returns whether this call sent it.
pub(crate) async fn send(
    shared: &Shared,
    entry: &OutboxEntry,
    task: &TaskRecord,
    now_ms: u64,
) -> Result<bool, StoreError> {
    let Ok(node) = NodeId::new(&entry.node_id) else {
        // Node ids are checked when nodes register, so the store cannot hold
        // a bad one unless it was edited by hand; drop the row, keep going.
        tracing::error!(node = %entry.node_id, "outbox row for an invalid node id dropped");
        shared
            .store
            .drop_outbox(&entry.task_id, entry.attempt)
            .await?;
        return Ok(false);
    };
    let next_ms = now_ms.saturating_add(to_ms(backoff(shared.resend_interval, entry.sends)));
    if !shared.store.claim_outbox_send(entry, next_ms).await? {
        return Ok(false);
    }
    let power_level = task.power_level.unwrap_or(0);
    // Read at each send, so a signature added after submission reaches
    // the next (re)send.
    let publisher = shared.store.artifact_publisher(&task.spec.artifact).await?;
    let bytes = match assignment(task, &node, entry.attempt, power_level, &shared.public_url)
        .and_then(|mut assignment| {
            assignment.publisher = publisher;
            shared
                .signer
                .sign(&mut assignment, &node, now_ms)
                .map_err(|e| e.to_string())?;
            encode(&assignment).map_err(|e| e.to_string())
        }) {
        Ok(bytes) => bytes,
        Err(detail) => {
            // The submission was checked against these bounds, so this only
            // happens with a misconfigured public URL.
            tracing::error!(task = %entry.task_id, %detail, "cannot build the assignment");
            return Ok(false);
        }
    };
    let topic = shared.topics.node(&node, Channel::Assign);
    // Not the task that polls the MQTT event loop, so waiting for room in the
    // request queue cannot deadlock.
    if let Err(error) = shared
        .mqtt
        .publish(topic, QoS::AtLeastOnce, false, bytes)
        .await
    {
        // The row stays; the next due time sends it again.
        tracing::warn!(task = %entry.task_id, %error, "cannot publish the assignment");
        return Ok(false);
    }
    Counters::increment(&shared.counters.assignments_published);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let five = Duration::from_secs(5);
        let waits: Vec<u64> = (0..7).map(|n| backoff(five, n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60, 60]);
        assert_eq!(backoff(five, u32::MAX), MAX_BACKOFF);
        let long = Duration::from_secs(90);
        assert_eq!(backoff(long, 3), long);
        let short = Duration::from_millis(200);
        assert_eq!(backoff(short, 2), Duration::from_millis(800));
    }
}
