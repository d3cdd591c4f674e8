//! The scheduler loop: takes the pending queue from the store and a snapshot of
//! the registry, asks the placement policy for decisions, records them (with
//! their explanations) and publishes each placement as a signed `Assignment`
//! (the first send of the outbox row written with the placement).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_placement::capable::fleet_fingerprint;
use starling_placement::{ClusterView, Policy};
use tokio::sync::{watch, Notify};

use crate::federation::Federation;
use crate::loops::cluster_view::{
    sort_window, withhold_behind, Snapshot, ViewSource, MAX_WINDOWS_PER_ROUND, QUEUE_WINDOW,
};
use crate::loops::round::{Round, Step};
use crate::mqtt::publish::{ArtifactPublishers, Publisher};
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

/// Upper bounds, seconds, of the buckets of
/// `starling_placement_decision_seconds`: from 50 µs (a round of a few tasks
/// on a small fleet; the heuristic decides in a few µs per task) to 2.5 s (a
/// full queue window under a policy that scans thousands of nodes per task).
pub(crate) const DECISION_BUCKETS_S: [f64; 15] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

/// How long the placement policy took to decide, once per scheduling round
/// with work: a histogram with the buckets of [`DECISION_BUCKETS_S`], kept in
/// atomics so the scheduler never waits on a scrape. Timed here, around the
/// call: the engine reads no clock.
#[derive(Debug, Default)]
pub(crate) struct DecisionTimes {
    /// Rounds whose decision took at most each bound and more than the one
    /// before (not cumulative; the last slot is above every bound).
    buckets: [AtomicU64; DECISION_BUCKETS_S.len() + 1],
    /// Every round's decision time added up, nanoseconds.
    sum_ns: AtomicU64,
}

/// A reading of [`DecisionTimes`] for the Prometheus text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DecisionTimesSnapshot {
    /// `(upper bound, rounds at or under it)`, cumulative, without `+Inf`.
    pub(crate) buckets: Vec<(f64, u64)>,
    /// Every round: the `+Inf` bucket and `_count`.
    pub(crate) count: u64,
    /// Total seconds.
    pub(crate) sum_s: f64,
}

impl DecisionTimes {
    /// Records one round's decision time.
    pub(crate) fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let slot = DECISION_BUCKETS_S
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(DECISION_BUCKETS_S.len());
        if let Some(bucket) = self.buckets.get(slot) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The histogram now. The count is the buckets' total, so `+Inf` and
    /// `_count` agree even while a round is being recorded.
    pub(crate) fn snapshot(&self) -> DecisionTimesSnapshot {
        let mut total = 0_u64;
        let mut buckets = Vec::with_capacity(DECISION_BUCKETS_S.len());
        for (bound, bucket) in DECISION_BUCKETS_S.iter().zip(&self.buckets) {
            total = total.saturating_add(bucket.load(Ordering::Relaxed));
            buckets.push((*bound, total));
        }
        let above = self
            .buckets
            .last()
            .map_or(0, |bucket| bucket.load(Ordering::Relaxed));
        DecisionTimesSnapshot {
            buckets,
            count: total.saturating_add(above),
            sum_s: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
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
                    explanation,
                } => {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn decision_times_fill_cumulative_buckets_and_agree_on_the_count() {
        let times = DecisionTimes::default();
        assert_eq!(times.snapshot().count, 0);
        times.observe(Duration::from_micros(30)); // first bucket
        times.observe(Duration::from_micros(100)); // on a bound: that bucket
        times.observe(Duration::from_millis(3)); // 0.005
        times.observe(Duration::from_secs(10)); // above every bound
        let snapshot = times.snapshot();
        assert_eq!(snapshot.count, 4);
        let at = |bound: f64| {
            snapshot
                .buckets
                .iter()
                .find(|(b, _)| *b == bound)
                .map(|(_, count)| *count)
                .unwrap()
        };
        assert_eq!(at(0.000_05), 1);
        assert_eq!(at(0.000_1), 2);
        assert_eq!(at(0.002_5), 2);
        assert_eq!(at(0.005), 3);
        assert_eq!(at(2.5), 3, "10 s is only in +Inf");
        assert!(
            (snapshot.sum_s - 10.003_13).abs() < 1e-9,
            "{}",
            snapshot.sum_s
        );
        assert!(snapshot
            .buckets
            .windows(2)
            .all(|pair| pair[0].1 <= pair[1].1));
    }
}
