//! The coordinator's counters, exported on `GET /metrics`: atomics every
//! part increments without waiting on the others. They sit below every part
//! that counts (ingest, the loops, publishing) and name none of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::domain;

/// How many workers apply messages side by side: enough to overlap
/// database round trips, within the store's pool (4 SQLite, 8 PostgreSQL
/// connections).
pub(crate) const INGEST_WORKERS: usize = 4;

/// Counters exported on `GET /metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) messages_handled: std::sync::atomic::AtomicU64,
    pub(crate) messages_ignored: std::sync::atomic::AtomicU64,
    /// Messages dropped at ingest for being over their node's budget.
    pub(crate) messages_dropped_over_budget: std::sync::atomic::AtomicU64,
    /// Telemetry and events dropped at ingest because the queue was full.
    pub(crate) messages_dropped_backlog: std::sync::atomic::AtomicU64,
    /// Messages dropped at ingest for being over the protocol's size limit.
    pub(crate) messages_dropped_oversize: std::sync::atomic::AtomicU64,
    pub(crate) duplicate_events: std::sync::atomic::AtomicU64,
    /// Transactions that recorded task events (group commit).
    pub(crate) event_batches: std::sync::atomic::AtomicU64,
    pub(crate) assignments_published: std::sync::atomic::AtomicU64,
    /// Sends of assignments past the first (unacknowledged ones re-sent).
    pub(crate) assignments_resent: std::sync::atomic::AtomicU64,
    /// `rejected` events: an agent refused an assignment.
    pub(crate) assignments_rejected: std::sync::atomic::AtomicU64,
    /// Nodes marked offline because they fell silent.
    pub(crate) nodes_suspected: std::sync::atomic::AtomicU64,
    /// Cancels sent for work on attempts that are no longer current.
    pub(crate) stale_cancels: std::sync::atomic::AtomicU64,
    /// Attempts ended for running past their wall-time limit plus the grace.
    pub(crate) attempts_overdue: std::sync::atomic::AtomicU64,
    /// Attempts ended because their online node did not list them.
    pub(crate) attempts_unknown_to_node: std::sync::atomic::AtomicU64,
    /// Attempts ended because their node never answered the assignment.
    pub(crate) attempts_unanswered: std::sync::atomic::AtomicU64,
    /// Reports refused for not proving their sender, by `ReportRefused::REASONS`.
    pub(crate) reports_refused:
        [std::sync::atomic::AtomicU64; domain::reports::ReportRefused::REASONS.len()],
    /// How far ingest is behind: messages waiting, and for how long.
    pub(crate) ingest: IngestLoad,
    /// Pending tasks parked for want of a node that could run them.
    pub(crate) tasks_parked: std::sync::atomic::AtomicU64,
    /// How long each scheduling round's placement decision took.
    pub(crate) placement_decisions: DecisionTimes,
    /// How each finished attempt's run time stood against placement's
    /// estimate.
    pub(crate) estimate_errors: EstimateErrors,
}

impl Counters {
    pub(crate) fn increment(counter: &std::sync::atomic::AtomicU64) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How far ingest is behind the broker: what `/metrics` shows and what
/// failure detection allows for.
#[derive(Debug, Default)]
pub(crate) struct IngestLoad {
    /// Messages received and not yet handled (read when one is handed to its
    /// worker).
    pub(crate) backlog: AtomicU64,
    /// Per worker: how long the messages it is applying waited for it, ms
    /// (0 once it has caught up).
    lag_ms: [AtomicU64; INGEST_WORKERS],
}

impl IngestLoad {
    /// Records how long the messages `worker` is applying waited.
    pub(crate) fn set_lag_ms_of(&self, worker: usize, lag_ms: u64) {
        if let Some(lag) = self.lag_ms.get(worker) {
            lag.store(lag_ms, Ordering::Relaxed);
        }
    }

    /// As a worker would record it (tests of what reads it).
    #[cfg(test)]
    pub(crate) fn set_lag_ms(&self, worker: usize, lag_ms: u64) {
        self.set_lag_ms_of(worker, lag_ms);
    }

    /// How long the oldest message being applied now waited, ms: while
    /// ingest is this far behind, a node's latest report may be waiting in
    /// the queue, so its silence is not yet known.
    pub(crate) fn lag_ms(&self) -> u64 {
        self.lag_ms
            .iter()
            .map(|lag| lag.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }
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

/// A reading of a histogram ([`DecisionTimes`], [`EstimateErrors`]) for
/// the Prometheus text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistogramSnapshot {
    /// `(upper bound, observations at or under it)`, cumulative, without `+Inf`.
    pub(crate) buckets: Vec<(f64, u64)>,
    /// Every observation: the `+Inf` bucket and `_count`.
    pub(crate) count: u64,
    /// The observations' total (seconds, or ratios).
    pub(crate) sum: f64,
}

impl DecisionTimes {
    /// Records one round's decision time.
    pub(crate) fn observe(&self, elapsed: Duration) {
        count_in(&self.buckets, &DECISION_BUCKETS_S, elapsed.as_secs_f64());
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The histogram now. The count is the buckets' total, so `+Inf` and
    /// `_count` agree even while a round is being recorded.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        cumulative(
            &self.buckets,
            &DECISION_BUCKETS_S,
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        )
    }
}

/// Counts `value` in the first of `buckets` whose bound in `bounds` it does
/// not pass (the slot after the last bound when it passes them all).
fn count_in(buckets: &[AtomicU64], bounds: &[f64], value: f64) {
    let slot = bounds
        .iter()
        .position(|bound| value <= *bound)
        .unwrap_or(bounds.len());
    if let Some(bucket) = buckets.get(slot) {
        bucket.fetch_add(1, Ordering::Relaxed);
    }
}

/// A histogram's buckets as Prometheus has them: cumulative by bound, the
/// count (every bucket, the one above the bounds included) and `sum`.
fn cumulative(buckets: &[AtomicU64], bounds: &[f64], sum: f64) -> HistogramSnapshot {
    let mut total = 0_u64;
    let mut cumulative = Vec::with_capacity(bounds.len());
    for (bound, bucket) in bounds.iter().zip(buckets) {
        total = total.saturating_add(bucket.load(Ordering::Relaxed));
        cumulative.push((*bound, total));
    }
    let above = buckets
        .get(bounds.len())
        .map_or(0, |bucket| bucket.load(Ordering::Relaxed));
    HistogramSnapshot {
        buckets: cumulative,
        count: total.saturating_add(above),
        sum,
    }
}

/// Upper bounds of the buckets of `starling_estimate_error_ratio`, a
/// finished attempt's observed run time over the one placement expected:
/// from four times faster to four times slower, finer near 1.
pub(crate) const ERROR_RATIO_BUCKETS: [f64; 10] =
    [0.25, 0.5, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 2.0, 4.0];

/// Observed over expected run time of every finished attempt that had an
/// estimate: a histogram with the buckets of [`ERROR_RATIO_BUCKETS`].
#[derive(Debug, Default)]
pub(crate) struct EstimateErrors {
    /// Attempts in each bucket (not cumulative; the last is above every bound).
    buckets: [AtomicU64; ERROR_RATIO_BUCKETS.len() + 1],
    /// Every ratio added up, in millionths.
    sum_millionths: AtomicU64,
}

impl EstimateErrors {
    /// Records one attempt: `observed_s` taken where `predicted_s` was
    /// expected (nothing for a prediction that is not positive).
    pub(crate) fn observe(&self, predicted_s: f64, observed_s: f64) {
        if !(predicted_s > 0.0 && observed_s.is_finite() && observed_s >= 0.0) {
            return;
        }
        let ratio = observed_s / predicted_s;
        count_in(&self.buckets, &ERROR_RATIO_BUCKETS, ratio);
        // Saturating: a ratio past 18 trillion is not a number anyone reads.
        self.sum_millionths
            .fetch_add((ratio * 1e6).min(u64::MAX as f64) as u64, Ordering::Relaxed);
    }

    /// The histogram now, in the shape `/metrics` writes.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        cumulative(
            &self.buckets,
            &ERROR_RATIO_BUCKETS,
            self.sum_millionths.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {

    #[test]
    fn estimate_errors_bucket_the_ratio_of_observed_to_expected() {
        let errors = EstimateErrors::default();
        errors.observe(1.0, 4.0); // on the last bound
        errors.observe(2.0, 2.0); // 1.0: the 1.05 bucket
        errors.observe(1.0, 10.0); // above every bound
        errors.observe(0.0, 1.0); // no prediction: not counted
        let snapshot = errors.snapshot();
        assert_eq!(snapshot.count, 3);
        let at = |bound: f64| {
            snapshot
                .buckets
                .iter()
                .find(|(b, _)| *b == bound)
                .unwrap()
                .1
        };
        assert_eq!(at(0.95), 0);
        assert_eq!(at(1.05), 1);
        assert_eq!(at(2.0), 1);
        assert_eq!(at(4.0), 2);
        assert!((snapshot.sum - 15.0).abs() < 1e-6, "{}", snapshot.sum);
    }
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
        assert!((snapshot.sum - 10.003_13).abs() < 1e-9, "{}", snapshot.sum);
        assert!(snapshot
            .buckets
            .windows(2)
            .all(|pair| pair[0].1 <= pair[1].1));
    }
}
