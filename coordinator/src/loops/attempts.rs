//! Every attempt ends: the loop around `domain::attempts`. Each second it
//! reads the attempts in flight on this site's nodes (store) and every node's
//! latest telemetry (registry), asks the [`Reviewer`] with the coordinator's
//! clock, ends what it answers (the store places the task again or fails it,
//! and the node gets a `Cancel`) and cancels on nodes what they run that the
//! coordinator does not have in flight there.
//!
//! `liveness` handles nodes that are offline or silent; this loop handles
//! nodes that stay online with an attempt that never ends: one that runs past
//! its wall-time limit, or one the node does not hold at all (a journal lost
//! or an assignment that never arrived).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::counters::Counters;
use crate::domain::attempts::{AttemptEnd, InFlight, NodeReport, Review, Reviewer, Verdict};
use crate::mqtt::publish::Publisher;
use crate::registry::NodeRegistry;
use crate::store::{Store, StoreError};
use crate::task::unix_now_ms;

/// How often attempts are reviewed, at most.
const MAX_TICK: Duration = Duration::from_secs(1);

/// Most in-flight attempts read per review; past it, the review only ends
/// attempts and cancels nothing (an attempt not read could look unknown).
const MAX_REVIEWED: u32 = 50_000;

/// The grace, in node timeouts (30 s with the default 5 s): long enough
/// for an assignment in flight, a final event re-sent by the agent (every
/// 5 s), and a few lost telemetry samples; short against any wall-time limit
/// worth placing a task for.
pub(crate) const GRACE_NODE_TIMEOUTS: u64 = 6;

/// What the attempt review uses, and nothing else.
pub(crate) struct Attempts {
    /// The nodes' latest telemetry.
    pub(crate) registry: Arc<NodeRegistry>,
    /// Where in-flight attempts are read and ended.
    pub(crate) store: Store,
    /// Sends the cancels.
    pub(crate) publisher: Publisher,
    /// `starling_attempts_ended_total`, `starling_stale_attempts_cancelled_total`.
    pub(crate) counters: Arc<Counters>,
    /// Woken when a task goes back to the queue.
    pub(crate) wake_scheduler: Arc<Notify>,
    /// Grace past the wall-time limit, and for an unlisted attempt, ms.
    pub(crate) grace_ms: u64,
    /// Attempts a task gets before an ended one fails it.
    pub(crate) max_attempts: u32,
}

/// Reviews attempts every second (or a quarter of the grace, if shorter)
/// until told to stop.
pub(crate) async fn run(attempts: Attempts, mut stop: watch::Receiver<bool>) {
    let tick =
        Duration::from_millis(attempts.grace_ms / 4).clamp(Duration::from_millis(50), MAX_TICK);
    let mut reviewer = Reviewer::default();
    loop {
        if let Err(error) = attempts.review(&mut reviewer, unix_now_ms()).await {
            tracing::warn!(%error, "attempt review failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
}

impl Attempts {
    /// One review at `now_ms`.
    pub(crate) async fn review(
        &self,
        reviewer: &mut Reviewer,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        if !self.store.leads() {
            // The leading replica reviews (and starts its own clock on what
            // it has not seen listed, so taking over ends nothing early).
            return Ok(());
        }
        let rows = self.store.in_flight_attempts(MAX_REVIEWED).await?;
        let complete_view = rows.len() < MAX_REVIEWED as usize;
        let in_flight = rows
            .into_iter()
            .map(|row| InFlight {
                task_id: row.task_id,
                attempt: row.attempt,
                node: row.node_id,
                assigned_ms: row.assigned_ms,
                running_since_ms: row.running_since_ms,
                wall_ms: row.wall_ms,
                answered: row.answered,
            })
            .collect();
        let reports = {
            let registry = self.registry.read();
            registry
                .nodes()
                .filter_map(|entry| {
                    let telemetry = entry.telemetry.as_ref()?;
                    Some(NodeReport {
                        node: entry.capability.node_id.to_string(),
                        online: entry.online(),
                        received_ms: entry.telemetry_received_ms?,
                        attempts: telemetry
                            .attempts
                            .iter()
                            .map(|listed| (listed.task_id.to_string(), listed.attempt))
                            .collect(),
                        complete: telemetry.attempts_complete,
                    })
                })
                .collect()
        };
        let verdicts = reviewer.review(Review {
            now_ms,
            grace_ms: self.grace_ms,
            in_flight,
            reports,
        });
        for verdict in verdicts {
            match verdict {
                Verdict::End {
                    task_id,
                    attempt,
                    node,
                    reason,
                } => {
                    let ended = self
                        .store
                        .end_attempt(
                            &task_id,
                            attempt,
                            &node,
                            reason.as_str(),
                            self.max_attempts,
                            now_ms,
                        )
                        .await?;
                    let Some(ended) = ended else { continue };
                    Counters::increment(match reason {
                        AttemptEnd::WallTimeExceeded => &self.counters.attempts_overdue,
                        AttemptEnd::UnknownToNode => &self.counters.attempts_unknown_to_node,
                        AttemptEnd::Unanswered => &self.counters.attempts_unanswered,
                    });
                    if reason == AttemptEnd::Unanswered {
                        // It keeps what it is given and says nothing: no
                        // more work for it until it answers.
                        let suspected = starling_proto::NodeId::new(&node)
                            .is_ok_and(|id| self.registry.write().suspect_unresponsive(&id));
                        if suspected {
                            tracing::warn!(node = %node, "the node leaves its assignments unanswered; it is offered no work until it answers one or connects again");
                        }
                    }
                    tracing::warn!(task = %task_id, attempt, node = %node, reason = reason.as_str(),
                        now = %ended.status, "{}; the attempt is ended", reason.describe());
                    self.cancel(&node, &task_id, attempt).await;
                    self.wake_scheduler.notify_one();
                }
                Verdict::Cancel {
                    node,
                    task_id,
                    attempt,
                } if complete_view => {
                    tracing::info!(task = %task_id, attempt, node = %node,
                        "node lists an attempt the coordinator does not have in flight there; cancelling it");
                    Counters::increment(&self.counters.stale_cancels);
                    self.cancel(&node, &task_id, attempt).await;
                }
                Verdict::Cancel { .. } => {}
            }
        }
        Ok(())
    }

    async fn cancel(&self, node: &str, task_id: &str, attempt: u32) {
        if let Err(error) = self.publisher.send_cancel(task_id, node, attempt).await {
            tracing::warn!(%error, task = %task_id, attempt, node = %node, "cannot send the cancel; the next review sends it again");
        }
    }
}
