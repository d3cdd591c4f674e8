//! The handling of what the broker delivers, spread over a few workers:
//! each node's messages go to one worker (chosen by its id), so they are
//! applied in the order they arrived, while different nodes' reports are
//! verified and their events recorded side by side (a database round trip
//! or a signature check of one node no longer holds up all the others).
//! Replicas on a shared database also reload node credentials here.

use std::hash::{Hash as _, Hasher as _};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;

use super::inbound::{Inbound, IngestError};
use super::ingest::{admit, apply_report, handle_events, Admitted, Handled, Ingest, Received};
use crate::counters::{Counters, INGEST_WORKERS};
use crate::domain::reports::ReportRefused;
use crate::store::EventOutcome;

/// How many workers apply messages side by side (the number is the
/// metrics' too: each worker's lag is kept apart).
const WORKERS: usize = INGEST_WORKERS;

/// Received messages waiting for the handler: room for a burst of reports
/// (a second of a few thousand nodes). While this is full the MQTT loop
/// waits, and with it the broker's acknowledgements of what the
/// coordinator sends.
pub(crate) const RECEIVED_QUEUE: usize = 8_192;

/// Most messages a worker takes at once, and so most events recorded in
/// one transaction.
const BATCH: usize = 128;

/// Messages waiting for one worker; when full, the dispatcher waits, and
/// with it the MQTT loop (the broker then queues for the coordinator).
const WORKER_QUEUE: usize = 256;

/// How often a replica on a shared database reloads every node's
/// credentials (revocations made through another replica).
const REPLICA_ACCESS_RESYNC: Duration = Duration::from_secs(2);

/// How many refused messages are logged per [`LOG_WINDOW`]; the rest are
/// only counted (on `/metrics`), so a flood of junk cannot fill the disk.
const LOGGED_PER_WINDOW: u32 = 20;
/// See [`LOGGED_PER_WINDOW`].
const LOG_WINDOW: Duration = Duration::from_secs(10);

/// A budget of warning lines per window, and how many were held back.
struct LogBudget {
    window_start: tokio::time::Instant,
    logged: u32,
    held_back: u64,
}

impl LogBudget {
    fn new() -> Self {
        Self {
            window_start: tokio::time::Instant::now(),
            logged: 0,
            held_back: 0,
        }
    }

    /// Whether one more line may be written now; opening a new window first
    /// says how many lines the last one held back.
    fn allow(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now.duration_since(self.window_start) >= LOG_WINDOW {
            if self.held_back > 0 {
                tracing::warn!(
                    held_back = self.held_back,
                    window = ?LOG_WINDOW,
                    "more MQTT messages were ignored than logged; see starling_mqtt_messages_ignored_total"
                );
            }
            self.window_start = now;
            self.logged = 0;
            self.held_back = 0;
        }
        if self.logged < LOGGED_PER_WINDOW {
            self.logged += 1;
            true
        } else {
            self.held_back += 1;
            false
        }
    }
}

/// Hands each received message to its node's worker until the MQTT loop
/// closes the channel; on a shared database, reloads node credentials every
/// [`REPLICA_ACCESS_RESYNC`].
pub(crate) async fn run_message_handler(ingest: Ingest, mut messages: mpsc::Receiver<Received>) {
    let mut workers = Vec::with_capacity(WORKERS);
    let mut handles = Vec::with_capacity(WORKERS);
    for worker in 0..WORKERS {
        let (sender, receiver) = mpsc::channel(WORKER_QUEUE);
        workers.push(sender);
        handles.push(tokio::spawn(run_worker(ingest.clone(), worker, receiver)));
    }
    let mut resync = tokio::time::interval(REPLICA_ACCESS_RESYNC);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let message = tokio::select! {
            message = messages.recv() => message,
            _ = resync.tick(), if ingest.store.is_shared() => {
                if let Err(error) = crate::access::refresh(&ingest.store, &ingest.access, None).await {
                    tracing::warn!(%error, "cannot reload node credentials from the shared database");
                }
                continue;
            }
        };
        let Some(message) = message else { break };
        let Some(worker) = workers.get(worker_of(&message.topic)) else {
            break;
        };
        if worker.send(message).await.is_err() {
            tracing::error!("an MQTT message worker stopped; no more messages are handled");
            break;
        }
        let queued: usize = messages.len()
            + workers
                .iter()
                .map(|worker| WORKER_QUEUE - worker.capacity())
                .sum::<usize>();
        ingest
            .counters
            .ingest
            .backlog
            .store(u64::try_from(queued).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
    drop(workers);
    for handle in handles {
        let _ = handle.await;
    }
}

/// The worker of a topic: by the node segment (the topic's node id when it
/// is a node topic), so one node's messages keep their order.
fn worker_of(topic: &str) -> usize {
    let node = topic.rsplit('/').nth(1).unwrap_or(topic);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    node.hash(&mut hasher);
    // The remainder is below WORKERS, so it fits a usize.
    (hasher.finish() % WORKERS as u64) as usize
}

/// Applies one worker's messages in arrival order, taking what has queued
/// up (at most [`BATCH`] at a time): the events among them are recorded in
/// one transaction (group commit), so the database's commits do not bound
/// how many events a second ingest takes.
async fn run_worker(ingest: Ingest, worker: usize, mut messages: mpsc::Receiver<Received>) {
    let mut budget = LogBudget::new();
    let mut batch: Vec<Received> = Vec::with_capacity(BATCH);
    while messages.recv_many(&mut batch, BATCH).await > 0 {
        let now_ms = crate::task::unix_now_ms();
        // The first is the oldest: the channel keeps arrival order.
        let waited = batch
            .first()
            .map_or(0, |first| now_ms.saturating_sub(first.received_ms));
        ingest.counters.ingest.set_lag_ms_of(worker, waited);
        let mut events = Vec::new();
        let mut event_topics = Vec::new();
        for message in batch.drain(..) {
            let admitted = admit(
                &ingest,
                &message.topic,
                &message.payload,
                message.retained,
                now_ms,
            )
            .await;
            match admitted {
                Err(error) => count(&ingest, &mut budget, &message.topic, Err(error)),
                Ok(Admitted {
                    inbound: Inbound::Event(event),
                    mark,
                }) => {
                    events.push((event, mark));
                    event_topics.push(message.topic);
                }
                Ok(Admitted { inbound, mark }) => {
                    // A report with lasting effects (a durable mark, a node
                    // going offline) waits for the node's earlier events, so
                    // the store sees one node's messages in their order.
                    // Telemetry only changes the registry: it does not wait.
                    if mark.is_some() || !matches!(inbound, Inbound::Telemetry(..)) {
                        flush(&ingest, &mut budget, &mut events, &mut event_topics, now_ms).await;
                    }
                    let handled = apply_report(&ingest, inbound, mark, now_ms).await;
                    count(&ingest, &mut budget, &message.topic, handled);
                }
            }
        }
        flush(&ingest, &mut budget, &mut events, &mut event_topics, now_ms).await;
        if messages.is_empty() {
            ingest.counters.ingest.set_lag_ms_of(worker, 0);
        }
    }
}

/// Records the events gathered so far in one transaction and counts what
/// became of each.
async fn flush(
    ingest: &Ingest,
    budget: &mut LogBudget,
    events: &mut Vec<(starling_proto::TaskEvent, Option<crate::store::ReportMark>)>,
    topics: &mut Vec<String>,
    now_ms: u64,
) {
    if events.is_empty() {
        return;
    }
    Counters::increment(&ingest.counters.event_batches);
    let handled = handle_events(ingest, std::mem::take(events), now_ms).await;
    for (topic, handled) in topics.drain(..).zip(handled) {
        count(ingest, budget, &topic, handled);
    }
}

/// Counts (and, within the log budget, logs) what handling one message did.
fn count(
    ingest: &Ingest,
    budget: &mut LogBudget,
    topic: &str,
    handled: Result<Handled, IngestError>,
) {
    match handled {
        Ok(handled) => {
            if handled == Handled::Event(EventOutcome::Duplicate) {
                Counters::increment(&ingest.counters.duplicate_events);
            }
            Counters::increment(&ingest.counters.messages_handled);
            tracing::debug!(topic, ?handled, "message handled")
        }
        Err(error) => {
            Counters::increment(&ingest.counters.messages_ignored);
            if let IngestError::Refused(refused) = &error {
                let reason = ReportRefused::REASONS
                    .iter()
                    .position(|reason| *reason == refused.reason());
                if let Some(counter) = reason.and_then(|i| ingest.counters.reports_refused.get(i)) {
                    Counters::increment(counter);
                }
            }
            if budget.allow() {
                tracing::warn!(topic, %error, "message ignored");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_nodes_messages_go_to_one_worker_and_nodes_spread() {
        let worker = worker_of("starling/v1/nodes/pi-1/events");
        for channel in ["capability", "telemetry", "status", "events"] {
            assert_eq!(
                worker_of(&format!("starling/v1/nodes/pi-1/{channel}")),
                worker
            );
        }
        let used: std::collections::HashSet<usize> = (0..64)
            .map(|i| worker_of(&format!("starling/v1/nodes/node-{i}/telemetry")))
            .collect();
        assert_eq!(used.len(), WORKERS, "64 nodes use every worker");
        assert!(worker_of("junk") < WORKERS);
    }
}
