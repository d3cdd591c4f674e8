//! The coordinator's counters, exported on `GET /metrics`: atomics every
//! part increments without waiting on the others.

use crate::{domain, loops};

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
    pub(crate) ingest: crate::mqtt::handler::IngestLoad,
    /// Pending tasks parked for want of a node that could run them.
    pub(crate) tasks_parked: std::sync::atomic::AtomicU64,
    /// How long each scheduling round's placement decision took.
    pub(crate) placement_decisions: loops::scheduler::DecisionTimes,
}

impl Counters {
    pub(crate) fn increment(counter: &std::sync::atomic::AtomicU64) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}
