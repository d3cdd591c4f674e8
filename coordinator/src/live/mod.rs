//! The live feed: every change a watcher cares about (task states, node
//! states, telemetry samples, site states), numbered and held in a bounded
//! ring, for `GET /api/v1/events`, the long-poll `?wait=` of a task, and the
//! console.
//!
//! Publishing costs one short lock and one wake-up whatever the number of
//! clients, and never waits for any of them: each client reads the shared
//! ring from its own cursor, so it holds no buffer of its own. A client that
//! reads so slowly that the ring moves past its cursor gets a `reset` event
//! and its stream ends; it re-reads current state and subscribes again.

mod ring;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use starling_api::{LiveEvent, StreamPosition, StreamReset, TaskChange, TaskStatus};
use tokio::sync::watch;

pub(crate) use ring::{Filter, Stamped};
use ring::{Read, Ring};

/// Events the ring holds by default (`--event-buffer`).
pub const DEFAULT_CAPACITY: usize = 4096;

/// Least time between two telemetry events of one node, ms: the stream
/// shows a node's load, it does not mirror every sample of a 10 Hz agent.
pub const TELEMETRY_INTERVAL_MS: u64 = 1_000;

/// Events a client takes from the ring per lock.
const BATCH: usize = 64;

/// The feed; clones share it.
#[derive(Debug, Clone)]
pub struct Feed {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ring: Mutex<Ring>,
    /// The newest event's number; clients wait on its changes.
    latest: watch::Sender<u64>,
    clients: AtomicUsize,
    /// Set when the coordinator stops: every subscription ends.
    closed: std::sync::atomic::AtomicBool,
    /// When each node's last telemetry event went out, ms.
    telemetry_sent: Mutex<HashMap<String, u64>>,
}

/// What a subscription hands its client next.
#[derive(Debug, Clone)]
pub(crate) enum Delivery {
    /// An event.
    Event(Arc<Stamped>),
    /// Events were lost to this client; see [`StreamReset`].
    Reset(StreamReset),
}

impl Feed {
    /// A feed holding the last `capacity` events, numbered for a run of its
    /// own (positions from any other run are refused on resume).
    pub fn new(capacity: usize) -> Feed {
        let mut bytes = [0u8; 8];
        // A run id only has to differ from the previous runs' ids; should
        // the OS refuse random bytes, the start time does that too.
        let boot = match getrandom::fill(&mut bytes) {
            Ok(()) => u64::from_le_bytes(bytes) >> 16,
            Err(_) => crate::task::unix_now_ms(),
        };
        let (latest, _) = watch::channel(0);
        Feed {
            inner: Arc::new(Inner {
                ring: Mutex::new(Ring::new(boot, capacity)),
                latest,
                clients: AtomicUsize::new(0),
                closed: std::sync::atomic::AtomicBool::new(false),
                telemetry_sent: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        // The ring is consistent after every statement, so a panic elsewhere
        // while it was held leaves nothing half-done.
        self.inner
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publishes one event to every client.
    pub(crate) fn publish(&self, event: LiveEvent) {
        let latest = self.ring().push(event);
        self.inner.latest.send_replace(latest);
    }

    /// Publishes a task's new state.
    pub(crate) fn task(&self, change: TaskChange) {
        self.publish(LiveEvent::Task(change));
    }

    /// Publishes a telemetry sample, unless the node's previous one went out
    /// less than [`TELEMETRY_INTERVAL_MS`] before.
    pub(crate) fn telemetry(&self, sample: starling_api::TelemetrySample) {
        {
            let mut sent = self
                .inner
                .telemetry_sent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match sent.get_mut(&sample.node_id) {
                Some(last) if sample.at_ms < last.saturating_add(TELEMETRY_INTERVAL_MS) => return,
                Some(last) => *last = sample.at_ms,
                None => {
                    sent.insert(sample.node_id.clone(), sample.at_ms);
                }
            }
        }
        self.publish(LiveEvent::Telemetry(sample));
    }

    /// Publishes a site's new state.
    pub(crate) fn site(&self, site: &str, state: starling_api::SiteState) {
        self.publish(LiveEvent::Site(starling_api::SiteChange {
            site: site.to_owned(),
            state,
            at_ms: crate::task::unix_now_ms(),
        }));
    }

    /// Publishes a node's change.
    pub(crate) fn node(&self, node_id: &str, change: starling_api::NodeChangeKind, at_ms: u64) {
        if change == starling_api::NodeChangeKind::Revoked {
            self.forget_node(node_id);
        }
        self.publish(LiveEvent::Node(starling_api::NodeChange {
            node_id: node_id.to_owned(),
            change,
            at_ms,
        }));
    }

    /// Forgets a node's telemetry pacing (it was revoked or removed), so the
    /// map stays as small as the fleet.
    pub(crate) fn forget_node(&self, node_id: &str) {
        self.inner
            .telemetry_sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(node_id);
    }

    /// Ends every subscription (the coordinator is stopping).
    pub(crate) fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.latest.send_modify(|_| {});
    }

    /// Streams still open.
    pub fn clients(&self) -> usize {
        self.inner.clients.load(Ordering::Relaxed)
    }

    /// The sequence number of the newest event.
    pub(crate) fn latest_seq(&self) -> u64 {
        self.ring().latest()
    }

    /// The position of the newest event.
    #[cfg(test)]
    pub(crate) fn position(&self) -> StreamPosition {
        let ring = self.ring();
        StreamPosition {
            boot: ring.boot(),
            seq: ring.latest(),
        }
    }

    /// A subscription to events that pass `filter`: from `resume` on when
    /// the ring still holds what followed it, else from now, after a
    /// `reset`.
    pub(crate) fn subscribe(&self, filter: Filter, resume: Option<StreamPosition>) -> Subscription {
        // Subscribed to wake-ups before the cursor is read, so no event
        // pushed in between is missed.
        let wake = self.inner.latest.subscribe();
        let ring = self.ring();
        let (cursor, first) = match resume {
            None => (ring.latest(), None),
            Some(position) => match ring.resume(position) {
                Some(cursor) => (cursor, None),
                None => (
                    ring.latest(),
                    Some(StreamReset {
                        reason: "unknown_position".to_owned(),
                        message: format!(
                            "events after {position} are not held any more (or are from before a restart); \
                             re-read current state and subscribe again without Last-Event-ID"
                        ),
                    }),
                ),
            },
        };
        drop(ring);
        self.inner.clients.fetch_add(1, Ordering::Relaxed);
        Subscription {
            feed: self.clone(),
            filter,
            cursor,
            pending: VecDeque::new(),
            wake,
            first,
            ended: false,
        }
    }
}

/// One client's place in the feed. Dropping it ends the subscription.
#[derive(Debug)]
pub(crate) struct Subscription {
    feed: Feed,
    filter: Filter,
    cursor: u64,
    pending: VecDeque<Arc<Stamped>>,
    wake: watch::Receiver<u64>,
    first: Option<StreamReset>,
    ended: bool,
}

impl Subscription {
    /// The next delivery; `None` once the stream is over (after a
    /// `too_slow` reset, or when the coordinator stops).
    pub(crate) async fn next(&mut self) -> Option<Delivery> {
        if let Some(reset) = self.first.take() {
            return Some(Delivery::Reset(reset));
        }
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Delivery::Event(event));
            }
            if self.ended || self.feed.inner.closed.load(Ordering::SeqCst) {
                return None;
            }
            // Marked seen before the read: a push after it wakes `changed`.
            self.wake.borrow_and_update();
            let read = self.feed.ring().read(self.cursor, &self.filter, BATCH);
            match read {
                Read::Behind => {
                    self.ended = true;
                    return Some(Delivery::Reset(StreamReset {
                        reason: "too_slow".to_owned(),
                        message:
                            "this client read events more slowly than they came and missed some; \
                                  re-read current state and subscribe again"
                                .to_owned(),
                    }));
                }
                Read::Events(events, next) => {
                    let moved = next != self.cursor;
                    self.cursor = next;
                    self.pending.extend(events);
                    if moved {
                        // More may follow the batch: read again before waiting.
                        continue;
                    }
                }
            }
            if self.wake.changed().await.is_err() {
                return None;
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.feed.inner.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A task change as the store commits it.
pub(crate) fn task_change(
    task_id: &str,
    status: TaskStatus,
    attempt: u32,
    node_id: Option<&str>,
    at_ms: u64,
) -> TaskChange {
    TaskChange {
        task_id: task_id.to_owned(),
        status,
        attempt,
        node_id: node_id.map(str::to_owned),
        site: None,
        power_level: None,
        reason: None,
        at_ms,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn change(id: &str, status: TaskStatus) -> TaskChange {
        task_change(id, status, 1, Some("n1"), 5)
    }

    async fn next(subscription: &mut Subscription) -> Delivery {
        tokio::time::timeout(Duration::from_secs(5), subscription.next())
            .await
            .expect("a delivery within 5 s")
            .expect("the stream is open")
    }

    fn task_of(delivery: &Delivery) -> (String, TaskStatus) {
        match delivery {
            Delivery::Event(stamped) => match &stamped.event {
                LiveEvent::Task(change) => (change.task_id.clone(), change.status),
                other => panic!("not a task event: {other:?}"),
            },
            Delivery::Reset(reset) => panic!("reset: {reset:?}"),
        }
    }

    #[tokio::test]
    async fn a_subscriber_gets_what_is_published_after_it_subscribed() {
        let feed = Feed::new(16);
        feed.task(change("before", TaskStatus::Pending));
        let mut subscription = feed.subscribe(Filter::default(), None);
        assert_eq!(feed.clients(), 1);
        let waiter = tokio::spawn(async move {
            let first = next(&mut subscription).await;
            let second = next(&mut subscription).await;
            (task_of(&first), task_of(&second))
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        feed.task(change("a", TaskStatus::Running));
        feed.task(change("a", TaskStatus::Succeeded));
        let (first, second) = waiter.await.unwrap();
        assert_eq!(first, ("a".into(), TaskStatus::Running));
        assert_eq!(second, ("a".into(), TaskStatus::Succeeded));
        assert_eq!(feed.clients(), 0, "dropping a subscription counts it out");
    }

    #[tokio::test]
    async fn resume_replays_what_followed_the_position() {
        let feed = Feed::new(16);
        feed.task(change("a", TaskStatus::Pending));
        let seen = feed.position();
        feed.task(change("a", TaskStatus::Running));
        feed.task(change("b", TaskStatus::Pending));
        let mut resumed = feed.subscribe(Filter::default(), Some(seen));
        assert_eq!(
            task_of(&next(&mut resumed).await),
            ("a".into(), TaskStatus::Running)
        );
        assert_eq!(
            task_of(&next(&mut resumed).await),
            ("b".into(), TaskStatus::Pending)
        );
    }

    #[tokio::test]
    async fn an_unknown_position_resets_then_streams_from_now() {
        let feed = Feed::new(2);
        let old = feed.position();
        for i in 0..4 {
            feed.task(change(&format!("t{i}"), TaskStatus::Pending));
        }
        let mut resumed = feed.subscribe(Filter::default(), Some(old));
        match next(&mut resumed).await {
            Delivery::Reset(reset) => assert_eq!(reset.reason, "unknown_position"),
            other => panic!("{other:?}"),
        }
        feed.task(change("new", TaskStatus::Pending));
        assert_eq!(task_of(&next(&mut resumed).await).0, "new");
        // A position from another run is unknown too.
        let other_run = StreamPosition {
            boot: feed.position().boot ^ 1,
            seq: 1,
        };
        let mut elsewhere = feed.subscribe(Filter::default(), Some(other_run));
        assert!(matches!(next(&mut elsewhere).await, Delivery::Reset(_)));
    }

    #[tokio::test]
    async fn a_client_that_falls_behind_is_reset_and_ended_without_slowing_publishers() {
        let feed = Feed::new(8);
        let mut slow = feed.subscribe(Filter::default(), None);
        let mut fast = feed.subscribe(Filter::default(), None);
        for i in 0..100 {
            feed.task(change(&format!("t{i}"), TaskStatus::Pending));
            // The fast client keeps up; the slow one reads nothing.
            assert_eq!(task_of(&next(&mut fast).await).0, format!("t{i}"));
        }
        match next(&mut slow).await {
            Delivery::Reset(reset) => assert_eq!(reset.reason, "too_slow"),
            other => panic!("{other:?}"),
        }
        assert!(slow.next().await.is_none(), "its stream ends");
    }

    #[test]
    fn telemetry_is_paced_per_node() {
        let feed = Feed::new(16);
        let sample = |node: &str, at_ms| starling_api::TelemetrySample {
            node_id: node.into(),
            cpu_load: 0.5,
            memory_used: 0.25,
            free_memory_bytes: 1,
            rtt_ms: None,
            gpu_load: None,
            energy_joules: 0.0,
            energy_source: "model".into(),
            power_level: 0,
            running_tasks: 0,
            queued_tasks: 0,
            at_ms,
        };
        feed.telemetry(sample("n1", 1_000));
        feed.telemetry(sample("n1", 1_500));
        feed.telemetry(sample("n2", 1_500));
        feed.telemetry(sample("n1", 2_000));
        assert_eq!(
            feed.position().seq,
            3,
            "n1 at 1.5 s was within its interval"
        );
        feed.forget_node("n1");
        feed.telemetry(sample("n1", 2_100));
        assert_eq!(feed.position().seq, 4);
    }
}
