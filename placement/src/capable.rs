//! Whether the fleet could run a task at all, whatever its load: the static
//! filters ([`check_capable`]) over every node at once.
//!
//! Two rules stand on it. The scheduler parks a pending task that no online
//! node could take, so a queue of work nothing can run never fills the
//! window the policy reads and the tasks behind it still run (issue 33); a
//! parked task is read again when the fleet changes ([`fleet_fingerprint`]).
//! And a submission that no known node, online or not, could ever take is
//! refused at once with the reasons, instead of waiting for ever.

use std::hash::{DefaultHasher, Hash, Hasher};

use crate::estimate::{check_capable, FilterTally, Incompatible};
use crate::policy::{filter_counts, Explanation};
use crate::{ClusterView, PendingTask};

/// The name explanations of parked tasks carry where a policy's would be.
pub const CAPABILITY_CHECK: &str = "capability check";

/// Which nodes count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Online nodes only: what may run the task now (offline nodes are
    /// counted as `offline`).
    Online,
    /// Every known node, as if online: what could ever run it.
    Known,
}

/// Why no node of `view` in `scope` could take `task`, however idle: an
/// explanation counting the nodes each static filter ruled out. `None` when
/// one could.
pub fn incapable(view: &ClusterView, task: &PendingTask, scope: Scope) -> Option<Explanation> {
    let mut tally = FilterTally::default();
    for (index, node) in view.nodes.iter().enumerate() {
        if scope == Scope::Online && !node.online {
            tally.add(Incompatible::Offline, index);
            continue;
        }
        match check_capable(node, task) {
            Ok(()) => return None,
            Err(reason) => tally.add(reason, index),
        }
    }
    let filtered = filter_counts(view, &tally);
    let reasons = if filtered.is_empty() {
        "the site has no nodes".to_owned()
    } else {
        filtered
            .iter()
            .map(|count| {
                let reason = Incompatible::ALL
                    .iter()
                    .find(|reason| reason.code() == count.reason)
                    .map_or_else(|| count.reason.clone(), ToString::to_string);
                format!("{} × {reason}", count.count)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let summary = match scope {
        Scope::Online => format!(
            "no online node can run it ({reasons}); it waits, parked, until the fleet changes"
        ),
        Scope::Known => format!("no node of this site can run it ({reasons})"),
    };
    Some(Explanation {
        policy: CAPABILITY_CHECK.to_owned(),
        summary,
        considered: u32::try_from(view.nodes.len()).unwrap_or(u32::MAX),
        filtered,
        alternatives: Vec::new(),
    })
}

/// A digest of what [`incapable`] reads of the online nodes (which nodes,
/// their runtimes, architecture, labels, devices and memory; not their
/// load): it changes when a node comes or goes or reports other hardware,
/// and then the tasks parked under the old one are read again. Not stable
/// across builds of the coordinator, which only costs one more reading.
pub fn fleet_fingerprint(view: &ClusterView) -> u64 {
    let mut hasher = DefaultHasher::new();
    for node in view.nodes.iter().filter(|node| node.online) {
        node.id.hash(&mut hasher);
        node.arch.hash(&mut hasher);
        node.runtimes.hash(&mut hasher);
        node.labels.hash(&mut hasher);
        node.memory_bytes.hash(&mut hasher);
        if let Some(gpu) = &node.gpu {
            gpu.kinds.hash(&mut hasher);
            gpu.memory_bytes.hash(&mut hasher);
            gpu.fp64.hash(&mut hasher);
        }
        // Ends each node, so two fleets cannot hash alike by splitting the
        // same fields differently between nodes.
        0xff_u8.hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::testing::{gpu_capacity, node as sized_node, task as class_task};
    use crate::{NodeView, TaskClass};

    fn node(name: &str) -> NodeView {
        sized_node(name, 4.0, 1.0)
    }

    fn gpu_node(name: &str) -> NodeView {
        NodeView {
            gpu: Some(gpu_capacity(10.0, 1 << 30)),
            ..node(name)
        }
    }

    fn task(key: u64) -> PendingTask {
        class_task(key, TaskClass::Cpu)
    }

    #[test]
    fn a_gpu_task_on_a_fleet_without_a_gpu_is_incapable_with_the_reason_counted() {
        let view = ClusterView {
            now_ms: 0,
            nodes: vec![node("a"), node("b")],
        };
        let mut gpu_task = task(0);
        gpu_task.demand.gpu = true;
        let why = incapable(&view, &gpu_task, Scope::Online).expect("no GPU anywhere");
        assert_eq!(why.policy, CAPABILITY_CHECK);
        assert_eq!(why.filtered.len(), 1);
        assert_eq!(why.filtered[0].reason, "gpu");
        assert_eq!(why.filtered[0].count, 2);
        assert!(
            why.summary.contains("2 × no OpenCL device"),
            "{}",
            why.summary
        );
        assert!(incapable(&view, &task(1), Scope::Online).is_none());
    }

    #[test]
    fn an_offline_node_that_could_run_it_counts_for_known_not_for_online() {
        let mut gpu = gpu_node("g");
        gpu.online = false;
        let view = ClusterView {
            now_ms: 0,
            nodes: vec![node("a"), gpu],
        };
        let mut gpu_task = task(0);
        gpu_task.demand.gpu = true;
        let online = incapable(&view, &gpu_task, Scope::Online).expect("the GPU node is offline");
        assert!(online.filtered.iter().any(|c| c.reason == "offline"));
        assert!(incapable(&view, &gpu_task, Scope::Known).is_none());
    }

    #[test]
    fn an_empty_site_runs_nothing() {
        let view = ClusterView {
            now_ms: 0,
            nodes: Vec::new(),
        };
        let why = incapable(&view, &task(0), Scope::Known).expect("no nodes");
        assert!(
            why.summary.contains("the site has no nodes"),
            "{}",
            why.summary
        );
    }

    #[test]
    fn the_fingerprint_follows_the_online_hardware_and_not_the_load() {
        let view = |nodes| ClusterView { now_ms: 0, nodes };
        let base = fleet_fingerprint(&view(vec![node("a"), node("b")]));
        assert_eq!(base, fleet_fingerprint(&view(vec![node("a"), node("b")])));
        let mut busy = node("b");
        busy.load.queued_tasks = 17;
        assert_eq!(base, fleet_fingerprint(&view(vec![node("a"), busy])));
        let mut gone = node("b");
        gone.online = false;
        assert_ne!(base, fleet_fingerprint(&view(vec![node("a"), gone])));
        assert_ne!(
            base,
            fleet_fingerprint(&view(vec![node("a"), gpu_node("b")]))
        );
    }
}
