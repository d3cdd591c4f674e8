//! `GET /metrics`: Prometheus text of the coordinator's gauges and counters.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use starling_api::{ApiError, TaskStatus};

use crate::http::error::HttpError;
use crate::Shared;

/// Prometheus metrics: nodes, tasks by state, MQTT messages handled and ignored.
#[utoipa::path(
    get,
    path = "/metrics",
    responses(
        (status = 200, description = "Metrics in the Prometheus text format", content_type = "text/plain"),
        (status = 500, description = "The database failed", body = ApiError)
    )
)]
pub(crate) async fn metrics(State(shared): State<Arc<Shared>>) -> Result<Response, HttpError> {
    use std::fmt::Write as _;
    use std::sync::atomic::Ordering::Relaxed;
    let counts = shared.store.task_counts().await?;
    let (nodes, online) = {
        let registry = shared.registry();
        (
            registry.len(),
            registry.nodes().filter(|node| node.online()).count(),
        )
    };
    let counters = &shared.counters;
    let mut text = String::new();
    // Writing to a String cannot fail.
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(text, "{name}{labels} {value}");
        }
    };
    metric(
        "starling_nodes",
        "gauge",
        "Nodes known to the coordinator.",
        &[(String::new(), nodes as u64)],
    );
    metric(
        "starling_nodes_online",
        "gauge",
        "Nodes online.",
        &[(String::new(), online as u64)],
    );
    let tasks: Vec<(String, u64)> = TaskStatus::ALL
        .into_iter()
        .map(|status| {
            let count = counts
                .iter()
                .find(|(s, _)| *s == status)
                .map_or(0, |(_, c)| *c);
            (format!("{{state=\"{status}\"}}"), count)
        })
        .collect();
    metric("starling_tasks", "gauge", "Tasks by state.", &tasks);
    metric(
        "starling_mqtt_messages_handled_total",
        "counter",
        "MQTT messages applied (or recognised as redeliveries).",
        &[(String::new(), counters.messages_handled.load(Relaxed))],
    );
    metric(
        "starling_mqtt_messages_ignored_total",
        "counter",
        "MQTT messages refused: malformed, unknown node or task, mismatched ids.",
        &[(String::new(), counters.messages_ignored.load(Relaxed))],
    );
    let refused: Vec<(String, u64)> = crate::domain::reports::ReportRefused::REASONS
        .iter()
        .zip(&counters.reports_refused)
        .map(|(reason, count)| (format!("{{reason=\"{reason}\"}}"), count.load(Relaxed)))
        .collect();
    metric(
        "starling_reports_refused_total",
        "counter",
        "Node reports refused for not proving their sender: unsigned, signed by another key or as another node, on another channel, or replayed.",
        &refused,
    );
    metric(
        "starling_task_events_duplicate_total",
        "counter",
        "Task events received again and recorded only once.",
        &[(String::new(), counters.duplicate_events.load(Relaxed))],
    );
    metric(
        "starling_assignments_published_total",
        "counter",
        "Assignments published to nodes.",
        &[(String::new(), counters.assignments_published.load(Relaxed))],
    );
    metric(
        "starling_assignments_resent_total",
        "counter",
        "Assignments sent again because their node had not acknowledged them.",
        &[(String::new(), counters.assignments_resent.load(Relaxed))],
    );
    metric(
        "starling_assignments_rejected_total",
        "counter",
        "Assignments a node refused (bad signature, other node, expired, policy).",
        &[(String::new(), counters.assignments_rejected.load(Relaxed))],
    );
    metric(
        "starling_nodes_suspected_total",
        "counter",
        "Nodes marked offline because nothing was heard from them within the node timeout.",
        &[(String::new(), counters.nodes_suspected.load(Relaxed))],
    );
    metric(
        "starling_stale_attempts_cancelled_total",
        "counter",
        "Cancels sent to nodes reporting work on an attempt that is no longer current.",
        &[(String::new(), counters.stale_cancels.load(Relaxed))],
    );
    metric(
        "starling_attempts_ended_total",
        "counter",
        "Attempts on online nodes the coordinator ended: past their wall-time limit plus the grace, or not held by their node.",
        &[
            (
                "{reason=\"wall_time_exceeded\"}".to_string(),
                counters.attempts_overdue.load(Relaxed),
            ),
            (
                "{reason=\"unknown_to_node\"}".to_string(),
                counters.attempts_unknown_to_node.load(Relaxed),
            ),
        ],
    );
    if let Some(federation) = &shared.federation {
        let gossip = federation.gossip.counters();
        let sites = federation.gossip.table().entries(std::time::Instant::now());
        let states: Vec<(String, u64)> = ["alive", "suspect", "down"]
            .into_iter()
            .map(|state| {
                let count = sites
                    .iter()
                    .filter(|entry| entry.state.as_str() == state)
                    .count();
                (format!("{{state=\"{state}\"}}"), count as u64)
            })
            .collect();
        metric(
            "starling_federation_sites",
            "gauge",
            "Other sites of the federation by failure-detector state.",
            &states,
        );
        for (name, help, counter) in [
            ("starling_gossip_datagrams_sent_total", "Gossip datagrams sent.", &gossip.datagrams_out),
            ("starling_gossip_bytes_sent_total", "Gossip bytes sent, sealed.", &gossip.bytes_out),
            ("starling_gossip_datagrams_received_total", "Gossip datagrams received.", &gossip.datagrams_in),
            ("starling_gossip_bytes_received_total", "Gossip bytes received.", &gossip.bytes_in),
            ("starling_gossip_datagrams_refused_total", "Gossip datagrams dropped: not sealed with the cluster key, or over the size bound.", &gossip.refused),
            ("starling_gossip_datagrams_malformed_total", "Authenticated gossip datagrams the membership protocol could not use.", &gossip.malformed),
            ("starling_gossip_digests_dropped_total", "Site digests dropped because they did not decode.", &gossip.digests_dropped),
        ] {
            metric(name, "counter", help, &[(String::new(), counter.load(Relaxed))]);
        }
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}
