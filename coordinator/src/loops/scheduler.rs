//! The scheduler loop: takes the pending queue from the store and a snapshot of
//! the registry, asks the placement policy for decisions, records them (with
//! their explanations) and publishes each placement as a signed `Assignment`
//! (the first send of the outbox row written with the placement).

use std::sync::Arc;
use std::time::Duration;

use starling_placement::Policy;
use tokio::sync::{watch, Notify};

use crate::federation::Federation;
use crate::loops::cluster_view::{Snapshot, ViewSource, QUEUE_WINDOW};
use crate::loops::round::{Round, Step};
use crate::mqtt::publish::Publisher;
use crate::store::{OutboxEntry, StoreError, TaskRecord};
use crate::task::{unix_now_ms, TaskStatus};

/// Why a scheduling round stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The store failed.
    #[error("scheduling round failed: {0}")]
    Store(#[from] StoreError),
}

/// What one scheduling round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundSummary {
    /// Tasks placed and published.
    pub placed: usize,
    /// Tasks the policy held back.
    pub held: usize,
    /// Tasks sent to another site.
    pub forwarded: usize,
}

/// What the scheduler uses, and nothing else.
pub(crate) struct Scheduler {
    /// The snapshot of nodes and queue each round decides over.
    pub(crate) views: ViewSource,
    /// Sends the first copy of each assignment.
    pub(crate) publisher: Publisher,
    /// The federation, when this site has peers to forward to.
    pub(crate) federation: Option<Arc<Federation>>,
    /// Woken by new tasks, node changes and finished work.
    pub(crate) wake: Arc<Notify>,
}

/// Runs rounds when woken (new task, node change, finished task) and at least
/// every `interval`, until told to stop.
pub(crate) async fn run(
    scheduler: Scheduler,
    mut policy: Box<dyn Policy>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match scheduler.round(policy.as_mut()).await {
            Ok(summary) if summary.placed > 0 => {
                tracing::debug!(?summary, "scheduling round")
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "scheduling round failed; retrying"),
        }
        tokio::select! {
            _ = scheduler.wake.notified() => {}
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
}

impl Scheduler {
    /// One round: place what the policy places (here, or at a peer site when
    /// federated and the task cannot meet its deadline here), record why the
    /// rest waits.
    pub(crate) async fn round(
        &self,
        policy: &mut dyn Policy,
    ) -> Result<RoundSummary, ScheduleError> {
        let store = &self.views.store;
        let pending = store.pending_tasks(QUEUE_WINDOW).await?;
        if pending.is_empty() {
            return Ok(RoundSummary::default());
        }
        let Snapshot {
            view,
            ids,
            pending,
            queue,
        } = self.views.snapshot(pending).await?;
        let now_ms = view.now_ms;
        let sites = self
            .federation
            .as_ref()
            .map(|federation| federation.remote_sites(&[]))
            .unwrap_or_default();
        let mut round = Round::new(sites, now_ms);
        let decisions = policy.decide(&view, &queue);

        let mut summary = RoundSummary::default();
        for decision in decisions {
            // A site this task was taken back from is not tried again for it.
            let excluded = match usize::try_from(decision.task_key)
                .ok()
                .and_then(|index| pending.get(index))
            {
                Some(record) if round.may_forward(record) && record.attempt > 0 => {
                    store.abandoned_sites(&record.spec.id).await?
                }
                _ => Vec::new(),
            };
            match round.step(&decision, &pending, &queue, &ids, &excluded) {
                Step::Invalid(why) => {
                    tracing::warn!(key = decision.task_key, "{why}");
                }
                Step::Forward {
                    task,
                    site,
                    name,
                    api_url,
                    attempt,
                    explanation,
                } => {
                    let record = &pending[task];
                    let recorded = store
                        .forward_task(
                            &record.spec.id,
                            attempt,
                            &name,
                            &api_url,
                            &explanation,
                            now_ms,
                        )
                        .await?;
                    if recorded {
                        round.forwarded(site, &queue[task]);
                        tracing::info!(task = %record.spec.id, site = %name, attempt, summary = %explanation["summary"], "task goes to another site");
                        if let Some(federation) = &self.federation {
                            federation.wake_forwarder.notify_one();
                        }
                        summary.forwarded += 1;
                    }
                    // Not recorded: cancelled or placed elsewhere since it was read.
                }
                Step::Place {
                    task,
                    node_id,
                    attempt,
                    power_level,
                    explanation,
                } => {
                    let record = &pending[task];
                    let assigned = store
                        .assign_task(
                            &record.spec.id,
                            attempt,
                            node_id.as_str(),
                            power_level,
                            &explanation,
                            now_ms,
                        )
                        .await?;
                    if !assigned {
                        // Cancelled or placed by another replica since it was read.
                        continue;
                    }
                    let entry = OutboxEntry {
                        task_id: record.spec.id.clone(),
                        attempt,
                        node_id: node_id.to_string(),
                        next_send_ms: now_ms,
                        sends: 0,
                    };
                    let placed = TaskRecord {
                        status: TaskStatus::Assigned,
                        node_id: Some(node_id.to_string()),
                        attempt,
                        power_level: Some(power_level),
                        ..record.clone()
                    };
                    if self
                        .publisher
                        .send_assignment(&entry, &placed, unix_now_ms())
                        .await?
                    {
                        tracing::info!(task = %record.spec.id, node = %node_id, attempt, power_level, "task assigned");
                    }
                    summary.placed += 1;
                }
                Step::Hold { task, explanation } => {
                    store
                        .hold_task(&pending[task].spec.id, &explanation)
                        .await?;
                    summary.held += 1;
                }
            }
        }
        Ok(summary)
    }
}
