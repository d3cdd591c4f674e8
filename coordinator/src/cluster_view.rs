//! The cluster as the placement engine sees it in one round: the registry's
//! nodes (with work already in flight committed to them) and the pending
//! queue. The scheduler places from it; the federation's site digest is
//! computed from the same snapshot.

use starling_placement::capable::{incapable, Scope};
use starling_placement::{ClusterView, Constraints, Demand, NodeView, PendingTask, TaskClass};
use starling_proto::{NodeId, Runtime, WasmEngine};

use std::sync::Arc;

use crate::counters::Counters;
use crate::domain::liveness::Silence;
use crate::precompile::Precompile;
use crate::registry::{NodeRegistry, Registry};
use crate::store::{NewTask, Store, StoreError, TaskRecord};
use crate::task::{unix_now_ms, TaskKind, TaskStatus};

/// Most pending tasks handed to the policy in one round.
pub(crate) const QUEUE_WINDOW: u32 = 256;

/// Most in-flight tasks accounted in the cluster view.
pub(crate) const IN_FLIGHT_WINDOW: u32 = 4096;

fn placement_class(kind: TaskKind) -> TaskClass {
    match kind {
        TaskKind::Cpu => TaskClass::Cpu,
        TaskKind::Gpu => TaskClass::Gpu,
        TaskKind::Io => TaskClass::Io,
    }
}

/// Windows of the queue one round reads at most while it looks past
/// parked tasks for work to place: 64 × 256 tasks, some milliseconds of
/// reads; a queue with more unrunnable tasks than that is parked over
/// several rounds.
pub(crate) const MAX_WINDOWS_PER_ROUND: usize = 64;

/// The placement engine's view of a task.
pub fn pending_task(key: u64, spec: &NewTask) -> PendingTask {
    PendingTask {
        key,
        class: placement_class(spec.class),
        demand: Demand {
            cpu_cores: spec.demand.cpu_cores,
            memory_bytes: spec.demand.memory_mb.saturating_mul(1024 * 1024),
            gpu: spec.demand.gpu,
            io_mbps: spec.demand.io_mbps,
            gpu_memory_bytes: spec.demand.gpu_memory_bytes,
        },
        work: spec.work_seconds,
        input_bytes: spec.input.len() as u64,
        output_bytes: spec.limits.output_bytes.min(64 * 1024),
        deadline_ms: spec.deadline_unix_ms,
        priority: spec.priority,
        submitted_ms: spec.created_ms,
        constraints: Constraints {
            runtime: spec.runtime,
            arch: None,
            labels: Vec::new(),
            device_kind: spec.demand.device.required_kind(),
            fp64: spec.demand.fp64,
        },
        artifact: starling_placement::correction::artifact_key(&spec.artifact.0),
    }
}

/// One node of the view: its id and when its latest telemetry arrived.
pub(crate) struct ViewNode {
    pub(crate) id: NodeId,
    pub(crate) telemetry_received_ms: Option<u64>,
}

/// Builds the cluster view from the registry, in node-id order. A node
/// without a compiler keeps the wasm runtime only when `runs_wasm` says this
/// coordinator can compile for it, so placement never gives it a module it
/// cannot run.
pub(crate) fn cluster_view(
    registry: &Registry,
    silence: &Silence,
    runs_wasm: impl Fn(&WasmEngine) -> bool,
) -> (ClusterView, Vec<ViewNode>) {
    let now_ms = silence.now_ms;
    let mut ids = Vec::with_capacity(registry.len());
    let mut nodes = Vec::with_capacity(registry.len());
    for entry in registry.nodes() {
        ids.push(ViewNode {
            id: entry.capability.node_id.clone(),
            telemetry_received_ms: entry.telemetry_received_ms,
        });
        // A node silent for too long is not offered work even if its last
        // status said online (and before failure detection marks it): agents
        // report telemetry every second, and a broker that lost its session
        // state may never deliver a last will. Silence is judged as failure
        // detection judges it.
        let heard_recently = !silence.is_silent(entry.last_seen_ms);
        // One that left an assignment unanswered is offered nothing until
        // it answers (`domain::attempts`, the unanswered rule).
        let mut node = NodeView::from_reports(
            &entry.capability,
            entry.telemetry.as_ref(),
            entry.online() && heard_recently && !entry.unresponsive,
        );
        if !runs_wasm(&entry.capability.wasm) {
            node.runtimes.retain(|runtime| *runtime != Runtime::Wasm);
        }
        // What its finished attempts taught (placement multiplies its run
        // time estimates by it).
        node.corrections = entry.corrections.clone();
        nodes.push(node);
    }
    // A node that has not run an artifact or a class of work yet assumes
    // what the others measured of it.
    starling_placement::correction::share_priors(&mut nodes);
    (ClusterView { now_ms, nodes }, ids)
}

/// What the policy sees in one round: the cluster, with work in flight
/// committed, and the pending queue.
pub(crate) struct Snapshot {
    /// The cluster view.
    pub(crate) view: ClusterView,
    /// Its nodes' ids, in view order.
    pub(crate) ids: Vec<ViewNode>,
    /// The pending tasks, in queue order.
    pub(crate) pending: Vec<TaskRecord>,
    /// Their placement views; `queue[i].key == i`.
    pub(crate) queue: Vec<PendingTask>,
    /// Per view node: assignments sent to it that it has not answered yet
    /// (tasks `assigned`, no event back).
    pub(crate) unanswered: Vec<u32>,
}

/// Takes out of this round the nodes that have not answered
/// `max_unanswered` assignments or more: a node (or its link) that is
/// behind gets no more work until it catches up, so the backlog waits in
/// the coordinator's queue rather than in front of the node, where
/// assignments expire and re-sends add to what it has to catch up with.
/// Returns how many nodes were taken out.
pub(crate) fn withhold_behind(
    view: &mut ClusterView,
    unanswered: &[u32],
    max_unanswered: u32,
) -> usize {
    let mut withheld = 0;
    for (node, unanswered) in view.nodes.iter_mut().zip(unanswered) {
        if node.online && *unanswered >= max_unanswered {
            // Offline for this round's decisions only: the view is rebuilt
            // from the registry every round.
            node.online = false;
            withheld += 1;
        }
    }
    withheld
}

/// Where snapshots are read from: the registry and the store, with the
/// silence after which a node is not offered work.
#[derive(Clone)]
pub(crate) struct ViewSource {
    /// The nodes as reported.
    pub(crate) registry: Arc<NodeRegistry>,
    /// Pending and in-flight tasks.
    pub(crate) store: Store,
    /// Silence after which a node is suspected, ms.
    pub(crate) node_timeout_ms: u64,
    /// How far ingest is behind (not counted as a node's silence).
    pub(crate) counters: Arc<Counters>,
    /// Which nodes without a compiler this coordinator compiles for.
    pub(crate) precompile: Precompile,
}

impl ViewSource {
    /// The nodes as the policy sees them now, without the work in flight.
    pub(crate) fn nodes(&self) -> (ClusterView, Vec<ViewNode>) {
        let silence = Silence {
            now_ms: unix_now_ms(),
            timeout_ms: self.node_timeout_ms,
            ingest_lag_ms: self.counters.ingest.lag_ms(),
            listening_since_ms: 0,
        };
        cluster_view(&self.registry.read(), &silence, |wasm| {
            self.precompile.serves(wasm)
        })
    }

    /// The view the policy and the site digest are computed from.
    pub(crate) async fn snapshot(&self, pending: Vec<TaskRecord>) -> Result<Snapshot, StoreError> {
        let (view, ids) = self.nodes();
        self.snapshot_of(view, ids, pending).await
    }

    /// [`ViewSource::snapshot`] over nodes already read with
    /// [`ViewSource::nodes`].
    pub(crate) async fn snapshot_of(
        &self,
        view: ClusterView,
        ids: Vec<ViewNode>,
        pending: Vec<TaskRecord>,
    ) -> Result<Snapshot, StoreError> {
        let in_flight = self.store.in_flight_tasks(IN_FLIGHT_WINDOW).await?;
        Ok(assemble(view, ids, &in_flight, pending))
    }
}

/// One window of the queue, sorted: the tasks some online node of `view`
/// could take (or that may go to another site: `forwardable`), in queue
/// order, and the ids of those none could, each with the explanation it is
/// parked with.
pub(crate) fn sort_window(
    view: &ClusterView,
    window: Vec<TaskRecord>,
    forwardable: impl Fn(&TaskRecord) -> bool,
) -> (Vec<TaskRecord>, Vec<(String, serde_json::Value)>) {
    let mut runnable = Vec::with_capacity(window.len());
    let mut parked = Vec::new();
    for record in window {
        if forwardable(&record) {
            runnable.push(record);
            continue;
        }
        match incapable(view, &pending_task(0, &record.spec), Scope::Online) {
            None => runnable.push(record),
            Some(why) => {
                let explanation = serde_json::to_value(&why)
                    .unwrap_or_else(|error| serde_json::json!({ "error": error.to_string() }));
                parked.push((record.spec.id, explanation));
            }
        }
    }
    (runnable, parked)
}

/// The snapshot from a view of the nodes, the work in flight and the pending
/// queue, with work already out on nodes committed to them.
pub(crate) fn assemble(
    mut view: ClusterView,
    ids: Vec<ViewNode>,
    in_flight: &[TaskRecord],
    pending: Vec<TaskRecord>,
) -> Snapshot {
    // Work already out on nodes occupies them; the view must say so. A node's
    // telemetry already counts the work it reported after the task's last
    // change (its load and task counts), so only work newer than the node's
    // latest telemetry is added here, lest it count twice.
    // By id: a round reads thousands of tasks in flight on thousands of nodes.
    let index_of: std::collections::HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(index, view_node)| (view_node.id.as_str(), index))
        .collect();
    let mut unanswered = vec![0_u32; ids.len()];
    for record in in_flight {
        let Some(node) = record.node_id.as_deref() else {
            continue;
        };
        let Some(&index) = index_of.get(node) else {
            continue;
        };
        if record.status == TaskStatus::Assigned {
            if let Some(count) = unanswered.get_mut(index) {
                *count += 1;
            }
        }
        let reported = ids[index]
            .telemetry_received_ms
            .is_some_and(|received| received > record.updated_ms);
        if record.status == TaskStatus::Running && reported {
            continue;
        }
        let task = pending_task(u64::MAX, &record.spec);
        view.commit(index, &task, record.power_level.unwrap_or(0));
    }
    let queue = pending
        .iter()
        .enumerate()
        .map(|(index, record)| pending_task(index as u64, &record.spec))
        .collect();
    Snapshot {
        view,
        ids,
        pending,
        queue,
        unanswered,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use starling_placement::testing::node;

    use super::*;

    fn in_flight(id: &str, node: &str, status: TaskStatus) -> TaskRecord {
        TaskRecord {
            status,
            node_id: Some(node.to_string()),
            attempt: 1,
            power_level: Some(0),
            ..TaskRecord::sample(id)
        }
    }

    /// The view offers work only to nodes the silence rule finds heard, as
    /// failure detection judges them: a node last heard past the timeout is
    /// offered nothing, unless ingest is that far behind (its report may be
    /// waiting in the queue).
    #[test]
    fn the_view_judges_silence_as_failure_detection_does_ingest_lag_included() {
        use crate::registry::tests::{capability, status};
        use starling_proto::NodeState;
        let mut registry = Registry::new();
        let id = NodeId::new("quiet").unwrap();
        registry
            .apply_capability(&id, capability("quiet"), 1_000)
            .unwrap();
        registry
            .apply_status(&id, status("quiet", NodeState::Online), 1_000)
            .unwrap();
        let offered = |now_ms, ingest_lag_ms| {
            let silence = Silence {
                now_ms,
                timeout_ms: 5_000,
                ingest_lag_ms,
                listening_since_ms: 0,
            };
            cluster_view(&registry, &silence, |_| true).0.nodes[0].online
        };
        assert!(offered(5_999, 0));
        assert!(!offered(6_000, 0), "silent for the node timeout");
        assert!(offered(6_000, 2_000), "ingest 2 s behind: not silence");
        assert!(!offered(8_000, 2_000));
    }

    #[test]
    fn nodes_that_leave_assignments_unanswered_get_no_more_this_round() {
        let view = ClusterView {
            now_ms: 10,
            nodes: vec![
                node("a", 4.0, 1.0),
                node("b", 4.0, 1.0),
                node("c", 4.0, 1.0),
            ],
        };
        let ids = view
            .nodes
            .iter()
            .map(|node| ViewNode {
                id: node.id.clone(),
                telemetry_received_ms: Some(10),
            })
            .collect();
        // `a`: three sent and unanswered; `b`: two unanswered and two it
        // answered (running); `c`: nothing.
        let tasks = [
            in_flight("1", "a", TaskStatus::Assigned),
            in_flight("2", "a", TaskStatus::Assigned),
            in_flight("3", "a", TaskStatus::Assigned),
            in_flight("4", "b", TaskStatus::Assigned),
            in_flight("5", "b", TaskStatus::Assigned),
            in_flight("6", "b", TaskStatus::Running),
            in_flight("7", "b", TaskStatus::Running),
            in_flight("8", "elsewhere", TaskStatus::Assigned),
        ];
        let mut snapshot = assemble(view, ids, &tasks, Vec::new());
        assert_eq!(snapshot.unanswered, [3, 2, 0]);

        assert_eq!(
            withhold_behind(&mut snapshot.view, &snapshot.unanswered, 3),
            1
        );
        let online: Vec<bool> = snapshot.view.nodes.iter().map(|n| n.online).collect();
        assert_eq!(online, [false, true, true], "only `a` is behind");

        // A lower bar takes `b` out too; a node already offline is not counted.
        assert_eq!(
            withhold_behind(&mut snapshot.view, &snapshot.unanswered, 2),
            1
        );
        assert!(!snapshot.view.nodes[1].online);
        assert!(snapshot.view.nodes[2].online);
    }
}
