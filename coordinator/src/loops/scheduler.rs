//! The scheduler loop: takes the pending queue from the store and a snapshot of
//! the registry, asks the placement policy for decisions, records them (with
//! their explanations) and publishes each placement as a signed `Assignment`
//! (the first send of the outbox row written with the placement).

use std::sync::Arc;
use std::time::Duration;

use starling_placement::federation::{commit, route, RemoteSite, Route};
use starling_placement::{Outcome, PendingTask, Policy};
use tokio::sync::watch;

use crate::loops::cluster_view::{snapshot, Snapshot, QUEUE_WINDOW};
use crate::store::{OutboxEntry, StoreError, TaskRecord};
use crate::task::{unix_now_ms, TaskStatus};
use crate::Shared;

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
                if crate::mqtt::publish::send_assignment(shared, &entry, &placed, unix_now_ms())
                    .await?
                {
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
