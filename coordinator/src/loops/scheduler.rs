//! The scheduler loop: takes the pending queue from the store and a snapshot of
//! the registry, asks the placement policy for decisions, records them (with
//! their explanations) and publishes each placement as a signed `Assignment`
//! (the first send of the outbox row written with the placement).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_placement::capable::fleet_fingerprint;
use starling_placement::{estimate, ClusterView, Outcome, Policy};
use tokio::sync::{watch, Notify};

use crate::cluster_view::{
    pending_task, sort_window, withhold_behind, Snapshot, ViewSource, MAX_WINDOWS_PER_ROUND,
    QUEUE_WINDOW,
};
use crate::federation::Federation;
use crate::loops::round::{Round, Step};
use crate::mqtt::publish::{ArtifactPublishers, Publisher};
use crate::registry::ExpectedRun;
use crate::store::{OutboxEntry, Placement, StoreError, TaskRecord};
use crate::task::{unix_now_ms, TaskStatus};

/// Assignments a node may leave unanswered before it gets no more: an
/// agent answers each within milliseconds (`accepted`, or a refusal), so
/// several waiting means the node or its link is behind.
const MAX_UNANSWERED: u32 = 4;

/// How far ingest may be behind (the wait of the messages it applies) for a
/// round to place work.
const MAX_INGEST_LAG_MS: u64 = 1_000;

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
        if !store.leads() {
            // Another replica places this site's work.
            return Ok(RoundSummary::default());
        }
        let lag_ms = self.publisher.counters.ingest.lag_ms();
        if lag_ms > MAX_INGEST_LAG_MS {
            // The results of work already out wait for ingest; more work
            // now would only lengthen the wait (and past the agents' 5 s
            // re-send, every event would come twice).
            tracing::debug!(
                lag_ms,
                "ingest is behind; nothing placed until it catches up"
            );
            return Ok(RoundSummary::default());
        }
        let sites = self
            .federation
            .as_ref()
            .map(|federation| federation.remote_sites(&[]))
            .unwrap_or_default();
        let mut round = Round::new(sites, unix_now_ms());
        let (nodes, ids) = self.views.nodes();
        let pending = self.read_queue(&nodes, &round).await?;
        if pending.is_empty() {
            return Ok(RoundSummary::default());
        }
        let Snapshot {
            mut view,
            ids,
            pending,
            queue,
            unanswered,
        } = self.views.snapshot_of(nodes, ids, pending).await?;
        let behind = withhold_behind(&mut view, &unanswered, MAX_UNANSWERED);
        if behind > 0 {
            tracing::debug!(
                nodes = behind,
                "nodes behind on their assignments get no more this round"
            );
        }
        let now_ms = view.now_ms;
        let started = Instant::now();
        let decisions = policy.decide(&view, &queue);
        self.publisher
            .counters
            .placement_decisions
            .observe(started.elapsed());

        let mut summary = RoundSummary::default();
        // Recorded together after the round: one transaction for all.
        let mut placements = Vec::new();
        let mut placed_tasks = Vec::new();
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
                    mut explanation,
                } => {
                    // The run time placement expects there, and the model's
                    // alone: shown with the decision, and what the node's
                    // correction learns from when the attempt ends.
                    if let (Outcome::Place { node, .. }, Some(object)) =
                        (&decision.outcome, explanation.as_object_mut())
                    {
                        if let (Some(view_node), Some(work)) =
                            (view.nodes.get(*node), queue.get(task))
                        {
                            object.insert(
                                "estimated_run_s".into(),
                                estimate::execution_s(view_node, work, power_level).into(),
                            );
                            object.insert(
                                "modelled_run_s".into(),
                                estimate::modelled_execution_s(view_node, work, power_level).into(),
                            );
                        }
                    }
                    placements.push(Placement {
                        task_id: pending[task].spec.id.clone(),
                        attempt,
                        node_id: node_id.to_string(),
                        power_level,
                        explanation,
                    });
                    placed_tasks.push((task, node_id));
                }
                Step::Hold { task, explanation } => {
                    store
                        .hold_task(&pending[task].spec.id, &explanation)
                        .await?;
                    summary.held += 1;
                }
            }
        }
        summary.placed = self
            .place(&pending, &placements, &placed_tasks, now_ms)
            .await?;
        Ok(summary)
    }

    /// The queue the policy sees this round: up to [`QUEUE_WINDOW`] pending
    /// tasks, oldest first, that some online node of `nodes` could take or
    /// that may go to another site. It reads on past the tasks none could
    /// take, parking them (with why) so that no later round reads them again
    /// until the fleet changes: however many of them there are, work behind
    /// them is placed (within [`MAX_WINDOWS_PER_ROUND`] windows a round).
    async fn read_queue(
        &self,
        nodes: &ClusterView,
        round: &Round,
    ) -> Result<Vec<TaskRecord>, ScheduleError> {
        let store = &self.views.store;
        let fleet = fleet_fingerprint(nodes).cast_signed();
        let mut queue: Vec<TaskRecord> = Vec::new();
        let mut after: Option<(u64, String)> = None;
        for _ in 0..MAX_WINDOWS_PER_ROUND {
            let window = store
                .schedulable_tasks(
                    QUEUE_WINDOW,
                    fleet,
                    after.as_ref().map(|(ms, id)| (*ms, id.as_str())),
                )
                .await?;
            let last_window = window.len() < QUEUE_WINDOW as usize;
            after = window
                .last()
                .map(|record| (record.spec.created_ms, record.spec.id.clone()));
            let (runnable, parked) = sort_window(nodes, window, |record| round.may_forward(record));
            if !parked.is_empty() {
                tracing::info!(
                    tasks = parked.len(),
                    "no online node can run these tasks; parked until the fleet changes"
                );
                self.publisher
                    .counters
                    .tasks_parked
                    .fetch_add(parked.len() as u64, Ordering::Relaxed);
            }
            store.park_tasks(&parked, fleet).await?;
            queue.extend(runnable);
            if last_window || queue.len() >= QUEUE_WINDOW as usize {
                break;
            }
        }
        queue.truncate(QUEUE_WINDOW as usize);
        Ok(queue)
    }

    /// Records a round's placements in one transaction, each with its first
    /// send claimed, then sends them; returns how many were recorded.
    async fn place(
        &self,
        pending: &[TaskRecord],
        placements: &[Placement],
        placed_tasks: &[(usize, starling_proto::NodeId)],
        now_ms: u64,
    ) -> Result<usize, ScheduleError> {
        if placements.is_empty() {
            return Ok(0);
        }
        let claimed_until = self.publisher.first_resend_ms(unix_now_ms());
        let placed = self
            .views
            .store
            .assign_tasks(placements, now_ms, Some(claimed_until))
            .await?;
        let mut count = 0;
        let mut publishers = ArtifactPublishers::default();
        for ((placement, (task, node_id)), assigned) in
            placements.iter().zip(placed_tasks).zip(&placed.assigned)
        {
            if !assigned {
                // Cancelled or placed by another replica since it was read.
                continue;
            }
            count += 1;
            let Some(record) = pending.get(*task) else {
                continue;
            };
            let seconds = |key: &str| placement.explanation.get(key).and_then(|v| v.as_f64());
            if let (Some(predicted_s), Some(modelled_s)) =
                (seconds("estimated_run_s"), seconds("modelled_run_s"))
            {
                let work = pending_task(0, &record.spec);
                self.views.registry.write().expect_run(
                    node_id,
                    ExpectedRun {
                        task_id: placement.task_id.clone(),
                        attempt: placement.attempt,
                        modelled_s,
                        predicted_s,
                        class: work.class,
                        artifact: work.artifact,
                    },
                );
            }
            let entry = OutboxEntry {
                task_id: placement.task_id.clone(),
                attempt: placement.attempt,
                node_id: placement.node_id.clone(),
                next_send_ms: claimed_until,
                sends: 1,
            };
            let record = TaskRecord {
                status: TaskStatus::Assigned,
                node_id: Some(placement.node_id.clone()),
                attempt: placement.attempt,
                power_level: Some(placement.power_level),
                ..record.clone()
            };
            if self
                .publisher
                .publish_claimed(
                    &entry,
                    node_id,
                    &record,
                    placed.term,
                    &mut publishers,
                    unix_now_ms(),
                )
                .await?
            {
                tracing::info!(task = %placement.task_id, node = %node_id, attempt = placement.attempt,
                    power_level = placement.power_level, "task assigned");
            }
        }
        Ok(count)
    }
}
