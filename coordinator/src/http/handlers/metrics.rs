//! `GET /metrics`: Prometheus text of the coordinator's gauges, counters and
//! the placement decision-time histogram, written by hand (a handful of
//! series does not need a metrics crate). [`SERIES`] lists every metric the
//! coordinator exports, so a dashboard's queries can be checked against it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use starling_api::{ApiError, TaskStatus};

use crate::counters::HistogramSnapshot;
use crate::http::error::HttpError;
use crate::http::Shared;

/// Every metric `/metrics` exports (a histogram by its base name), the
/// federation's only when `--site` is set. `deploy/grafana/starling.json`
/// queries only these, and the handler writes only these (checked in debug
/// builds, which the integration tests run); tests hold both to it.
pub(crate) const SERIES: &[&str] = &[
    "starling_nodes",
    "starling_nodes_online",
    "starling_tasks",
    "starling_queue_length",
    "starling_placement_decision_seconds",
    "starling_estimate_error_ratio",
    "starling_event_stream_clients",
    "starling_ingest_backlog",
    "starling_ingest_lag_milliseconds",
    "starling_leader",
    "starling_leader_term",
    "starling_mqtt_messages_handled_total",
    "starling_mqtt_messages_ignored_total",
    "starling_mqtt_messages_dropped_total",
    "starling_reports_refused_total",
    "starling_task_events_duplicate_total",
    "starling_task_event_batches_total",
    "starling_assignments_published_total",
    "starling_assignments_resent_total",
    "starling_assignments_rejected_total",
    "starling_nodes_suspected_total",
    "starling_stale_attempts_cancelled_total",
    "starling_attempts_ended_total",
    "starling_tasks_parked_total",
    "starling_console_stream_reads_total",
    "starling_http_connections",
    "starling_http_connections_closed_total",
    "starling_mosquitto_reloads_total",
    "starling_federation_sites",
    "starling_gossip_datagrams_sent_total",
    "starling_gossip_bytes_sent_total",
    "starling_gossip_datagrams_received_total",
    "starling_gossip_bytes_received_total",
    "starling_gossip_datagrams_refused_total",
    "starling_gossip_datagrams_malformed_total",
    "starling_gossip_digests_dropped_total",
    "starling_gossip_datagrams_replayed_total",
    "starling_gossip_syncs_total",
    "starling_gossip_syncs_failed_total",
    "starling_gossip_health_score",
];

/// The states `starling_nodes` counts, in order.
const NODE_STATES: [&str; 4] = ["online", "suspect", "offline", "revoked"];

/// Prometheus metrics: nodes and tasks by state, the queue, placement
/// decision time, event-stream clients, MQTT messages handled and ignored,
/// and more.
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
    let status = shared.status();
    let counts = status.task_counts().await?;
    let leadership = status.leadership();
    // Revoked first (a revoked node is also offline), then what the node
    // said, and suspect where liveness marked it offline for its silence.
    let mut node_states = [0_u64; NODE_STATES.len()];
    {
        let registry = shared.registry();
        for node in registry.nodes() {
            let state = if shared
                .mqtt_access
                .is_revoked(node.capability.node_id.as_str())
            {
                3
            } else if node.online() {
                0
            } else if node.silent {
                1
            } else {
                2
            };
            if let Some(count) = node_states.get_mut(state) {
                *count += 1;
            }
        }
    }
    let online = node_states[0];
    let counters = &shared.counters;
    let mut text = String::new();
    // Writing to a String cannot fail.
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        debug_assert!(SERIES.contains(&name), "{name} is missing from SERIES");
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(text, "{name}{labels} {value}");
        }
    };
    let nodes: Vec<(String, u64)> = NODE_STATES
        .iter()
        .zip(node_states)
        .map(|(state, count)| (format!("{{state=\"{state}\"}}"), count))
        .collect();
    metric(
        "starling_nodes",
        "gauge",
        "Nodes known to the coordinator by state: online; suspect (offline because nothing was heard from it within the node timeout); offline (it said so); revoked.",
        &nodes,
    );
    metric(
        "starling_nodes_online",
        "gauge",
        "Nodes online.",
        &[(String::new(), online)],
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
    let pending = counts
        .iter()
        .find(|(status, _)| *status == TaskStatus::Pending)
        .map_or(0, |(_, count)| *count);
    metric(
        "starling_queue_length",
        "gauge",
        "Tasks waiting to be placed (pending, held ones included).",
        &[(String::new(), pending)],
    );
    metric(
        "starling_event_stream_clients",
        "gauge",
        "Open subscriptions to the live event feed: event streams (GET /api/v1/events, console pages), long polls waiting on a task, and the console's own telemetry history.",
        &[(String::new(), shared.feed.clients() as u64)],
    );
    metric(
        "starling_ingest_backlog",
        "gauge",
        "MQTT messages received and not yet handled (read when a message is handed to its worker); divided by the rate of starling_mqtt_messages_handled_total, how far ingest lags.",
        &[(
            String::new(),
            shared
                .counters
                .ingest
                .backlog
                .load(std::sync::atomic::Ordering::Relaxed),
        )],
    );
    metric(
        "starling_ingest_lag_milliseconds",
        "gauge",
        "How long the MQTT messages ingest is applying now waited for it (0 when caught up); failure detection does not count this time as a node's silence.",
        &[(String::new(), shared.counters.ingest.lag_ms())],
    );
    metric(
        "starling_leader",
        "gauge",
        "1 while this coordinator schedules for its site (always for a single coordinator; for replicas on PostgreSQL, while it holds the site's lease), else 0.",
        &[(String::new(), u64::from(leadership.leads))],
    );
    metric(
        "starling_leader_term",
        "gauge",
        "The term this replica leads under (the lease's epoch; 0 when it does not lead or has no replicas).",
        &[(String::new(), leadership.term.unwrap_or(0))],
    );
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
        "starling_mqtt_messages_dropped_total",
        "counter",
        "MQTT messages dropped at ingest: over their node's per-channel budget, telemetry and events that found the queue full, or over the protocol's size limit (from a broker without the packet limit; a retained one is cleared).",
        &[
            (
                "{reason=\"node_budget\"}".to_string(),
                counters.messages_dropped_over_budget.load(Relaxed),
            ),
            (
                "{reason=\"backlog\"}".to_string(),
                counters.messages_dropped_backlog.load(Relaxed),
            ),
            (
                "{reason=\"oversize\"}".to_string(),
                counters.messages_dropped_oversize.load(Relaxed),
            ),
        ],
    );
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
        "starling_task_event_batches_total",
        "counter",
        "Transactions that recorded task events: ingest records the events waiting for it together (group commit).",
        &[(String::new(), counters.event_batches.load(Relaxed))],
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
        "Attempts on online nodes the coordinator ended: past their wall-time limit plus the grace, not held by their node, or never answered by it.",
        &[
            (
                "{reason=\"wall_time_exceeded\"}".to_string(),
                counters.attempts_overdue.load(Relaxed),
            ),
            (
                "{reason=\"unknown_to_node\"}".to_string(),
                counters.attempts_unknown_to_node.load(Relaxed),
            ),
            (
                "{reason=\"unanswered\"}".to_string(),
                counters.attempts_unanswered.load(Relaxed),
            ),
        ],
    );
    metric(
        "starling_tasks_parked_total",
        "counter",
        "Times a pending task was parked because no online node could run it (read again when the fleet changes).",
        &[(String::new(), counters.tasks_parked.load(Relaxed))],
    );
    let reads = &shared.console.reads;
    metric(
        "starling_console_stream_reads_total",
        "counter",
        "Database reads the console's live streams made, by what they read; each served every stream that asked meanwhile.",
        &[
            ("{table=\"task_lists\"}".to_string(), reads.task_lists.reads()),
            ("{table=\"tasks\"}".to_string(), reads.tasks.reads()),
            ("{table=\"task_details\"}".to_string(), reads.task_details.reads()),
        ],
    );
    let connections = shared.connections.counts();
    metric(
        "starling_http_connections",
        "gauge",
        "REST connections open now, and the cap (below the descriptor limit).",
        &[
            ("{kind=\"open\"}".to_string(), connections.open as u64),
            ("{kind=\"cap\"}".to_string(), connections.max as u64),
        ],
    );
    metric(
        "starling_http_connections_closed_total",
        "counter",
        "REST connections closed at the cap: the oldest silent one to make room, or a new one when every open one was busy.",
        &[
            ("{reason=\"silent_at_cap\"}".to_string(), connections.evicted),
            ("{reason=\"busy_at_cap\"}".to_string(), connections.refused),
        ],
    );
    metric(
        "starling_mosquitto_reloads_total",
        "counter",
        "Rewrites of Mosquitto's password file and ACL, each signalled and waited for until Mosquitto reread it; one covers every enrollment and revocation that arrived while the previous one ran (0 when the coordinator writes no Mosquitto files).",
        &[(
            String::new(),
            shared.access().mosquitto_reloads(),
        )],
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
            ("starling_gossip_datagrams_replayed_total", "Authenticated gossip datagrams and sync frames refused as replayed, or sealed outside the clock window.", &gossip.replayed),
            ("starling_gossip_syncs_total", "Full state syncs with another site completed, either side.", &gossip.syncs),
            ("starling_gossip_syncs_failed_total", "Full state syncs that failed: unreachable, timed out or refused.", &gossip.syncs_failed),
        ] {
            metric(name, "counter", help, &[(String::new(), counter.load(Relaxed))]);
        }
        metric(
            "starling_gossip_health_score",
            "gauge",
            "Lifeguard's local health score: 0 is healthy; each step scales the probe interval and timeout by one more.",
            &[(String::new(), gossip.health_score.load(Relaxed))],
        );
    }
    histogram(
        &mut text,
        "starling_placement_decision_seconds",
        "Time the placement policy took to decide one scheduling round (every pending task in the round's window), seconds.",
        &counters.placement_decisions.snapshot(),
    );
    histogram(
        &mut text,
        "starling_estimate_error_ratio",
        "Finished attempts by their run time as measured by the node over the run time placement expected (its model times what the node's earlier attempts taught it): 1 is exact, 2 twice as long. The sum is the ratios' total.",
        &counters.estimate_errors.snapshot(),
    );
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// Writes a histogram in the Prometheus text format: cumulative buckets by
/// upper bound, `+Inf`, the sum and the count.
fn histogram(text: &mut String, name: &str, help: &str, snapshot: &HistogramSnapshot) {
    use std::fmt::Write as _;
    debug_assert!(SERIES.contains(&name), "{name} is missing from SERIES");
    // Writing to a String cannot fail.
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (bound, count) in &snapshot.buckets {
        let _ = writeln!(text, "{name}_bucket{{le=\"{bound}\"}} {count}");
    }
    let _ = writeln!(
        text,
        "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}",
        count = snapshot.count,
        sum = snapshot.sum
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The metric names a PromQL expression reads: every identifier that
    /// starts with `starling_`, with a histogram's `_bucket`, `_sum` and
    /// `_count` suffix taken off.
    fn metric_names(expr: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut rest = expr;
        while let Some(start) = rest.find("starling_") {
            let tail = &rest[start..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|base| SERIES.contains(base))
                })
                .unwrap_or(name);
            names.push(base.to_owned());
            rest = &tail[end..];
        }
        names
    }

    /// Every `expr` in the dashboard, panels nested in rows included.
    fn exprs(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                        _ => exprs(value, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|item| exprs(item, out)),
            _ => {}
        }
    }

    #[test]
    fn metric_names_come_out_of_promql() {
        assert_eq!(
            metric_names(
                "histogram_quantile(0.99, sum by (le) (rate(starling_placement_decision_seconds_bucket[5m])))"
            ),
            vec!["starling_placement_decision_seconds"]
        );
        assert_eq!(
            metric_names("sum(starling_nodes{state=\"online\"}) / starling_queue_length"),
            vec!["starling_nodes", "starling_queue_length"]
        );
        assert!(metric_names("up").is_empty());
    }

    /// The Grafana dashboard queries only metrics the coordinator exports.
    /// (The integration test `metrics` checks it against a live `/metrics`
    /// too.)
    #[test]
    fn the_grafana_dashboard_reads_only_exported_metrics() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/grafana/starling.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut found = Vec::new();
        exprs(&dashboard, &mut found);
        assert!(found.len() >= 7, "{found:?}");
        for expr in &found {
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{expr} reads no Starling metric");
            for name in names {
                assert!(
                    SERIES.contains(&name.as_str()),
                    "the dashboard queries {name}, which /metrics does not export ({expr})"
                );
            }
        }
    }
}
