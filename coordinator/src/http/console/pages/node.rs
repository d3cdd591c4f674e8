//! A node's page (`/nodes/{id}`): its live state and telemetry plot (pushed
//! by the console's stream), capability (devices with calibrated GFLOP/s,
//! disks, network), credentials, recent tasks, and revoke for operators.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::{html, Markup};
use starling_api::Role;
use starling_placement::TaskClass;
use starling_proto::NodeId;

use super::super::fragments::{
    liveness, own_site, segment, sourced, state_badge, task_row, NodeState, NodeView,
};
use super::super::layout::{ago, bytes, percent, respond, utc, Caller, ConsoleError, Section};
use super::super::svg::plot;
use super::tasks::recent_tasks;
use crate::http::Shared;
use crate::registry::NodeEntry;
use crate::task::unix_now_ms;

/// Tasks listed on a node's page.
const RECENT_TASKS: usize = 20;

/// Revokes one node through the use case the REST API calls (credentials,
/// broker files, registry, requeue of its tasks), so both do exactly the same.
pub(crate) async fn revoke_one(shared: &Arc<Shared>, node_id: &str) -> Result<(), ConsoleError> {
    match shared.access().revoke_node(node_id).await {
        Ok(_) => Ok(()),
        Err(error) => Err(ConsoleError::from_http(error.into()).await),
    }
}

fn unknown(id: &str) -> ConsoleError {
    ConsoleError::NotFound(format!("no node {id:?} has reported to this coordinator"))
}

/// The live part of a node's page: state, liveness, load and the plot. The
/// console's stream sends it again on every change of the node.
pub(crate) fn live_section(view: &NodeView, now_ms: u64) -> Markup {
    let (mqtt, heartbeat) = liveness(view, now_ms);
    html! {
        dl.facts {
            dt { "State" } dd { (state_badge(view.state)) }
            dt { "MQTT session" } dd { (mqtt) }
            dt { "Last heartbeat" } dd { (heartbeat) }
            dt { "Power level" } dd { (view.power_level.map_or("–".to_owned(), |level| level.to_string())) }
            dt { "CPU load" } dd { (view.cpu_load.map_or("–".to_owned(), percent)) }
            dt { "Memory in use" } dd { (view.memory_used.map_or("–".to_owned(), percent)) }
            dt { "Round trip" } dd { (view.rtt_ms.map_or("–".to_owned(), |rtt| format!("{rtt:.1} ms"))) }
            dt { "Running tasks" } dd { (view.running_tasks.map_or("–".to_owned(), |n| n.to_string())) }
            dt { "Energy since start" } dd { (view.energy.map_or("–".to_owned(), |(joules, source)| sourced(format!("{joules:.1} J"), source))) }
            dt { "GPU load" } dd { (view.gpu_load.map_or("–".to_owned(), |load| sourced(percent(load), starling_proto::Source::Sensor))) }
        }
        (plot(&view.samples))
    }
}

/// The view of one node, if the registry holds it.
pub(crate) fn node_view(shared: &Shared, id: &str) -> Option<(NodeView, NodeEntry)> {
    let node = NodeId::new(id).ok()?;
    let registry = shared.registry();
    let entry = registry.get(&node)?.clone();
    drop(registry);
    let revoked = shared.mqtt_access.is_revoked(id);
    let view = NodeView::of(
        &entry,
        revoked,
        &own_site(shared),
        shared.console.history.samples(id),
    );
    Some((view, entry))
}

/// How this node's run times stood against placement's estimates: per
/// class of work, the factor its finished attempts taught (measured), or
/// the model alone where none has finished yet.
fn estimates(entry: &NodeEntry) -> Markup {
    let corrections = &entry.corrections;
    let learned_artifacts = corrections
        .by_artifact
        .iter()
        .filter(|(_, correction)| correction.samples > 0)
        .count();
    html! {
        section #estimates {
            h2 { "Run-time estimates" }
            table {
                thead { tr { th { "Work" } th.num { "Observed ÷ modelled" } th.num { "Attempts" } th { "Estimates use" } } }
                tbody {
                    @for (class, correction) in TaskClass::ALL.iter().zip(&corrections.by_class) {
                        tr {
                            td { (class.as_str()) }
                            @if correction.samples > 0 {
                                td.num { (format!("{:.2}", correction.factor())) }
                                td.num { (correction.samples) }
                                td { "measured: the model × this factor" }
                            } @else {
                                td.num { "–" } td.num { "0" } td.muted { "the model alone (nothing finished here yet)" }
                            }
                        }
                    }
                }
            }
            p.muted { (learned_artifacts) " artifacts have a factor of their own here; "
                (entry.expected.len()) " attempts placed here are awaited." }
        }
    }
}

fn capability(entry: &NodeEntry) -> Markup {
    let capability = &entry.capability;
    let (speed, speed_source) = starling_placement::cpu_speed_of(capability);
    let speed = sourced(format!("{speed:.2}× the reference core"), speed_source);
    let link = entry.telemetry.as_ref().map(|t| &t.link);
    html! {
        section {
            h2 { "Capability" }
            dl.facts {
                dt { "Agent" } dd { (capability.agent_version.as_str()) }
                dt { "OS / arch" } dd { (capability.os.as_str()) " / " (capability.arch.as_str()) }
                dt { "CPU" } dd { (capability.cpu.model.as_str()) ", " (capability.cpu.cores) " cores, "
                    (capability.cpu.min_mhz) "–" (capability.cpu.max_mhz) " MHz" }
                dt { "Speed per core" } dd { (speed) }
                dt { "Memory" } dd { (bytes(capability.memory_bytes)) }
                dt { "Runtimes" } dd { (capability.runtimes.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")) }
                dt { "Wasm engine" } dd {
                    @if capability.wasm.compiles { "compiles modules" } @else { "runs precompiled modules only" }
                    @if !capability.wasm.engine.is_empty() { " (" (capability.wasm.engine.as_str()) " " (capability.wasm.target.as_str()) ")" }
                }
                dt { "Power control" } dd { (format!("{:?}", capability.power_control).to_lowercase()) }
                dt { "Labels" } dd { (capability.labels.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")) }
            }
            h2 { "Compute devices (OpenCL)" }
            @if capability.gpus.is_empty() {
                p.muted { "None reported." }
            } @else {
                table {
                    thead { tr { th { "Device" } th { "Kind" } th { "Platform" } th.num { "Compute units" } th.num { "Memory" } th.num { "Max clock" } th { "fp64" } th.num { "Calibrated GFLOP/s" } } }
                    tbody {
                        @for gpu in &capability.gpus {
                            tr {
                                td { (gpu.vendor.as_str()) " " (gpu.name.as_str()) }
                                td { (format!("{:?}", gpu.kind).to_lowercase()) }
                                td { (gpu.platform.as_str()) }
                                td.num { (gpu.compute_units) }
                                td.num { (bytes(gpu.memory_bytes)) }
                                td.num { (gpu.max_clock_mhz) " MHz" }
                                td { @if gpu.fp64 { "yes" } @else { "no" } }
                                td.num { (gpu.gflops.map_or("not calibrated".to_owned(), |g| format!("{g:.1}"))) }
                            }
                        }
                    }
                }
            }
            h2 { "Storage (I/O)" }
            @if capability.disks.is_empty() {
                p.muted { "None reported." }
            } @else {
                table {
                    thead { tr { th { "Disk" } th { "Mount" } th.num { "Size" } th.num { "Free" } th.num { "Read MB/s" } th.num { "Write MB/s" } th { "Rates" } } }
                    tbody {
                        @for disk in &capability.disks {
                            tr {
                                td { (disk.name.as_str()) } td { (disk.mount.as_str()) }
                                td.num { (bytes(disk.total_bytes)) } td.num { (bytes(disk.available_bytes)) }
                                td.num { (format!("{:.0}", disk.read_mbps)) } td.num { (format!("{:.0}", disk.write_mbps)) }
                                td { (format!("{:?}", disk.rate_source).to_lowercase()) }
                            }
                        }
                    }
                }
            }
            h2 { "Network" }
            dl.facts {
                dt { "Link" } dd {
                    @match link {
                        Some(link) => {
                            "round trip " (link.rtt_ms.map_or("–".to_owned(), |v| format!("{v:.1} ms")))
                            ", bandwidth " (link.bandwidth_mbps.map_or("–".to_owned(), |v| format!("{v:.0} Mbit/s")))
                            ", loss " (link.loss.map_or("–".to_owned(), percent))
                        }
                        None => span.muted { "no telemetry yet" },
                    }
                }
                @for interface in &capability.interfaces {
                    dt { (interface.name.as_str()) }
                    dd { (interface.speed_mbps.map_or("speed unknown".to_owned(), |s| format!("{s} Mbit/s")))
                        @if let Some(mac) = &interface.mac { span.muted { " " (mac.as_str()) } } }
                }
            }
            h2 { "Power levels" }
            table {
                thead { tr { th.num { "Level" } th { "Name" } th.num { "Speed" } th.num { "Idle W" } th.num { "Active W" } th { "Watts from" } } }
                tbody {
                    @for level in &capability.power_levels {
                        tr { td.num { (level.level) } td { (level.name.as_str()) } td.num { (format!("{:.2}×", level.speed_factor)) }
                            td.num { (format!("{:.1}", level.idle_watts)) } td.num { (format!("{:.1}", level.active_watts)) }
                            td { (level.source.as_str()) } }
                    }
                }
            }
        }
    }
}

/// `GET /nodes/{id}`.
pub(crate) async fn node(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ConsoleError> {
    let now_ms = unix_now_ms();
    let (view, entry) = node_view(&shared, &id).ok_or_else(|| unknown(&id))?;
    let credentials = shared.access().credentials_of(&id).await?;
    let tasks = recent_tasks(&shared, |task| task.node_id.as_deref() == Some(id.as_str()))
        .await?
        .into_iter()
        .take(RECENT_TASKS)
        .collect::<Vec<_>>();
    let stream = format!("/console/events?view=node&id={}", segment(&id));
    let body = html! {
        h1 { "Node " (view.id) " " (state_badge(view.state)) }
        div sse-connect=(stream) {
            section #node-live sse-swap="node-live" hx-swap="innerHTML" {
                (live_section(&view, now_ms))
            }
        }
        section {
            h2 { "Credentials" }
            @match &credentials {
                Some(row) => dl.facts {
                    dt { "Enrolled" } dd { (utc(row.created_ms)) " (" (ago(now_ms, row.created_ms)) ")" }
                    dt { "Report key" } dd.mono { (row.report_key.as_deref().unwrap_or("none (enrolled before reports were signed)")) }
                    dt { "Revoked" } dd {
                        @match row.revoked_ms {
                            Some(at) => span.badge.revoked { "revoked " (utc(at)) },
                            None => "no",
                        }
                    }
                },
                None => p.muted { "No credentials: this node reports without enrollment (anonymous broker)." },
            }
            @if caller.may(Role::Operator) && view.state != NodeState::Revoked && credentials.is_some() {
                form method="post" action={ "/nodes/" (segment(&id)) "/revoke" } {
                    (caller.csrf_field())
                    button.danger #revoke type="submit" { "Revoke this node" }
                    span.muted { " It loses its MQTT credentials at once; its tasks are placed again." }
                }
            }
        }
        section {
            h2 { "Recent tasks" }
            @if tasks.is_empty() {
                p.muted { "No recent task ran here." }
            } @else {
                table {
                    thead { tr { th { "Task" } th { "State" } th { "Artifact" } th { "Node" } th.num { "Attempt" } th.num { "Priority" } th { "Created" } th { "Updated" } th { "Reason" } } }
                    tbody { @for task in &tasks { (task_row(task, now_ms)) } }
                }
            }
        }
        (estimates(&entry))
        (capability(&entry))
    };
    Ok(respond(
        StatusCode::OK,
        super::super::layout::page(&format!("Node {id}"), &caller, Section::Fleet, body),
    ))
}

/// `POST /nodes/{id}/revoke` (operator).
pub(crate) async fn revoke(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Response, ConsoleError> {
    revoke_one(&shared, &id).await?;
    Ok(Redirect::to(&format!("/nodes/{}", segment(&id))).into_response())
}
