//! The cluster as the placement engine sees it in one round: the registry's
//! nodes (with work already in flight committed to them) and the pending
//! queue. The scheduler places from it; the federation's site digest is
//! computed from the same snapshot.

use starling_placement::{ClusterView, Constraints, Demand, NodeView, PendingTask, TaskClass};
use starling_proto::{NodeId, Runtime, WasmEngine};

use std::sync::Arc;

use crate::precompile::Precompile;
use crate::registry::{NodeRegistry, Registry};
use crate::store::{Store, StoreError, TaskRecord};
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

/// The placement engine's view of a stored task.
pub fn pending_task(key: u64, record: &TaskRecord) -> PendingTask {
    let spec = &record.spec;
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
    node_timeout_ms: u64,
    now_ms: u64,
    runs_wasm: impl Fn(&WasmEngine) -> bool,
) -> (ClusterView, Vec<ViewNode>) {
    let mut ids = Vec::with_capacity(registry.len());
    let mut nodes = Vec::with_capacity(registry.len());
    for entry in registry.nodes() {
        ids.push(ViewNode {
            id: entry.capability.node_id.clone(),
            telemetry_received_ms: entry.telemetry_received_ms,
        });
        // A node silent for too long is not offered work even if its last
        // status said online: agents report telemetry every second, and a
        // broker that lost its session state may never deliver a last will.
        let heard_recently = now_ms.saturating_sub(entry.last_seen_ms) < node_timeout_ms;
        let mut node = NodeView::from_reports(
            &entry.capability,
            entry.telemetry.as_ref(),
            entry.online() && heard_recently,
        );
        if !runs_wasm(&entry.capability.wasm) {
            node.runtimes.retain(|runtime| *runtime != Runtime::Wasm);
        }
        nodes.push(node);
    }
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
    /// Which nodes without a compiler this coordinator compiles for.
    pub(crate) precompile: Precompile,
}

impl ViewSource {
    /// The view the policy and the site digest are computed from.
    pub(crate) async fn snapshot(&self, pending: Vec<TaskRecord>) -> Result<Snapshot, StoreError> {
        let now_ms = unix_now_ms();
        let (view, ids) = cluster_view(
            &self.registry.read(),
            self.node_timeout_ms,
            now_ms,
            |wasm| self.precompile.serves(wasm),
        );
        let in_flight = self.store.in_flight_tasks(IN_FLIGHT_WINDOW).await?;
        Ok(assemble(view, ids, &in_flight, pending))
    }
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
    for record in in_flight {
        let Some(node) = record.node_id.as_deref() else {
            continue;
        };
        let Some(index) = ids
            .iter()
            .position(|view_node| view_node.id.as_str() == node)
        else {
            continue;
        };
        let reported = ids[index]
            .telemetry_received_ms
            .is_some_and(|received| received > record.updated_ms);
        if record.status == TaskStatus::Running && reported {
            continue;
        }
        let task = pending_task(u64::MAX, record);
        view.commit(index, &task, record.power_level.unwrap_or(0));
    }
    let queue = pending
        .iter()
        .enumerate()
        .map(|(index, record)| pending_task(index as u64, record))
        .collect();
    Snapshot {
        view,
        ids,
        pending,
        queue,
    }
}
