//! What the console remembers of each node's recent telemetry, for its
//! sparklines and plots: a small ring of samples per node, filled by one
//! task per coordinator from the live feed (never one per browser), and
//! bounded by the registry's nodes (a node the registry forgot is dropped).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use starling_api::{EventKind, TelemetrySample};

use crate::live::{Delivery, Feed, Filter};
use crate::registry::NodeRegistry;

/// Samples kept per node (a minute at the feed's one sample a second).
pub(crate) const SAMPLES_PER_NODE: usize = 60;

/// One point of a node's history.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// When the coordinator received it, Unix ms.
    pub(crate) at_ms: u64,
    /// CPU load, 0..=1.
    pub(crate) cpu_load: f32,
    /// Memory in use, 0..=1.
    pub(crate) memory_used: f32,
    /// Round trip to the broker, ms.
    pub(crate) rtt_ms: Option<f32>,
    /// The busiest GPU's load, 0..=1, where a sensor reports it.
    pub(crate) gpu_load: Option<f32>,
}

impl From<&TelemetrySample> for Sample {
    fn from(sample: &TelemetrySample) -> Self {
        Self {
            at_ms: sample.at_ms,
            cpu_load: sample.cpu_load,
            memory_used: sample.memory_used,
            rtt_ms: sample.rtt_ms,
            gpu_load: sample.gpu_load,
        }
    }
}

/// Every node's recent samples.
#[derive(Debug, Default)]
pub(crate) struct History {
    nodes: Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl History {
    fn nodes(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Sample>>> {
        // Each change is one push or remove: a poisoned map is still whole.
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a sample of `node_id`; `known` says whether the registry holds
    /// the node, and `node_count` how many it holds (the map never holds
    /// more nodes than that).
    pub(crate) fn record(&self, node_id: &str, sample: Sample, known: bool, node_count: usize) {
        let mut nodes = self.nodes();
        if !known {
            nodes.remove(node_id);
            return;
        }
        if !nodes.contains_key(node_id) && nodes.len() >= node_count {
            // Nodes the registry forgot still hold rings: drop the stalest.
            if let Some(stalest) = nodes
                .iter()
                .min_by_key(|(_, ring)| ring.back().map_or(0, |sample| sample.at_ms))
                .map(|(id, _)| id.clone())
            {
                nodes.remove(&stalest);
            }
        }
        let ring = nodes.entry(node_id.to_owned()).or_default();
        if ring.len() == SAMPLES_PER_NODE {
            ring.pop_front();
        }
        ring.push_back(sample);
    }

    /// A node's samples, oldest first.
    pub(crate) fn samples(&self, node_id: &str) -> Vec<Sample> {
        self.nodes()
            .get(node_id)
            .map(|ring| ring.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// Fills `history` from the feed's telemetry until the feed ends. After a
/// reset (this reader fell behind) it subscribes again from now: a gap in a
/// sparkline is harmless.
pub(crate) async fn follow(feed: Feed, history: Arc<History>, registry: Arc<NodeRegistry>) {
    let filter = || Filter {
        kinds: Some(vec![EventKind::Telemetry]),
        task: None,
        node: None,
    };
    let mut subscription = feed.subscribe(filter(), None);
    loop {
        match subscription.next().await {
            Some(Delivery::Event(stamped)) => {
                if let starling_api::LiveEvent::Telemetry(sample) = &stamped.event {
                    let (known, count) = match starling_proto::NodeId::new(&sample.node_id) {
                        Ok(id) => {
                            let registry = registry.read();
                            (registry.get(&id).is_some(), registry.len())
                        }
                        Err(_) => (false, 0),
                    };
                    history.record(&sample.node_id, Sample::from(sample), known, count);
                }
            }
            Some(Delivery::Reset(_)) => subscription = feed.subscribe(filter(), None),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64) -> Sample {
        Sample {
            at_ms,
            cpu_load: 0.5,
            memory_used: 0.25,
            rtt_ms: Some(3.0),
            gpu_load: None,
        }
    }

    #[test]
    fn rings_are_bounded_per_node_and_by_the_registry() {
        let history = History::default();
        for at in 0..(SAMPLES_PER_NODE as u64 + 10) {
            history.record("a", sample(at), true, 2);
        }
        let kept = history.samples("a");
        assert_eq!(kept.len(), SAMPLES_PER_NODE);
        assert_eq!(kept[0].at_ms, 10);
        history.record("b", sample(100), true, 2);
        // A third node with a registry of two drops the stalest ring ("a").
        history.record("c", sample(200), true, 2);
        assert!(history.samples("a").is_empty());
        assert_eq!(history.samples("b").len(), 1);
        // A node the registry does not hold keeps nothing.
        history.record("b", sample(300), false, 2);
        assert!(history.samples("b").is_empty());
    }
}
