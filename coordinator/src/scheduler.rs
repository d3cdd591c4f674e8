//! The scheduler loop: takes the pending queue from the store and a snapshot of
//! the registry, asks the placement policy for decisions, records them (with
//! their explanations) and publishes each placement as a signed `Assignment`
//! (the first send of the outbox row written with the placement).

use std::sync::Arc;
use std::time::Duration;

use starling_placement::federation::{commit, route, RemoteSite, Route};
use starling_placement::{
    ClusterView, Constraints, Demand, NodeView, Outcome, PendingTask, Policy, TaskClass,
};
use starling_proto::{Assignment, NodeId, TaskId, PROTOCOL_VERSION};
use tokio::sync::watch;

use crate::store::{OutboxEntry, StoreError, TaskRecord};
use crate::task::{unix_now_ms, TaskKind, TaskStatus};
use crate::Shared;

/// Most pending tasks handed to the policy in one round.
pub(crate) const QUEUE_WINDOW: u32 = 256;
/// Most in-flight tasks accounted in the cluster view.
const IN_FLIGHT_WINDOW: u32 = 4096;

/// Why a scheduling round stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The store failed.
    #[error("scheduling round failed: {0}")]
    Store(#[from] StoreError),
}

/// What one scheduling round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundSummary {
    /// Tasks placed and published.
    pub placed: usize,
    /// Tasks the policy held back.
    pub held: usize,
    /// Tasks sent to another site.
    pub forwarded: usize,
}

/// Runs rounds when woken (new task, node change, finished task) and at least
/// every `interval`, until told to stop.
pub(crate) async fn run(
    shared: Arc<Shared>,
    mut policy: Box<dyn Policy>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match schedule_round(&shared, policy.as_mut()).await {
            Ok(summary) if summary.placed > 0 => {
                tracing::debug!(?summary, "scheduling round")
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "scheduling round failed; retrying"),
        }
        tokio::select! {
            _ = shared.wake_scheduler.notified() => {}
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
}

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
struct ViewNode {
    id: NodeId,
    telemetry_received_ms: Option<u64>,
}

/// Builds the cluster view from the registry, in node-id order.
fn cluster_view(shared: &Shared, now_ms: u64) -> (ClusterView, Vec<ViewNode>) {
    let registry = shared.registry();
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
        let heard_recently = now_ms.saturating_sub(entry.last_seen_ms) < shared.node_timeout_ms;
        nodes.push(NodeView::from_reports(
            &entry.capability,
            entry.telemetry.as_ref(),
            entry.online() && heard_recently,
        ));
    }
    (ClusterView { now_ms, nodes }, ids)
}

/// What the policy sees in one round: the cluster, with work in flight
/// committed, and the pending queue.
pub(crate) struct Snapshot {
    /// The cluster view.
    pub(crate) view: ClusterView,
    ids: Vec<ViewNode>,
    /// The pending tasks, in queue order.
    pub(crate) pending: Vec<TaskRecord>,
    /// Their placement views; `queue[i].key == i`.
    pub(crate) queue: Vec<PendingTask>,
}

/// The view the policy and the site digest are computed from.
pub(crate) async fn snapshot(
    shared: &Shared,
    pending: Vec<TaskRecord>,
) -> Result<Snapshot, StoreError> {
    let now_ms = unix_now_ms();
    let (mut view, ids) = cluster_view(shared, now_ms);
    // Work already out on nodes occupies them; the view must say so. A node's
    // telemetry already counts the work it reported after the task's last
    // change (its load and task counts), so only work newer than the node's
    // latest telemetry is added here, lest it count twice.
    for record in shared.store.in_flight_tasks(IN_FLIGHT_WINDOW).await? {
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
        let task = pending_task(u64::MAX, &record);
        view.commit(index, &task, record.power_level.unwrap_or(0));
    }
    let queue = pending
        .iter()
        .enumerate()
        .map(|(index, record)| pending_task(index as u64, record))
        .collect();
    Ok(Snapshot {
        view,
        ids,
        pending,
        queue,
    })
}

/// One round: place what the policy places (here, or at a peer site when
/// federated and the task cannot meet its deadline here), record why the
/// rest waits.
pub(crate) async fn schedule_round(
    shared: &Shared,
    policy: &mut dyn Policy,
) -> Result<RoundSummary, ScheduleError> {
    let pending = shared.store.pending_tasks(QUEUE_WINDOW).await?;
    if pending.is_empty() {
        return Ok(RoundSummary::default());
    }
    let Snapshot {
        view,
        ids,
        pending,
        queue,
    } = snapshot(shared, pending).await?;
    let now_ms = view.now_ms;
    let mut sites = shared
        .federation
        .as_ref()
        .map(|federation| federation.remote_sites(&[]))
        .unwrap_or_default();
    let decisions = policy.decide(&view, &queue);

    let mut summary = RoundSummary::default();
    for decision in decisions {
        let Some(record) = usize::try_from(decision.task_key)
            .ok()
            .and_then(|index| pending.get(index))
        else {
            tracing::warn!(
                key = decision.task_key,
                "policy decided on a task it was not given"
            );
            continue;
        };
        // Tasks forwarded here are never forwarded again: one hop, no loops.
        if !sites.is_empty() && record.origin.is_none() {
            let task = &queue[index_of(&decision)];
            if forward(shared, &mut sites, record, task, &decision, now_ms).await? {
                summary.forwarded += 1;
                continue;
            }
        }
        let explanation = serde_json::to_value(&decision.explanation)
            .unwrap_or_else(|error| serde_json::json!({ "error": error.to_string() }));
        match decision.outcome {
            Outcome::Place { node, power_level } => {
                let Some(node_id) = ids.get(node).map(|view_node| &view_node.id) else {
                    tracing::warn!(node, "policy chose a node outside the view");
                    continue;
                };
                let attempt = record.attempt + 1;
                let assigned = shared
                    .store
                    .assign_task(
                        &record.spec.id,
                        attempt,
                        node_id.as_str(),
                        power_level,
                        &explanation,
                        now_ms,
                    )
                    .await?;
                if !assigned {
                    // Cancelled or placed by another replica since it was read.
                    continue;
                }
                let entry = OutboxEntry {
                    task_id: record.spec.id.clone(),
                    attempt,
                    node_id: node_id.to_string(),
                    next_send_ms: now_ms,
                    sends: 0,
                };
                let placed = TaskRecord {
                    status: TaskStatus::Assigned,
                    node_id: Some(node_id.to_string()),
                    attempt,
                    power_level: Some(power_level),
                    ..record.clone()
                };
                if crate::outbox::send(shared, &entry, &placed, unix_now_ms()).await? {
                    tracing::info!(task = %record.spec.id, node = %node_id, attempt, power_level, "task assigned");
                }
                summary.placed += 1;
            }
            Outcome::Hold { .. } => {
                shared
                    .store
                    .hold_task(&record.spec.id, &explanation)
                    .await?;
                summary.held += 1;
            }
        }
    }
    Ok(summary)
}

fn index_of(decision: &starling_placement::Decision) -> usize {
    usize::try_from(decision.task_key).unwrap_or(usize::MAX)
}

/// Forwards `record` to a peer site when the engine says it cannot meet its
/// deadline here and a peer can; true when forwarded.
async fn forward(
    shared: &Shared,
    sites: &mut [RemoteSite],
    record: &TaskRecord,
    task: &PendingTask,
    decision: &starling_placement::Decision,
    now_ms: u64,
) -> Result<bool, StoreError> {
    let Some(federation) = shared.federation.as_ref() else {
        return Ok(false);
    };
    // A site this task was taken back from is not tried again for it.
    let excluded = if record.attempt > 0 {
        shared.store.abandoned_sites(&record.spec.id).await?
    } else {
        Vec::new()
    };
    let candidates: Vec<usize> = (0..sites.len())
        .filter(|&i| {
            !excluded
                .iter()
                .any(|site| site == sites[i].digest.site.as_str())
        })
        .collect();
    let offered: Vec<RemoteSite> = candidates.iter().map(|&i| sites[i].clone()).collect();
    let Route::Forward {
        site,
        finish_ms,
        summary,
    } = route(task, now_ms, decision, &offered)
    else {
        tracing::debug!(
            task = %record.spec.id,
            deadline = ?task.deadline_ms,
            local = ?decision.explanation.alternatives.first().and_then(|a| a.finish_ms),
            peers = ?offered
                .iter()
                .map(|site| (site.digest.site.as_str(), starling_placement::federation::remote_finish_ms(task, now_ms, site)))
                .collect::<Vec<_>>(),
            "stays here"
        );
        return Ok(false);
    };
    let chosen = &mut sites[candidates[site]];
    let name = chosen.digest.site.to_string();
    let api_url = chosen.digest.api_url.to_string();
    let explanation = serde_json::json!({
        "policy": decision.explanation.policy,
        "summary": summary,
        "forwarded_to": name,
        "estimated_finish_ms": finish_ms,
        "local": decision.explanation,
    });
    let attempt = record.attempt + 1;
    if !shared
        .store
        .forward_task(
            &record.spec.id,
            attempt,
            &name,
            &api_url,
            &explanation,
            now_ms,
        )
        .await?
    {
        return Ok(false);
    }
    commit(chosen, task);
    tracing::info!(task = %record.spec.id, site = %name, attempt, %summary, "task goes to another site");
    federation.wake_forwarder.notify_one();
    Ok(true)
}

/// The assignment for one attempt of a stored task to `node`, unsigned
/// (`Signer::sign` fills the validity window and the signature).
pub fn assignment(
    record: &TaskRecord,
    node: &NodeId,
    attempt: u32,
    power_level: u8,
    public_url: &str,
) -> Result<Assignment, String> {
    let spec = &record.spec;
    let task_id = TaskId::new(&spec.id).map_err(|e| e.to_string())?;
    let url = format!("{public_url}/api/v1/artifacts/{}", spec.artifact.to_hex());
    let artifact_url = heapless_string(&url).ok_or_else(|| {
        format!(
            "artifact URL {url} is longer than {} bytes; use a shorter --public-url",
            starling_proto::limits::URL_LEN
        )
    })?;
    let mut args = heapless::Vec::new();
    for arg in &spec.args {
        let arg = heapless_string(arg).ok_or_else(|| format!("argument {arg:?} is too long"))?;
        args.push(arg)
            .map_err(|_| "too many arguments".to_string())?;
    }
    Ok(Assignment {
        v: PROTOCOL_VERSION,
        task_id,
        attempt,
        runtime: spec.runtime,
        artifact: spec.artifact,
        artifact_url,
        args,
        input: spec.input.clone(),
        limits: spec.limits.into(),
        power_level,
        deadline_unix_ms: spec.deadline_unix_ms,
        // What the manifest granted; the node's policy may still refuse it.
        grants: spec.limits.grants.into(),
        // The outbox adds the artifact's publisher signature when it sends.
        publisher: None,
        node_id: node.clone(),
        issued_unix_ms: 0,
        expires_unix_ms: 0,
        signature: Vec::new(),
    })
}

fn heapless_string<const N: usize>(text: &str) -> Option<heapless::String<N>> {
    heapless::String::try_from(text).ok()
}
