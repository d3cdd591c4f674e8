//! Assignment delivery that does not rest on the broker's memory.
//!
//! Every placement writes an outbox row in the same transaction (see
//! `Store::assign_task`). The scheduler claims and makes the first send at
//! once; this loop re-sends rows that stay unacknowledged, rebuilt from the
//! stored task and signed anew, with backoff from `resend_interval` doubling
//! up to `domain::delivery::MAX_BACKOFF`. Any event other than `rejected` from the assigned
//! node for the attempt deletes the row (`Store::record_event`), as do a
//! requeue, a cancel and the task's end. After a crash, rows left
//! unacknowledged are due and go out on the next start.
//!
//! Each send is claimed in the store first (`Store::claim_outbox_send`), so
//! two replicas on one database, or the scheduler and this loop, never send
//! the same due row twice; a duplicate would be harmless anyway, since an
//! agent answers an attempt it knows with that attempt's last event.

use std::time::Duration;

use tokio::sync::watch;

use crate::counters::Counters;
use crate::mqtt::publish::{ArtifactPublishers, Publisher};
use crate::store::StoreError;
use crate::task::{unix_now_ms, TaskStatus};

/// Most due rows handled in one pass of the loop.
const BATCH: u32 = 256;

/// What the re-send loop uses: the publisher (which holds the store and the
/// first re-send interval) and nothing else.
pub(crate) struct Outbox {
    /// Claims and sends assignments.
    pub(crate) publisher: Publisher,
}

/// Re-sends due outbox rows until told to stop.
pub(crate) async fn run(outbox: Outbox, mut stop: watch::Receiver<bool>) {
    // Often enough that a row is re-sent close to its due time, rarely enough
    // that an idle coordinator barely touches the database.
    let tick = (outbox.publisher.resend_interval / 5)
        .clamp(Duration::from_millis(100), Duration::from_secs(1));
    // What an earlier run sent and never saw acknowledged is due at once: its
    // node may have missed it while this coordinator was down, and a crash
    // between claiming a send and publishing it leaves a row that says sent.
    match outbox.publisher.store.outbox_due_by(unix_now_ms()).await {
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
        if let Err(error) = outbox.resend_due().await {
            tracing::warn!(%error, "cannot re-send unacknowledged assignments; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
}

impl Outbox {
    /// One pass: every due row whose task still waits on that attempt is
    /// claimed and sent; rows whose task moved on are dropped.
    pub(crate) async fn resend_due(&self) -> Result<usize, StoreError> {
        let store = &self.publisher.store;
        if !store.leads() {
            // The leading replica sends.
            return Ok(0);
        }
        let now_ms = unix_now_ms();
        let mut sent = 0;
        let mut publishers = ArtifactPublishers::default();
        for entry in store.due_outbox(now_ms, BATCH).await? {
            let task = store.task(&entry.task_id).await?;
            let Some(task) = task.filter(|task| {
                task.attempt == entry.attempt
                    && task.node_id.as_deref() == Some(entry.node_id.as_str())
                    && matches!(task.status, TaskStatus::Assigned | TaskStatus::Running)
            }) else {
                store.drop_outbox(&entry.task_id, entry.attempt).await?;
                continue;
            };
            if self
                .publisher
                .send_assignment(&entry, &task, &mut publishers, now_ms)
                .await?
            {
                if entry.sends > 0 {
                    Counters::increment(&self.publisher.counters.assignments_resent);
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
}
