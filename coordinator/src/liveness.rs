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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::store::StoreError;
use crate::task::unix_now_ms;
use crate::{Counters, Shared};

/// The longest pause between two checks.
const MAX_TICK: Duration = Duration::from_millis(500);

/// What the loop remembers between checks.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// Nodes with work in flight that the registry does not show online, and
    /// since when (Unix ms) the loop has seen them so.
    absent_since: HashMap<String, u64>,
}

/// Checks for silent nodes every 500 ms (or a quarter of the node timeout,
/// if shorter) until told to stop.
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let tick = Duration::from_millis(shared.node_timeout_ms / 4)
        .clamp(Duration::from_millis(20), MAX_TICK);
    let mut liveness = Liveness::default();
    loop {
        if let Err(error) = liveness.check(&shared, unix_now_ms()).await {
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
    pub(crate) async fn check(&mut self, shared: &Shared, now_ms: u64) -> Result<(), StoreError> {
        let timeout_ms = shared.node_timeout_ms;
        let listening_since = shared
            .broker_up_since_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        if listening_since == 0 {
            // Cut off from the broker ourselves: every node looks silent, and
            // none of it is the nodes' doing. Start counting again once back.
            self.absent_since.clear();
            return Ok(());
        }
        let silent = shared
            .registry_mut()
            .suspect_silent(now_ms, timeout_ms, listening_since);
        let mut requeue: Vec<String> = Vec::new();
        for id in silent {
            Counters::increment(&shared.counters.nodes_suspected);
            tracing::warn!(node = %id, timeout_ms, "nothing heard from the node within the node timeout; it is offline");
            requeue.push(id.to_string());
        }

        let in_flight = shared.store.in_flight_nodes().await?;
        self.absent_since.retain(|node, _| in_flight.contains(node));
        for node in in_flight {
            let online = {
                let registry = shared.registry();
                starling_proto::NodeId::new(&node)
                    .ok()
                    .and_then(|id| registry.get(&id).map(|entry| entry.online()))
                    .unwrap_or(false)
            };
            if online {
                self.absent_since.remove(&node);
                continue;
            }
            let noticed = *self.absent_since.entry(node.clone()).or_insert(now_ms);
            let since = noticed.max(listening_since);
            if now_ms.saturating_sub(since) >= timeout_ms && !requeue.contains(&node) {
                tracing::warn!(node = %node, timeout_ms, "node with work in flight did not come online within the node timeout");
                requeue.push(node);
            }
        }

        for node in requeue {
            self.absent_since.remove(&node);
            let lost = shared
                .store
                .requeue_node_tasks(&node, shared.max_attempts, now_ms)
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
                shared.wake_scheduler.notify_one();
            }
        }
        Ok(())
    }
}
