//! Failure detection: a node is suspect when its last will (an `offline`
//! status) arrives, which `ingest` handles, or when nothing was heard from it
//! for `node_timeout`, which this loop handles. A suspect node's in-flight
//! attempts are marked lost and its tasks go back to the queue, so they run
//! elsewhere within about `node_timeout` plus one scheduling round.
//!
//! The loop also catches work on nodes the registry does not show online: a
//! coordinator restarted from its store knows tasks in flight on nodes that
//! may never report again (the registry starts empty and fills from retained
//! reports), and a task can be placed in the instant its node goes offline.
//! Such a node gets `node_timeout` from when the loop first noticed it,
//! the start time after a restart, to come online before its tasks are requeued.
//!
//! While the coordinator's own broker connection is down every node looks
//! silent; nothing is suspected then, and silence counts again from the
//! reconnection (so a broker restart does not requeue the whole cluster).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::counters::Counters;
use crate::domain::liveness::{Detector, Observation, Silence};
use crate::registry::NodeRegistry;
use crate::store::{Store, StoreError};
use crate::task::unix_now_ms;

/// The longest pause between two checks.
const MAX_TICK: Duration = Duration::from_millis(500);

/// What failure detection uses, and nothing else.
pub(crate) struct Liveness {
    /// The nodes as reported; the detector marks silent ones offline.
    pub(crate) registry: Arc<NodeRegistry>,
    /// Where in-flight work is found and requeued.
    pub(crate) store: Store,
    /// Since when (Unix ms) the coordinator's broker connection is up; 0
    /// while it is down.
    pub(crate) broker_up_since_ms: Arc<AtomicU64>,
    /// `starling_nodes_suspected_total`.
    pub(crate) counters: Arc<Counters>,
    /// Woken when work goes back to the queue.
    pub(crate) wake_scheduler: Arc<Notify>,
    /// Silence after which a node is suspected, ms.
    pub(crate) node_timeout_ms: u64,
    /// Attempts a task gets before a lost one fails it.
    pub(crate) max_attempts: u32,
    /// Where suspected nodes are announced.
    pub(crate) feed: crate::live::Feed,
}

/// Checks for silent nodes every 500 ms (or a quarter of the node timeout,
/// if shorter) until told to stop.
pub(crate) async fn run(liveness: Liveness, mut stop: watch::Receiver<bool>) {
    let tick = Duration::from_millis(liveness.node_timeout_ms / 4)
        .clamp(Duration::from_millis(20), MAX_TICK);
    let mut detector = Detector::default();
    loop {
        if let Err(error) = liveness.check(&mut detector, unix_now_ms()).await {
            tracing::warn!(%error, "failure detection round failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
}

impl Liveness {
    /// One check: suspects silent nodes and requeues the work of nodes gone
    /// (or absent) for longer than the node timeout.
    pub(crate) async fn check(
        &self,
        detector: &mut Detector,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let timeout_ms = self.node_timeout_ms;
        let listening_since = self.broker_up_since_ms.load(Ordering::Relaxed);
        let listening_since_ms = (listening_since != 0).then_some(listening_since);
        let newly_silent: Vec<String> = match listening_since_ms {
            Some(since) => self
                .registry
                .write()
                .suspect_silent(&Silence {
                    now_ms,
                    timeout_ms,
                    ingest_lag_ms: self.counters.ingest.lag_ms(),
                    listening_since_ms: since,
                })
                .into_iter()
                .map(|id| {
                    Counters::increment(&self.counters.nodes_suspected);
                    self.feed.node(id.as_str(), starling_api::NodeChangeKind::Suspect, now_ms);
                    tracing::warn!(node = %id, timeout_ms, "nothing heard from the node within the node timeout; it is offline");
                    id.to_string()
                })
                .collect(),
            None => Vec::new(),
        };
        let in_flight = match listening_since_ms {
            Some(_) => {
                let nodes = self.store.in_flight_nodes().await?;
                let registry = self.registry.read();
                nodes
                    .into_iter()
                    .map(|node| {
                        let online = starling_proto::NodeId::new(&node)
                            .ok()
                            .and_then(|id| registry.get(&id).map(|entry| entry.online()))
                            .unwrap_or(false);
                        (node, online)
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        let requeue = detector.check(Observation {
            now_ms,
            timeout_ms,
            listening_since_ms,
            newly_silent,
            in_flight,
        });
        for node in requeue {
            if !self.store.leads() {
                // Suspicion keeps this replica's view right; the leader
                // requeues (its own detector, or the rule for work on nodes
                // that stay away, covers a node suspected here first).
                break;
            }
            let lost = self
                .store
                .requeue_node_tasks(&node, self.max_attempts, now_ms)
                .await?;
            for task in &lost {
                tracing::warn!(
                    node = %node,
                    task = %task.task_id,
                    attempt = task.attempt,
                    now = %task.status,
                    "node suspected with the task in flight"
                );
            }
            if !lost.is_empty() {
                self.wake_scheduler.notify_one();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use starling_proto::{NodeId, NodeState, Status, PROTOCOL_VERSION};

    use super::*;
    use crate::registry::tests::capability;

    /// A node last heard at 1,000 ms, under a 5 s node timeout, checked at
    /// 7,000 ms while ingest is `lag_ms` behind: whether it is suspected.
    async fn suspected_with_lag(lag_ms: u64) -> bool {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}", dir.path().join("l.db").display()))
            .await
            .unwrap();
        let registry = Arc::new(NodeRegistry::new());
        let node = NodeId::new("pi-1").unwrap();
        registry
            .write()
            .apply_capability(&node, capability("pi-1"), 1_000)
            .unwrap();
        let online = Status {
            v: PROTOCOL_VERSION,
            node_id: node.clone(),
            state: NodeState::Online,
        };
        registry.write().apply_status(&node, online, 1_000).unwrap();
        let counters = Arc::new(Counters::default());
        counters.ingest.set_lag_ms(0, lag_ms);
        let liveness = Liveness {
            registry: Arc::clone(&registry),
            store,
            broker_up_since_ms: Arc::new(AtomicU64::new(1)),
            counters: Arc::clone(&counters),
            wake_scheduler: Arc::new(Notify::new()),
            node_timeout_ms: 5_000,
            max_attempts: 3,
            feed: crate::live::Feed::new(16),
        };
        liveness
            .check(&mut Detector::default(), 7_000)
            .await
            .unwrap();
        let suspected = counters.nodes_suspected.load(Ordering::Relaxed) == 1;
        assert_eq!(registry.read().get(&node).unwrap().online(), !suspected);
        suspected
    }

    #[tokio::test]
    async fn time_ingest_spends_behind_is_not_a_nodes_silence() {
        assert!(suspected_with_lag(0).await, "6 s of silence is past 5 s");
        assert!(
            !suspected_with_lag(2_000).await,
            "2 s of it were ingest behind: 4 s of silence"
        );
        assert!(suspected_with_lag(500).await, "5.5 s of silence");
    }
}
